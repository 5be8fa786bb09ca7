// Trainer::init's parts: the data and loader, the step graph (forward,
// the ranks' agreement, gradients and update), the initial state, and the
// compiled step. trainer.cc: init itself, steps, evaluation, the loop.
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
#include <set>

#include "shoal/core/file.h"
#include "shoal/core/hash.h"
#include "shoal/core/logging.h"
#include "shoal/core/version.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"
#include "shoal/runtime/peak.h"
#include "shoal/tensor/safetensors.h"
#include "shoal/train/checkpoint.h"
#include "shoal/train/data.h"
#include "shoal/train/model.h"
#include "shoal/train/sources.h"
#include "shoal/train/text.h"
#include "shoal/train/trainer.h"
#include "shoal/train/weights.h"
#include "train/trainer_impl.h"

namespace shoal::train {
using graph::Builder;
using graph::Graph;
using graph::Value;

// --classes N: every label of both splits in [0, N), and N outputs. Left
// to the labels, a stray large label builds a model of that many outputs:
// said when most of them never occur.
namespace {
Status state_classes(DataSplits& s, int classes, const std::string& data, bool say) {
  if (s.train.tokens()) return ok_status();  // a vocabulary, not classes
  if (classes > 0) {
    for (Dataset* d : {&s.train, &s.test}) {
      const std::int32_t* p = d->labels.data<std::int32_t>();
      for (std::int64_t i = 0; i < d->labels.numel(); ++i)
        if (p[i] < 0 || p[i] >= classes)
          return invalid_argument("{}: label {} at index {} is outside --classes {} ([0, {}))",
                                  d->name.empty() ? data : d->name, p[i], i, classes, classes);
      d->num_classes = classes;
    }
    return ok_status();
  }
  const int n = s.train.num_classes;
  if (!say || n <= 16) return ok_status();  // counted only where it can warn
  std::set<std::int32_t> seen;
  for (const Dataset* d : {&s.train, &s.test}) {
    const std::int32_t* p = d->labels.data<std::int32_t>();
    seen.insert(p, p + d->labels.numel());
  }
  if (static_cast<int>(seen.size()) * 2 < n)
    SHOAL_LOG_WARN(
        "{}: the labels go up to {} but only {} distinct values occur: the model gets {} "
        "outputs; pass --classes N to state the number of classes",
        data, n - 1, seen.size(), n);
  return ok_status();
}
}  // namespace

// The data, its statistics and the loader.
Status Trainer::load_splits(const std::optional<WeightsFile>& init_w) {
  const TrainOptions& o = o_;
  Impl& m = *impl_;
  DataSplits splits;
  if (o.dataset) {
    splits = *o.dataset;
  } else {
    SHOAL_ASSIGN_OR_RETURN(splits, load_data(o.data, o.gpt.context));
  }
  SHOAL_RETURN_IF_ERROR(state_classes(splits, o.classes, o.data, o.rank == 0));
  m.train = splits.train.take_first(o.limit_train);
  m.test = splits.test.take_first(o.limit_test);
  if (o.augment && m.train.sample_shape().size() != 3)
    return invalid_argument("--augment crops and flips images [C, H, W]; {} holds samples of {}",
                            o.data, shape_str(m.train.sample_shape()));
  std::tie(m.mean, m.stddev) = pixel_stats(m.train);
  if (m.train.tokens()) m.progress.unit = "tok/s";
  if (m.train.tokens() && o.rank == 0 && !o.quiet)
    fmt::print(
        "{}: {} training and {} validation tokens, vocabulary {}, unigram entropy {:.3f} "
        "bits/char\n",
        o.data, m.train.labels.numel(), m.test.labels.numel(), m.train.vocab.size(),
        unigram_bits(m.train));
  // Weights trained on inputs normalized another way see those inputs.
  if (float mu = 0, sd = 1; init_w && init_w->normalization(&mu, &sd)) {
    if (o.rank == 0 && (mu != m.mean || sd != m.stddev))
      SHOAL_LOG_INFO("inputs normalized as {} was trained: mean {} std {} (this data: {} {})",
                     o.init_from, mu, sd, m.mean, m.stddev);
    m.mean = mu;
    m.stddev = sd;
  }
  LoaderOptions lo;
  lo.batch = o.batch;
  lo.seed = o.seed;
  lo.augment = o.augment;
  lo.rank = o.data_shard();
  lo.world = o.data_shards();
  lo.global = o.global();
  lo.offset = o.share_offset(o.data_shard());
  lo.mean = m.mean;
  lo.stddev = m.stddev;
  if (!o.prefetch) lo.prefetch = 0;
  m.loader = std::make_unique<Loader>(m.train, lo);
  if (m.loader->batches_per_epoch() < 1)
    return invalid_argument("a global batch of {} is larger than the {} training samples",
                            o.global(), m.train.size());

  return ok_status();
}

// The forward of one (micro-)batch and its loss; the parameters.
Status Trainer::build_forward(StepBuild& sb) {
  const TrainOptions& o = o_;
  Impl& m = *impl_;
  // The step graph: forward, loss, autodiff, [grad pass], update. With a
  // step pass, the forward is one micro-batch's and the pass builds the step.
  Graph& g = sb.g;
  Builder b(g);
  const std::int64_t rows = o.batch / o.micro_batches;
  Shape xshape = m.train.sample_shape();
  xshape.insert(xshape.begin(), rows);
  Value x = b.input("x", DType::kF32, xshape);
  Shape yshape = m.train.labels.shape();
  yshape[0] = rows;
  Value y = b.input("labels", DType::kI32, yshape);
  ModelContext mc(b, true);
  mc.seed = o.seed;
  Value logits = m.model.forward(mc, x);
  // A language model scores every position: logits [B*T, V], labels [B, T].
  if (yshape.size() > 1) y = b.reshape(y, {num_elements(yshape)});
  sb.logits = logits;
  sb.loss = b.cross_entropy(logits, y);
  if (!b.ok()) return b.status().with_context(fmt::format("building model '{}'", o.model));
  m.specs = mc.params();
  m.bspecs = mc.buffers();
  for (const auto& s : m.specs) sb.refs.push_back({s.name, mc.param_values().at(s.name), {}});
  sb.buffer_updates = mc.buffer_updates();
  return ok_status();
}

// The same build, graph and math-changing options on every rank.
Status Trainer::agree_with_peers(const Graph& g) {
  const TrainOptions& o = o_;
  if (o.peers) {
    // Same graph (model, batch, loss, autodiff) and same build on every rank,
    // checked before any gradient travels.
    SHOAL_RETURN_IF_ERROR(o.peers->agree("shoal build", fnv1a(build_id())));
    // Everything that changes the math or the number of steps, by name: a
    // rank started with another --lr would train silently otherwise.
    auto v = [](const auto& x) { return fmt::format("{}", x); };
    SHOAL_RETURN_IF_ERROR(o.peers->agree_options({
        {"--model", o.model},
        {"--layers --heads --dim --context", o.model == "gpt" ? o.gpt.str() : "-"},
        {"--onnx-tied", v(o.onnx_tied)},
        {"--data", o.data},
        {"--epochs", v(o.epochs)},
        // Uneven shares (--global-batch) differ by rank by design.
        {"--batch", o.global_batch > 0 ? "-" : v(o.batch)},
        {"--global-batch", v(o.global())},
        {"--optimizer", o.optimizer},
        {"--lr", v(o.lr)},
        {"--momentum", v(o.momentum)},
        {"--weight-decay", v(o.weight_decay)},
        {"--trust", v(o.trust)},
        {"--schedule", o.schedule},
        {"--warmup-epochs", v(o.warmup_epochs)},
        {"--step-epochs", v(o.step_epochs)},
        {"--gamma", v(o.gamma)},
        {"--linear-scaling", v(o.linear_scaling)},
        {"--seed", v(o.seed)},
        {"--augment", v(o.augment)},
        {"--deterministic", v(o.deterministic)},
        {"--precision", o.precision},
        {"--recompute", o.recompute},
        {"--max-steps", v(o.max_steps)},
        {"--limit-train", v(o.limit_train)},
        {"--limit-test", v(o.limit_test)},
        {"--eval-batch", v(o.eval_batch)},
        // Async parameter-server workers keep no state in common (the
        // servers hold the weights): a replacement that takes up the job's
        // checkpoints resumes them alone.
        {"--resume", o.peers->collective() ? v(o.resume) : "-"},
        // A checkpoint averages batch-norm statistics over the ranks: all
        // must checkpoint at the same steps.
        {"--checkpoint-every", v(o.checkpoint_every)},
        {"--no-checkpoints", v(!o.checkpoints)},
    }));
    std::string opts = fmt::format("{} {} {} {} {} {}", o.optimizer, o.momentum, o.weight_decay,
                                   o.trust, o.seed, o.augment);
    // Uneven shares (--global-batch) make graphs of two batch sizes: then
    // the options above, by name, are what the ranks agree on.
    const bool even = o.global() % o.data_shards() == 0;
    SHOAL_RETURN_IF_ERROR(
        o.peers->agree("training graph (model, batch, options)",
                       fnv1a(even ? graph::to_json(g) : fmt::format("{} {}", o.global(), o.model)) ^
                           (fnv1a(opts) * 0x9e3779b97f4a7c15ull)));
  }
  return ok_status();
}

// Uneven shares (--global-batch): each rank's loss is the mean over its
// b samples and the ranks' gradients are averaged, so a share of b of a
// global batch G over W ranks is weighted b W / G: the average is then the
// mean over the G samples, as on one process.
void Trainer::weigh_share(Graph& g, std::vector<ParamRef>& refs) const {
  const TrainOptions& o = o_;
  const std::int64_t w = o.data_shards();
  if (o.global() % w == 0) return;
  const double weight = static_cast<double>(o.batch * w) / static_cast<double>(o.global());
  Builder b(g);
  for (auto& r : refs) r.grad = b.mul(r.grad, b.scalar(weight));
}

// Rewrites, gradients (autodiff, or the step pass), the gradient pass and
// the optimizer's update.
Status Trainer::differentiate(StepBuild& sb) {
  const TrainOptions& o = o_;
  Impl& m = *impl_;
  // Rewrites after the agreement: ranks' rewritten graphs may differ (their
  // slices' shapes).
  Graph& g = sb.g;
  std::vector<ParamRef>& refs = sb.refs;
  if (o.forward_pass && !o.step_pass) {
    SHOAL_ASSIGN_OR_RETURN(m.slices, o.forward_pass(g));
    if (m.slices && m.slices->correct.valid()) {
      sb.correct = m.slices->correct;
      sb.logits = Value{};
    }
  }
  if (o.step_pass) {
    TrainOptions::Step st{sb.loss, sb.logits, refs, sb.buffer_updates};
    SHOAL_ASSIGN_OR_RETURN(m.slices, o.step_pass(g, st));
    sb.loss = st.loss;
    sb.logits = st.logits;
    refs = st.params;
    sb.buffer_updates = st.buffers;
  } else {
    std::vector<Value> wrt;
    for (const auto& r : refs) wrt.push_back(r.param);
    sb.forward_end = g.num_nodes();
    SHOAL_ASSIGN_OR_RETURN(std::vector<Value> grads, graph::autodiff(g, sb.loss, wrt));
    for (std::size_t i = 0; i < refs.size(); ++i) refs[i].grad = grads[i];
    weigh_share(g, refs);
  }
  if (o.step_pass && o.recompute != "none")
    return failed_precondition(
        "--recompute {} with --micro-batches or --pp is not built yet: that step is "
        "differentiated micro-batch by micro-batch by its own pass",
        o.recompute);
  if (o.grad_pass) SHOAL_RETURN_IF_ERROR(o.grad_pass(g, refs));
  Builder b(g);
  const OptimizerOptions oo = optimizer_options(o);
  SHOAL_ASSIGN_OR_RETURN(sb.og,
                         o.update_pass ? o.update_pass(b, refs) : append_optimizer(b, oo, refs));

  return ok_status();
}

// Initial parameters and state, and the step's outputs that write them back.
Status Trainer::init_state(StepBuild& sb, const std::optional<WeightsFile>& init_w) {
  const TrainOptions& o = o_;
  Impl& m = *impl_;
  params_ = init_params(m.specs, o.seed);
  buffers_ = init_buffers(m.bspecs);
  if (init_w) {
    auto n = apply_weights(*init_w, params_, buffers_);
    if (!n.ok()) return n.status().with_context("initial weights");
    if (o.rank == 0)
      SHOAL_LOG_INFO(
          "initialized {} tensors from {}{}", *n, o.init_from,
          init_w->shoal_checkpoint ? " (a Shoal checkpoint; its optimizer state is not used)" : "");
  }
  if (m.slices)  // this rank's slices of the whole initial values
    for (const auto& name : m.slices->names) params_[name] = m.slices->slice(name, params_[name]);
  Graph& g = sb.g;
  const OptimizerGraph& og = sb.og;
  const std::vector<ParamRef>& refs = sb.refs;
  m.loss_out = static_cast<int>(g.outputs().size());
  g.mark_output(sb.loss);
  if (sb.logits.valid()) {
    m.logits_out = static_cast<int>(g.outputs().size());
    g.mark_output(sb.logits);
  }
  if (sb.correct.valid()) {
    m.correct_out = static_cast<int>(g.outputs().size());
    g.mark_output(sb.correct);
  }
  int out = static_cast<int>(g.outputs().size());
  for (std::size_t i = 0; i < refs.size(); ++i) {
    g.mark_output(og.new_params[i]);
    m.update_outputs.push_back(out);
    m.writeback.push_back({out++, &params_[refs[i].name]});
  }
  for (const auto& s : og.state) {
    state_[s.name] = Tensor::zeros(g.type(s.input).shape, DType::kF32);
    g.mark_output(s.output);
  }
  for (const auto& s : og.state) {
    m.update_outputs.push_back(out);
    m.writeback.push_back({out++, &state_[s.name]});
  }
  hold_empty_state(og);
  m.layout = og.layout;
  for (const auto& [name, v] : sb.buffer_updates) {
    g.mark_output(v);
    m.writeback.push_back({out++, &buffers_[name]});
  }

  return ok_status();
}

// Compiles the step and binds the persistent tensors to it.
Status Trainer::compile_step(StepBuild& sb) {
  const TrainOptions& o = o_;
  Impl& m = *impl_;
  // Model FLOPs, as Megatron's MFU counts them: recomputation is not
  // counted (it is the price of the memory saved, not the model's work).
  m.step_flops = graph::graph_flops(sb.g);
  if (o.recompute != "none") {
    // Autodiff leaves gradients nobody reads (of constants): gone first,
    // so a value has only the readers that matter.
    graph::eliminate_dead_code(sb.g);
    const bool full = o.recompute == "full";
    SHOAL_ASSIGN_OR_RETURN(graph::RecomputeReport rr,
                           full ? graph::recompute_full(sb.g, sb.forward_end)
                                : graph::recompute_attention(sb.g, sb.forward_end));
    if (o.rank == 0)
      SHOAL_LOG_INFO("recompute {}: {} {} ({} nodes) computed again in the backward", o.recompute,
                     rr.regions, full ? "values" : "softmax regions", rr.nodes);
  }
  if (o.precision == "bf16") {
    SHOAL_ASSIGN_OR_RETURN(graph::PrecisionReport pr, graph::autocast_bf16(sb.g));
    if (o.rank == 0)
      SHOAL_LOG_INFO(
          "precision bf16: {} matmuls and {} convolution passes read bf16 through {} casts ({} "
          "write bf16 themselves, {} for GELU or softmax to read, {} convolutions for batch "
          "norms){}",
          pr.products, pr.convolutions, pr.casts, pr.narrowed, pr.read_bf16, pr.norms_read_bf16,
          pr.kept ? fmt::format(", {} left in f32", pr.kept) : "");
  }
  auto peak = runtime::host_gemm_peak(o.precision == "bf16" ? DType::kBF16 : DType::kF32);
  if (peak.ok())
    m.peak_flops = *peak;
  else if (o.rank == 0)
    SHOAL_LOG_WARN("no MFU in the reports: {}", peak.status().to_string());
  if (!o.dump_graph.empty()) {
    std::string path = o.dump_graph;
    if (o.world > 1)
      path = (path.ends_with(".json") ? path.substr(0, path.size() - 5) : path) +
             fmt::format(".rank{}.json", o.rank);
    SHOAL_RETURN_IF_ERROR(
        write_file_atomic(path, graph::to_json(sb.g)).with_context("--dump-graph"));
  }
  auto backend = runtime::make_backend("cpu");
  if (!backend.ok()) return backend.status();
  runtime::CompileOptions copts;
  copts.arena_allocator = o_.arena_allocator;
  // Written over the bound old tensors below: no arena bytes for them.
  for (const auto& [idx, dst] : m.writeback) copts.outputs_bound_later.insert(idx);
  SHOAL_ASSIGN_OR_RETURN(m.exe, (*backend)->compile(std::move(sb.g), copts));
  // Parameters (and state) another pipeline stage holds are not inputs here.
  for (auto& [name, t] : params_)
    if (has_input(*m.exe, "param/" + name)) SHOAL_RETURN_IF_ERROR(m.exe->bind("param/" + name, t));
  for (auto& [name, t] : buffers_) SHOAL_RETURN_IF_ERROR(m.exe->bind("buf/" + name, t));
  for (auto& [name, t] : state_)
    if (has_input(*m.exe, name)) SHOAL_RETURN_IF_ERROR(m.exe->bind(name, t));
  m.lr = Tensor::scalar(0.0);
  SHOAL_RETURN_IF_ERROR(m.exe->bind("lr", m.lr));
  if (sb.og.step.valid()) {
    m.opt_step = Tensor::scalar(0.0);
    SHOAL_RETURN_IF_ERROR(m.exe->bind("opt_step", m.opt_step));
  }
  // New parameters, optimizer state and buffers are written straight over
  // the bound old ones where the executable can prove that safe (every
  // other reader runs first; the update kernels work element-wise in place).
  // That saves a copy of every parameter and state tensor per step: 4.3 MB
  // for the MLP with momentum. Anything refused keeps the copy.
  std::vector<std::pair<int, Tensor*>> copies;
  for (auto& [idx, dst] : m.writeback) {
    Status st = m.exe->bind_output(idx, *dst);
    if (!st.ok()) {
      SHOAL_LOG_DEBUG("training step copies output {}: {}", idx, st.message());
      copies.emplace_back(idx, dst);
    }
  }
  m.writeback = std::move(copies);
  hold_updates();
  if (o.rank == 0) {  // measured from the tensors and the planned arena, per rank
    SHOAL_LOG_INFO("memory on rank 0: parameters {} B, optimizer state {} B{}, step arena {} B",
                   total_bytes(params_), total_bytes(state_), m.layout ? " (sharded)" : "",
                   m.exe->arena_bytes());
  }
  m.tracing = !o.trace.empty();
  m.exe->enable_trace(m.tracing);

  return ok_status();
}

}  // namespace shoal::train
