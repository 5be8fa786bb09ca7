#include "shoal/train/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "shoal/core/hash.h"
#include "shoal/core/logging.h"
#include "shoal/core/stop.h"
#include "shoal/core/version.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"
#include "shoal/tensor/safetensors.h"
#include "shoal/train/checkpoint.h"
#include "shoal/train/data.h"
#include "shoal/train/model.h"
#include "shoal/train/sources.h"
#include "shoal/train/text.h"
#include "shoal/train/weights.h"
#include "train/trainer_impl.h"

namespace shoal::train {
namespace fs = std::filesystem;
using graph::Builder;
using graph::Graph;
using graph::Value;

OptimizerOptions optimizer_options(const TrainOptions& o) {
  OptimizerOptions oo;
  oo.name = o.optimizer;
  oo.momentum = o.momentum;
  oo.weight_decay = o.weight_decay;
  oo.trust = o.trust;
  return oo;
}

Status validate(const TrainOptions& o) {
  if (!is_model_name(o.model))
    return invalid_argument("--model '{}' is not one of {}, nor a .onnx file", o.model,
                            fmt::join(model_names(), ", "));
  if (o.model == "gpt") SHOAL_RETURN_IF_ERROR(validate(o.gpt));
  if (o.epochs < 1) return invalid_argument("--epochs {} must be >= 1", o.epochs);
  if (o.batch < 1) return invalid_argument("--batch {} must be >= 1", o.batch);
  if (o.micro_batches < 1 || o.batch % o.micro_batches != 0)
    return invalid_argument("--micro-batches {} must divide --batch {}", o.micro_batches, o.batch);
  if (o.threads < 0) return invalid_argument("--threads {} must be >= 0", o.threads);
  // More threads than the host has CPUs only take turns on them (at
  // --threads 10000 the load average reached ~1000; at 100000 GOMP crashed).
  if (const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN); cpus > 0 && o.threads > cpus)
    return invalid_argument(
        "--threads {} is more than the {} CPUs of this host: one thread per CPU is the most "
        "that helps (--threads 0 picks for you)",
        o.threads, cpus);
  if (o.eval_batch < 1) return invalid_argument("--eval-batch {} must be >= 1", o.eval_batch);
  if (o.precision != "f32" && o.precision != "bf16")
    return invalid_argument("--precision '{}' is not f32 or bf16", o.precision);
  if (o.recompute != "none" && o.recompute != "selective" && o.recompute != "full")
    return invalid_argument("--recompute '{}' is not none, selective or full", o.recompute);
  if (o.precision == "bf16")
    SHOAL_RETURN_IF_ERROR(runtime::bf16_support().with_context("--precision bf16"));
  if (o.keep_checkpoints < 1)
    return invalid_argument("--keep-checkpoints {} must be >= 1", o.keep_checkpoints);
  if (o.checkpoint_every < 0 || o.max_steps < 0 || o.limit_train < 0 || o.limit_test < 0)
    return invalid_argument("--checkpoint-every, --max-steps and --limit-* must be >= 0");
  if (o.warmup_epochs < 0)
    return invalid_argument("--warmup-epochs {} must be >= 0", o.warmup_epochs);
  if (o.step_epochs <= 0) return invalid_argument("--step-epochs {} must be > 0", o.step_epochs);
  if (o.rank < 0 || o.world < 1 || o.rank >= o.world)
    return invalid_argument("rank {} / world {} out of range", o.rank, o.world);
  SHOAL_RETURN_IF_ERROR(validate(optimizer_options(o)).with_context("--optimizer"));
  LrSchedule s;
  s.kind = o.schedule;
  s.base = o.lr;
  s.gamma = o.gamma;
  return validate(s);
}

Trainer::~Trainer() = default;

std::int64_t Trainer::steps_per_epoch() const { return impl_->loader->batches_per_epoch(); }

std::int64_t TrainOptions::share_offset(int s) const {
  const std::int64_t g = global(), w = data_shards();
  return s * (g / w) + std::min<std::int64_t>(s, g % w);
}

std::int64_t TrainOptions::share_size(int s) const {
  const std::int64_t g = global(), w = data_shards();
  return g / w + (s < g % w ? 1 : 0);
}

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& o) {
  TrainOptions mine = o;
  if (o.global_batch > 0) {  // --global-batch: this rank's share is its batch
    if (o.global_batch < o.data_shards())
      return invalid_argument("--global-batch {} is fewer samples than the {} data-parallel ranks",
                              o.global_batch, o.data_shards());
    mine.batch = o.share_size(o.data_shard());
    const bool uneven = o.global_batch % o.data_shards() != 0;
    if (uneven && (o.step_pass || o.micro_batches > 1))
      return invalid_argument(
          "--global-batch {} does not split evenly over {} data-parallel ranks: uneven shares "
          "with --micro-batches or --pp are not built (give a multiple of {})",
          o.global_batch, o.data_shards(), o.data_shards() * o.micro_batches);
    if (uneven && o.peers && !o.peers->collective())
      return invalid_argument(
          "--global-batch {} does not split evenly over {} workers: a parameter-server job "
          "needs even shares",
          o.global_batch, o.data_shards());
  }
  SHOAL_RETURN_IF_ERROR(validate(mine));
  std::unique_ptr<Trainer> t(new Trainer());
  SHOAL_RETURN_IF_ERROR(t->init(mine));
  return t;
}

Status Trainer::init(const TrainOptions& o) {
  o_ = o;
  impl_ = std::make_unique<Impl>();
  Impl& m = *impl_;
  m.progress = Progress(o.quiet || o.rank != 0);
  runtime::set_num_threads(o.threads);
  if (o.out.empty()) {
    if (o.resume) return invalid_argument("--resume needs --out DIR (the run to continue)");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    dir_ = fmt::format("runs/{}-{}", o.model, stamp);
  } else {
    dir_ = o.out;
  }
  if (!o.resume && !o.resume_state && o.checkpoints && o.rank == 0 &&
      !checkpoint_dir().list().empty())
    return already_exists(
        "{} holds checkpoints of an earlier run; pass --resume to continue it or choose "
        "another --out",
        dir_);

  // Weights another run or tool wrote (read by every rank, like --data).
  std::optional<WeightsFile> init_w;
  if (!o.init_from.empty()) {
    auto w = read_weights(o.init_from);
    if (!w.ok()) return w.status().with_context("reading the initial weights");
    init_w = std::move(w).value();
  }

  SHOAL_RETURN_IF_ERROR(load_splits(init_w));
  SHOAL_ASSIGN_OR_RETURN(m.model, make_model(o.model, m.train.num_classes, o.gpt, o.onnx_tied));

  // The step graph: forward, loss, autodiff, [grad pass], update.
  StepBuild sb;
  SHOAL_RETURN_IF_ERROR(build_forward(sb));
  SHOAL_RETURN_IF_ERROR(agree_with_peers(sb.g));
  SHOAL_RETURN_IF_ERROR(differentiate(sb));
  SHOAL_RETURN_IF_ERROR(init_state(sb, init_w));
  SHOAL_RETURN_IF_ERROR(compile_step(sb));

  const std::int64_t spe = m.loader->batches_per_epoch();
  double base = o.lr * (o.linear_scaling ? static_cast<double>(o.global()) / 256.0 : 1.0);
  m.sched.kind = o.schedule;
  m.sched.base = base;
  m.sched.warmup =
      static_cast<std::int64_t>(std::llround(o.warmup_epochs * static_cast<double>(spe)));
  m.sched.total = spe * o.epochs;
  m.sched.step_size =
      std::max<std::int64_t>(1, std::llround(o.step_epochs * static_cast<double>(spe)));
  m.sched.gamma = o.gamma;
  SHOAL_RETURN_IF_ERROR(validate(m.sched));
  SHOAL_RETURN_IF_ERROR(count_reporters());
  if (o.resume_state)  // an elastic job's next generation: no file is read
    SHOAL_RETURN_IF_ERROR(
        restore(fmt::format("the state rank {} kept in memory", o.rank), *o.resume_state));
  else if (o.resume && o.rank == 0)
    SHOAL_RETURN_IF_ERROR(resume_latest());
  if (o.peers) SHOAL_RETURN_IF_ERROR(sync_from_lead().with_context("start-up broadcast"));
  if (o.on_start) SHOAL_RETURN_IF_ERROR(o.on_start(params_));
  if (o.resume && o.on_resume) SHOAL_RETURN_IF_ERROR(o.on_resume(checkpoint_dir().dir(), step_));
  return ok_status();
}

// Every rank continues from rank 0's state: its step (after a resume) and
// its params, buffers and optimizer state (so ranks start identical even if
// their initialization differed).
Status Trainer::sync_from_lead() {
  Impl& m = *impl_;
  Tensor pos = Tensor::empty({2}, DType::kI64);
  pos.data<std::int64_t>()[0] = step_;
  pos.data<std::int64_t>()[1] = static_cast<std::int64_t>(m.exe->steps());
  SHOAL_RETURN_IF_ERROR(o_.peers->broadcast(pos));
  SHOAL_RETURN_IF_ERROR(sync_slices(pos.data<std::int64_t>()[0] > 0));
  for (auto& [name, t] : params_)
    if (!sliced(name)) SHOAL_RETURN_IF_ERROR(o_.peers->broadcast(t));
  for (auto& [name, t] : buffers_) SHOAL_RETURN_IF_ERROR(o_.peers->broadcast(t));
  if (!m.layout) {
    for (auto& [name, t] : state_)
      if (!sliced(state_param(name))) SHOAL_RETURN_IF_ERROR(o_.peers->broadcast(t));
  } else if (pos.data<std::int64_t>()[0] > 0) {
    // Resumed: rank 0 read the logical state; every rank takes its shard
    // (of its own slice, cut by sync_slices, where the parameter is sliced).
    for (const auto& [name, shape] : m.layout->logical) {
      if (sliced(state_param(name))) continue;
      Tensor& t = m.resumed_state[name];
      if (!t.defined()) t = Tensor::zeros(shape, DType::kF32);
      SHOAL_RETURN_IF_ERROR(o_.peers->broadcast(t));
    }
    SHOAL_RETURN_IF_ERROR(m.layout->scatter(m.resumed_state, state_));
    m.resumed_state.clear();
  }
  if (o_.rank != 0 && pos.data<std::int64_t>()[0] != step_) {
    step_ = pos.data<std::int64_t>()[0];
    const std::int64_t spe = steps_per_epoch();
    m.loader->seek(step_ / spe, step_ % spe);
    m.exe->set_step(static_cast<std::uint64_t>(pos.data<std::int64_t>()[1]));
  }
  return ok_status();
}

// Batch-norm running statistics differ per rank (each sees its own
// shard); evaluation and checkpoints use their mean over ranks.
Status Trainer::sync_buffers() {
  if (!o_.peers || buffers_synced_at_ == step_) return ok_status();
  for (auto& [name, t] : buffers_) SHOAL_RETURN_IF_ERROR(o_.peers->average(t));
  buffers_synced_at_ = step_;
  return ok_status();
}

Status Trainer::train_step(double* loss, std::int64_t* correct) {
  Impl& m = *impl_;
  const Batch& b = m.loader->next();
  SHOAL_RETURN_IF_ERROR(bind_batch(*m.exe, b, true));
  m.lr.data<float>()[0] = static_cast<float>(m.sched.at(step_));
  if (m.opt_step.defined()) m.opt_step.data<float>()[0] = static_cast<float>(step_ + 1);
  const double t0 = m.tracing ? runtime::trace_clock_us() : 0;
  m.in_step = true;
  SHOAL_RETURN_IF_ERROR(m.exe->run().with_context(fmt::format("training step {}", step_)));
  if (m.tracing) {
    // A "step" span around the step's events; the last kTraceSteps are kept.
    auto& ev = m.trace_steps.emplace_back();
    ev.push_back(runtime::TraceEvent{"train_step", -1, 0, t0, runtime::trace_clock_us() - t0});
    ev.insert(ev.end(), m.exe->trace().begin(), m.exe->trace().end());
    if (m.trace_steps.size() > kTraceSteps) m.trace_steps.pop_front();
  }
  for (auto& [idx, dst] : m.writeback) copy_into(*dst, m.exe->output(idx));
  m.in_step = false;
  *loss = m.exe->output(m.loss_out).data<float>()[0];
  *correct = 0;
  ++step_;
  if (m.correct_out >= 0) {  // counted in the graph (a vocabulary-parallel loss)
    *correct = static_cast<std::int64_t>(m.exe->output(m.correct_out).data<float>()[0]);
    return ok_status();
  }
  if (m.logits_out < 0) return ok_status();  // an earlier pipeline stage
  const Tensor& lg = m.exe->output(m.logits_out);
  std::int64_t n = lg.shape()[0], c = lg.shape()[1], ok = 0;
  for (std::int64_t i = 0; i < n; ++i)
    ok += argmax_row(lg.data<float>() + i * c, c) == b.labels.data<std::int32_t>()[i];
  *correct = ok;
  return ok_status();
}

Result<runtime::Executable*> Trainer::eval_exe(const Shape& images) {
  Impl& m = *impl_;
  auto& exe = m.eval_exes[images[0]];
  if (exe) return exe.get();
  Graph g;
  Builder bl(g);
  Value x = bl.input("x", DType::kF32, images);
  ModelContext mc(bl, false);
  Value logits = m.model.forward(mc, x);
  if (!bl.ok()) return bl.status().with_context("building the eval graph");
  g.mark_output(logits);
  if (o_.forward_pass) SHOAL_RETURN_IF_ERROR(o_.forward_pass(g).status());
  // Evaluated as trained: under --precision bf16 the same pass puts the
  // forward's products in bf16 (as torch.autocast does at inference).
  if (o_.precision == "bf16") {
    SHOAL_ASSIGN_OR_RETURN(graph::PrecisionReport pr, graph::autocast_bf16(g));
    if (o_.rank == 0 && m.eval_exes.size() == 1)
      SHOAL_LOG_INFO("evaluation in bf16: {} matmuls read bf16, {} convolutions",
                     pr.products, pr.convolutions);
  }
  SHOAL_ASSIGN_OR_RETURN(auto backend, runtime::make_backend("cpu"));
  SHOAL_ASSIGN_OR_RETURN(exe, backend->compile(std::move(g), {}));
  for (auto& [name, t] : params_)
    if (has_input(*exe, "param/" + name)) SHOAL_RETURN_IF_ERROR(exe->bind("param/" + name, t));
  for (auto& [name, t] : buffers_) SHOAL_RETURN_IF_ERROR(exe->bind("buf/" + name, t));
  return exe.get();
}

Result<EvalResult> Trainer::evaluate() {
  Impl& m = *impl_;
  SHOAL_RETURN_IF_ERROR(sync_buffers());
  LoaderOptions lo;
  lo.batch = o_.eval_batch;
  lo.shuffle = false;
  lo.drop_last = false;
  lo.prefetch = 1;
  lo.mean = m.mean;
  lo.stddev = m.stddev;
  Loader ld(m.test, lo);
  // Each rank scores its share of the test set (summed over ranks below).
  const bool shared = o_.peers && o_.peers->collective();
  const std::int64_t shards = shared ? o_.data_shards() : 1, mine = shared ? o_.data_shard() : 0;
  const bool lockstep = m.slices && m.slices->eval_in_lockstep;
  const std::int64_t batches = ld.batches_per_epoch();
  EvalResult r;
  double loss_sum = 0;
  std::int64_t ok = 0;
  for (std::int64_t bi = 0; bi < batches; ++bi) {
    const Batch& b = ld.next();
    const bool scored = bi % shards == mine;
    // The last round holds no batch for this rank: run the last one again.
    const bool filler = lockstep && !scored && bi == batches - 1 && bi % shards < mine;
    if (!scored && !filler) continue;
    SHOAL_ASSIGN_OR_RETURN(runtime::Executable * exe, eval_exe(b.images.shape()));
    SHOAL_RETURN_IF_ERROR(bind_batch(*exe, b, false));
    SHOAL_RETURN_IF_ERROR(exe->run().with_context("evaluating"));
    if (filler || (m.slices && !m.slices->reports)) continue;  // unscored; an earlier stage
    const Tensor& lg = exe->output(0);
    const std::int64_t rows = lg.shape()[0], c = lg.shape()[1];  // rows: n, or n*T tokens
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* row = lg.data<float>() + i * c;
      int label = b.labels.data<std::int32_t>()[i];
      ok += argmax_row(row, c) == label;
      double mx = row[argmax_row(row, c)], se = 0;
      for (std::int64_t j = 0; j < c; ++j) se += std::exp(static_cast<double>(row[j]) - mx);
      loss_sum += mx + std::log(se) - row[label];
    }
    r.samples += rows;
  }
  if (o_.peers) {
    std::vector<double> v = {loss_sum, static_cast<double>(ok), static_cast<double>(r.samples)};
    SHOAL_RETURN_IF_ERROR(o_.peers->sum(v).with_context("summing evaluation over ranks"));
    loss_sum = v[0] / m.report_copies;  // the ranks that score each batch
    ok = static_cast<std::int64_t>(v[1] / m.report_copies);
    r.samples = static_cast<std::int64_t>(v[2] / m.report_copies);
  }
  r.accuracy = r.samples ? static_cast<double>(ok) / static_cast<double>(r.samples) : 0;
  r.loss = r.samples ? loss_sum / static_cast<double>(r.samples) : 0;
  return r;
}

// One small sum a step where ranks step together: the loss of the global
// batch for the log (not rank 0's own), and whether any rank was asked to
// stop, so that all stop after the same step. The signal, or 0.
Result<int> Trainer::step_vote(double* loss, bool* regroup, bool* commit) {
  int stop = stop_signal();
  // An elastic job's lead asks whether ranks wait to join (a store read).
  *regroup = o_.regroup && o_.rank == 0 && o_.regroup();
  if (!o_.peers || !o_.peers->collective() || o_.world == 1) return stop;
  std::vector<double> v = {*loss, static_cast<double>(stop), *regroup ? 1.0 : 0.0,
                           *commit ? 1.0 : 0.0};
  SHOAL_RETURN_IF_ERROR(o_.peers->sum(v).with_context("the step's loss and stop vote"));
  *loss = v[0] / o_.world;                    // a mean of per-rank mean losses, as the epoch's
  if (stop == 0 && v[1] > 0) stop = SIGTERM;  // another rank was asked
  *regroup = v[2] > 0;
  *commit = v[3] > 0;  // a copy on every rank when one's measure says it is due
  return stop;
}

// Asked to stop by `sig`: a checkpoint of this step (every rank takes
// part), a line that says so, and the run ends without error.
Status Trainer::stop_now(int sig) {
  stopped_by_ = sig;
  const bool saves = o_.checkpoints && (!o_.peers || o_.peers->collective());
  if (saves) SHOAL_RETURN_IF_ERROR(checkpoint().with_context("checkpoint on stop"));
  if (o_.rank == 0)
    fmt::print(
        stderr, "shoal train: stopped by SIG{} after step {}; {}\n", sigabbrev_np(sig), step_,
        saves             ? fmt::format("checkpoint written in {}/checkpoints: continue with "
                                                    "`shoal train --out {} --resume`",
                                        dir_, dir_)
        : !o_.checkpoints ? std::string("no checkpoint written (--no-checkpoints)")
                          : std::string("the parameter servers hold the weights (their snapshots "
                                        "resume the job)"));
  return ok_status();
}

// Resumed where the run had already ended: nothing to train, which is
// said, and its weights evaluated so the run still ends with its result
// (before: exit 0 and not a word).
Status Trainer::report_finished(std::int64_t limit) {
  const std::int64_t spe = steps_per_epoch();
  if (o_.rank == 0)
    fmt::print(stderr,
               "shoal train: {} has already finished: step {} of {} (--epochs {}{}), nothing to "
               "train; its weights are evaluated below. Give a larger --epochs or --max-steps "
               "to train on.\n",
               dir_, step_, limit, o_.epochs,
               o_.max_steps > 0 ? fmt::format(", --max-steps {}", o_.max_steps) : "");
  EpochMetrics em;
  em.epoch = static_cast<int>((step_ + spe - 1) / spe);
  em.step = step_;
  em.partial = step_ % spe != 0;
  SHOAL_ASSIGN_OR_RETURN(EvalResult ev, evaluate());
  em.test_loss = ev.loss;
  em.test_acc = ev.accuracy;
  history_.push_back(em);
  return ok_status();
}

Status Trainer::run() {
  Impl& m = *impl_;
  const std::int64_t spe = steps_per_epoch();
  const bool lead = o_.rank == 0;
  if (lead) SHOAL_RETURN_IF_ERROR(open_run_dir());
  const std::int64_t limit =
      o_.max_steps > 0 ? std::min(o_.max_steps, spe * o_.epochs) : spe * o_.epochs;
  if (step_ >= limit && step_ > 0) return report_finished(limit);
  m.live_from = true;
  if (o_.commit && !m.live) SHOAL_RETURN_IF_ERROR(commit_step());  // the state before step one
  auto wall0 = Clock::now();
  double window_sum = 0;  // the losses since the last train record
  std::int64_t window_steps = 0;
  while (step_ < limit) {
    const int epoch = static_cast<int>(step_ / spe);
    double loss_sum = 0, train_s = 0;
    std::int64_t correct = 0, seen = 0, steps = 0;
    auto e0 = Clock::now();
    Clock::time_point last_start{};  // within this epoch (evaluation is between epochs)
    while (step_ < limit && step_ / spe == epoch) {
      auto t0 = Clock::now();
      if (last_start != Clock::time_point{}) {
        m.periods.push_back(std::chrono::duration<double>(t0 - last_start).count());
        if (m.periods.size() > kTraceSteps) m.periods.pop_front();
      }
      last_start = t0;
      double loss = 0;
      std::int64_t ok = 0;
      SHOAL_RETURN_IF_ERROR(train_step(&loss, &ok));
      train_s += std::chrono::duration<double>(Clock::now() - t0).count();
      if (!std::isfinite(loss))
        return aborted("training diverged: loss is {} at step {} (epoch {}); lower --lr", loss,
                       step_ - 1, epoch + 1);
      bool regroup = false;
      bool commit = o_.commit && commit_due(train_s / static_cast<double>(steps + 1));
      SHOAL_ASSIGN_OR_RETURN(const int stop, step_vote(&loss, &regroup, &commit));
      // Every rank has finished this step (the vote sums all of them): the
      // state an elastic job's survivors may continue from.
      if (o_.commit && !m.live && (regroup || commit)) SHOAL_RETURN_IF_ERROR(commit_step());
      if (regroup)
        return cancelled("ranks are waiting to join: this generation ends after step {}", step_);
      loss_sum += loss;
      correct += ok;
      seen += o_.batch * m.train.labels_per_sample();
      ++steps;
      // The job's rate where ranks step together; a worker's own where
      // they do not (async parameter server).
      const std::int64_t job_seen = o_.peers && !o_.peers->collective()
                                        ? seen
                                        : steps * o_.global() * m.train.labels_per_sample();
      double ips = static_cast<double>(job_seen) / std::max(train_s, 1e-9);
      std::int64_t in_epoch = (step_ - 1) % spe + 1;
      double eta = static_cast<double>(limit - step_) * train_s / static_cast<double>(steps);
      const double flops = m.step_flops * static_cast<double>(steps) / std::max(train_s, 1e-9);
      m.progress.update(epoch + 1, o_.epochs, in_epoch, spe, loss_sum / static_cast<double>(steps),
                        ips, eta, flops_str(flops, m.peak_flops));
      window_sum += loss;
      ++window_steps;
      if (lead && (in_epoch % std::max<std::int64_t>(spe / 10, 1) == 0)) {
        log_train_record(epoch + 1, window_sum / static_cast<double>(window_steps), window_steps,
                         ips, flops);
        window_sum = 0;
        window_steps = 0;
      }
      if (stop) return stop_now(stop);
      if (o_.checkpoint_every > 0 && step_ % o_.checkpoint_every == 0)
        SHOAL_RETURN_IF_ERROR(checkpoint());
    }
    if (m.tracing) {  // every rank writes its own (the launcher merges them)
      std::vector<runtime::TraceEvent> all;
      for (const auto& st : m.trace_steps) all.insert(all.end(), st.begin(), st.end());
      SHOAL_RETURN_IF_ERROR(runtime::write_chrome_trace(o_.trace, m.exe->graph(), all, o_.rank));
    }
    bool epoch_done = step_ % spe == 0;
    if (o_.checkpoint_every == 0 || step_ == limit) SHOAL_RETURN_IF_ERROR(checkpoint());
    // --max-steps may end the run inside an epoch: it is still evaluated and
    // reported (marked partial), so a short run ends with a result.
    if (o_.peers && o_.peers->collective()) {
      std::vector<double> v = {loss_sum, static_cast<double>(correct), static_cast<double>(seen)};
      SHOAL_RETURN_IF_ERROR(o_.peers->sum(v).with_context("summing epoch metrics over ranks"));
      const double copies = static_cast<double>(o_.world / o_.data_shards());  // ranks per batch
      loss_sum = v[0] / o_.world;  // a mean of per-rank mean losses
      correct = static_cast<std::int64_t>(v[1] / m.report_copies);
      seen = static_cast<std::int64_t>(v[2] / copies);
    }
    EpochMetrics em;
    em.epoch = epoch + 1;
    em.step = step_;
    em.partial = !epoch_done;
    em.train_loss = steps ? loss_sum / static_cast<double>(steps) : 0;
    em.train_acc = seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0;
    em.train_seconds = train_s;
    em.images_per_s = static_cast<double>(seen) / std::max(train_s, 1e-9);
    em.model_flops_per_s = m.step_flops * static_cast<double>(steps) / std::max(train_s, 1e-9);
    em.mfu = m.peak_flops > 0 ? em.model_flops_per_s / m.peak_flops : 0;
    SHOAL_ASSIGN_OR_RETURN(EvalResult ev, evaluate());
    em.test_loss = ev.loss;
    em.test_acc = ev.accuracy;
    em.wall_seconds = std::chrono::duration<double>(Clock::now() - e0).count();
    history_.push_back(em);
    if (lead) log_epoch_record(em, std::chrono::duration<double>(Clock::now() - wall0).count());
  }
  return ok_status();
}

}  // namespace shoal::train
