// dist/plan.h's calibration: the job's ranks, forked on this host, each
// train the model a few steps at every micro-batch size the layouts need
// (all at once, so they share the cores as the job's ranks will), then
// time their groups' collectives (plan_links.cc). Rank 0 reads
// the forward graph's splits and writes the result as JSON for the parent.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "dist/plan_internal.h"
#include "shoal/collective/registry.h"
#include "shoal/comm/communicator.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/dp/data_parallel.h"
#include "shoal/mp/accumulate.h"
#include "shoal/net/store.h"
#include "shoal/runtime/kernel.h"

namespace shoal::dist {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The trainer traces its last 10 steps (train/trainer_impl.h kTraceSteps).
constexpr int kWarmSteps = 2, kTimedSteps = 10;

// This rank trains `rows` per step for a few steps beside the others;
// with `forward`, keeps a copy of the training graph's forward there.
Result<train::StepProfile> profile_rows(train::TrainOptions o, std::int64_t rows,
                                        const std::string& dir, comm::Communicator& c,
                                        std::unique_ptr<graph::Graph>* forward, int micro = 1) {
  const int rank = c.rank();
  // The ranks step together, as a data-parallel job's do (each step's vote
  // is collective), and share the cores as they will; nothing else of the
  // job's communication is in the step.
  o.peers = dp::peers(c);
  o.rank = rank;
  o.world = c.size();
  o.batch = rows * micro;
  o.micro_batches = 1;
  SHOAL_RETURN_IF_ERROR(mp::attach_accumulation(o, micro));
  o.epochs = 1;
  o.max_steps = kWarmSteps + kTimedSteps;
  o.limit_test = rows;
  o.quiet = true;
  o.plot = false;
  o.checkpoints = false;
  o.resume = false;
  o.out = fmt::format("{}/run.{}.{}", dir, rank, rows);
  o.trace = fmt::format("{}/trace.{}.json", dir, rank);
  std::error_code ec;
  fs::create_directories(dir, ec);  // the trace is written there
  if (forward != nullptr) {         // the training graph's forward, before autodiff
    o.forward_pass = [forward](graph::Graph& g) -> Result<train::TrainOptions::ParamSlices> {
      if (!*forward) *forward = std::make_unique<graph::Graph>(g);
      return train::TrainOptions::ParamSlices{};
    };
  }
  SHOAL_ASSIGN_OR_RETURN(auto t, train::Trainer::create(o));
  SHOAL_RETURN_IF_ERROR(t->run());
  train::StepProfile p = t->step_profile(kWarmSteps);
  if (p.steps == 0) return internal_error("no step was traced at --batch {}", rows);
  // A step of the job lasts from one start to the next (the batch, the
  // executor between kernels, waiting for a core while another rank holds
  // it): each part grows in proportion to its kernels' share.
  const double kernels = p.product_s + p.other_s + p.update_s;
  const double whole = std::max({p.period_s, p.step_s, kernels});
  if (kernels > 0) {
    const double k = whole / kernels;
    p.product_s *= k;
    p.other_s *= k;
    p.update_s *= k;
  }
  return p;
}

}  // namespace

double neighbours_period(const std::map<std::int64_t, train::StepProfile>& steps,
                         const std::vector<std::int64_t>& rows, std::size_t i) {
  const std::size_t n = rows.size();
  if (n < 3) return 0;
  const std::size_t a = i == 0 ? 1 : i == n - 1 ? n - 3 : i - 1;
  const std::size_t b = i == 0 ? 2 : i == n - 1 ? n - 2 : i + 1;
  const double xa = static_cast<double>(rows[a]), xb = static_cast<double>(rows[b]);
  const double ya = steps.at(rows[a]).period_s, yb = steps.at(rows[b]).period_s;
  const double line = ya + (yb - ya) * (static_cast<double>(rows[i]) - xa) / (xb - xa);
  // The smallest size keeps the step's fixed costs, which a line through
  // larger ones extrapolates away (4 rows stood 21% above it undisturbed):
  // halfway between that line and the next size's own period.
  return i == 0 ? (line + ya) / 2 : line;
}

namespace {

// A size measured while something else held the cores misprices every
// layout of that micro-batch size (on this VM one 12-step window at 8 rows
// ran 60 ms where 4 and 16 rows ran 20 and 78, and the GPT's pipelines of
// 8-row micro-batches on 4 ranks came out 30-40% faster than predicted).
// A step's period grows about linearly with its rows and this noise only
// adds time: a size more than kAbove over its neighbours' line on any rank
// is measured again on all, twice at most, and each rank keeps its faster.
Status remeasure_disturbed(comm::Communicator& c, const train::TrainOptions& base,
                           const std::vector<std::int64_t>& rows, const std::string& dir,
                           Calibration& cal) {
  constexpr double kAbove = 1.2;
  constexpr int kTries = 2;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (int t = 0; t < kTries; ++t) {
      const double line = neighbours_period(cal.steps, rows, i);
      double over = line > 0 ? cal.steps.at(rows[i]).period_s / line : 0;
      SHOAL_RETURN_IF_ERROR(c.allreduce(&over, &over, 1, DType::kF64, comm::ReduceOp::kMax));
      if (over <= kAbove) break;
      SHOAL_RETURN_IF_ERROR(c.barrier());
      auto p = profile_rows(base, rows[i], dir, c, nullptr);
      if (!p.ok())
        return p.status().with_context(fmt::format("calibrating again at --batch {}", rows[i]));
      train::StepProfile& kept = cal.steps.at(rows[i]);
      if (c.rank() == 0)
        SHOAL_LOG_WARN(
            "plan: the step at {} rows stood {:.0f}% above its neighbours' line on some rank "
            "(the host busy?): measured again, rank 0 {:.1f} -> {:.1f} ms",
            rows[i], (over - 1) * 100, kept.period_s * 1e3, p->period_s * 1e3);
      if (p->period_s < kept.period_s) kept = *p;
    }
  }
  return ok_status();
}

// The model's step at each of `rows`, then a second micro-batch's cost at
// the middle size; keeps the training graph's forward in `forward`.
Status measure_steps(comm::Communicator& c, const train::TrainOptions& base,
                     const std::vector<std::int64_t>& rows, const std::string& dir,
                     Calibration& cal, std::unique_ptr<graph::Graph>& forward) {
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SHOAL_RETURN_IF_ERROR(c.barrier());
    auto p = profile_rows(base, rows[i], dir, c, i == 0 ? &forward : nullptr);
    if (!p.ok()) return p.status().with_context(fmt::format("calibrating at --batch {}", rows[i]));
    cal.steps[rows[i]] = *p;
  }
  if (!forward) return internal_error("the trainer built no forward graph");
  SHOAL_RETURN_IF_ERROR(remeasure_disturbed(c, base, rows, dir, cal));
  // What a second micro-batch adds beyond its rows (the gradients summed,
  // the step built of copies).
  SHOAL_RETURN_IF_ERROR(c.barrier());
  const std::int64_t mid = rows[rows.size() / 2];
  auto two = profile_rows(base, mid, dir, c, nullptr, 2);
  if (!two.ok()) return two.status().with_context("calibrating gradient accumulation");
  cal.accumulate_s = std::max(0.0, two->period_s - 2 * cal.steps.at(mid).period_s);
  return ok_status();
}

// Each other --precision and --recompute asked for, at one size (the rows
// of data parallelism over every rank, the layout recomputation serves). A
// recomputation that saves no memory (nothing in the model to recompute)
// is left out.
Status measure_variants(comm::Communicator& c, const train::TrainOptions& base,
                        const PlanRequest& r, const std::string& dir, Calibration& cal) {
  const auto rows = micro_batch_rows(r);
  const std::int64_t plain = r.global_batch / r.ranks;
  cal.variant_rows =
      std::find(rows.begin(), rows.end(), plain) != rows.end() ? plain : rows[rows.size() / 2];
  const std::vector<std::string> precisions =
      r.precisions.empty() ? std::vector<std::string>{base.precision} : r.precisions;
  const std::vector<std::string> recomputes =
      r.recomputes.empty() ? std::vector<std::string>{"none"} : r.recomputes;
  const train::StepProfile& at = cal.steps.at(cal.variant_rows);
  int n = 0;
  for (const std::string& p : precisions)
    for (const std::string& rc : recomputes) {
      if (p == cal.precision && rc == cal.recompute) continue;
      train::TrainOptions o = base;
      o.precision = p;
      o.recompute = rc;
      SHOAL_RETURN_IF_ERROR(c.barrier());
      auto v = profile_rows(o, cal.variant_rows, fmt::format("{}/v{}", dir, n++), c, nullptr);
      if (!v.ok())
        return v.status().with_context(
            fmt::format("calibrating --precision {} --recompute {}", p, rc));
      const bool saves = rc == "none" || v->arena_bytes < at.arena_bytes;
      if (saves) cal.variants[variant_key(p, rc)] = *v;
    }
  return ok_status();
}

// What the largest rank of layout `l` (ZeRO 0) holds with `batch` samples
// per data-parallel rank, from the step the trainer builds for it on these
// ranks (compiled, memory planned, not run); -1 where the layout is
// refused (alike on every rank: the model does not split so).
Result<double> built_bytes(comm::Communicator& c, train::TrainOptions o, const Layout& l,
                           std::int64_t batch, const std::string& out) {
  o.rank = c.rank();
  o.world = c.size();
  o.batch = batch;
  o.max_steps = 0;
  o.limit_test = batch;
  o.quiet = true;
  o.plot = false;
  o.checkpoints = false;
  o.resume = false;
  o.out = out;
  SHOAL_RETURN_IF_ERROR(c.barrier());
  Status st = attach(o, c, l, dp::DpOptions{});
  std::unique_ptr<train::Trainer> t;
  if (st.ok()) {
    auto made = train::Trainer::create(o);
    st = made.status();
    if (made.ok()) t = std::move(*made);
  }
  double held = st.ok() ? static_cast<double>(t->step_profile(0).bytes()) : -1;
  SHOAL_RETURN_IF_ERROR(c.allreduce(&held, &held, 1, DType::kF64, comm::ReduceOp::kMax));
  if (!st.ok()) SHOAL_LOG_DEBUG("plan: a layout not built for its memory: {}", st.to_string());
  return st.ok() ? held : -1.0;
}

// Whether every rank builds `l` from `forward` (the splits are the same on
// all: a refused one is refused alike, and not built).
bool buildable(const graph::Graph& forward, const Layout& l) {
  if (l.pp > 1 && !pp_shape(forward, l.pp, l.pp_virtual).refused.empty()) return false;
  return l.tp == 1 || tp_plan(forward, l.tp).ok();
}

// The steps the trainer builds where the formula misjudges memory
// (Calibration::built_held): each interleaved pipeline the layouts use (tp
// 1, data parallelism over the other ranks), each tensor-parallel layout
// of micro-batches without a pipeline, and each recomputation with data
// parallelism over every rank (its saving is measured on a step alone).
Status measure_built(comm::Communicator& c, const train::TrainOptions& plain, const PlanRequest& r,
                     const graph::Graph& forward, const std::string& dir, Calibration& cal) {
  std::map<std::string, std::pair<Layout, std::int64_t>> families;  // with its batch
  for (auto [l, zero] : job_layouts(r)) {
    if (l.pp_virtual > 1) {
      l.tp = 1;
      l.sequence_parallel = false;
    } else if (l.tp == 1 || l.pp > 1 || micro_batches(l) == 1) {
      continue;
    }
    const std::int64_t batch = r.global_batch / (r.ranks / (l.tp * l.pp));
    if (batch % micro_batches(l) == 0 && buildable(forward, l))
      families[family_key(l)] = {l, batch};
  }
  int n = 0;
  for (const auto& [key, family] : families) {
    const auto& [l, batch] = family;
    SHOAL_ASSIGN_OR_RETURN(double held, built_bytes(c, plain, l, batch,
                                                    fmt::format("{}/b.{}.{}", dir, c.rank(), n++)));
    if (held > 0) cal.built_held[key] = held;
  }
  for (const auto& [key, profile] : cal.variants) {
    const std::string precision = key.substr(0, key.find('/')), rc = key.substr(key.find('/') + 1);
    if (rc == "none" || precision != cal.precision) continue;
    train::TrainOptions o = plain;
    o.recompute = rc;
    SHOAL_ASSIGN_OR_RETURN(double held, built_bytes(c, o, Layout{}, r.global_batch / r.ranks,
                                                    fmt::format("{}/b.{}.{}", dir, c.rank(), n++)));
    if (held > 0) cal.recompute_held[rc] = held;
  }
  return ok_status();
}

// What each split leaves a rank (rank 0 reads them into `cal`). Tensor
// parallelism's rewrite reads its group from a registered communicator: a
// real one of T ranks, split off collectively and kept in `groups`.
Status read_splits(comm::Communicator& c, const graph::Graph& forward, Calibration& cal,
                   std::vector<std::unique_ptr<comm::Communicator>>& groups) {
  for (int t = 2; t <= c.size(); ++t) {
    if (c.size() % t != 0) continue;
    comm::Communicator* grp = &c;
    if (t < c.size()) {
      SHOAL_ASSIGN_OR_RETURN(auto sub, c.split(c.rank() / t, c.rank()));
      groups.push_back(std::move(sub));
      grp = groups.back().get();
    }
    if (c.rank() != 0) continue;
    const std::int64_t id = collective::register_communicator(grp, false);
    cal.tp[t] = tp_shape(forward, t, id);
    cal.tp_sequence[t] = tp_shape(forward, t, id, true);
    cal.pp[t] = pp_shape(forward, t);
    for (int v : kPpVirtual) cal.pp_interleaved[v][t] = pp_shape(forward, t, v);
  }
  return ok_status();
}

// Whether `r` is a job some layout can split.
Status check_request(const PlanRequest& r) {
  if (r.ranks < 1 || r.global_batch < 1)
    return invalid_argument("plan: {} ranks, {} samples per step", r.ranks, r.global_batch);
  if (micro_batch_rows(r).empty())
    return invalid_argument("plan: no layout of {} ranks splits {} samples per step evenly",
                            r.ranks, r.global_batch);
  return ok_status();
}

// The whole measurement on `c`'s ranks (r.cores: of one host).
Result<Calibration> measure(comm::Communicator& c, const train::TrainOptions& base,
                            const PlanRequest& r, const std::string& dir) {
  // The ranks on a host share its cores unless --threads says otherwise,
  // as dist::Job decides (the job's ranks on this host, or all of them
  // forked here), and prefetch batches as dp::attach decides; recomputation
  // is a variant, measured apart.
  const int local = std::max(1, c.local_size());
  train::TrainOptions plain = base;
  if (plain.threads == 0) plain.threads = std::max(1, r.cores / local);
  plain.prefetch = local * plain.threads < r.cores;
  plain.recompute = "none";
  Calibration cal;
  cal.ranks = c.size();
  cal.threads = plain.threads;
  cal.cores = r.cores;
  // Hosts: every rank counts 1 / the ranks of its host.
  double hosts = 1.0 / std::max(1, c.local_size());
  SHOAL_RETURN_IF_ERROR(c.allreduce(&hosts, &hosts, 1, DType::kF64, comm::ReduceOp::kSum));
  cal.hosts = std::max(1, static_cast<int>(std::lround(hosts)));
  cal.overlap = local * plain.threads < r.cores;
  cal.precision = plain.precision;
  cal.recompute = "none";  // micro-batches and pipelines are measured too
  const auto t0 = Clock::now();
  std::unique_ptr<graph::Graph> forward;
  std::vector<std::unique_ptr<comm::Communicator>> groups;
  SHOAL_RETURN_IF_ERROR(measure_steps(c, plain, micro_batch_rows(r), dir, cal, forward));
  SHOAL_RETURN_IF_ERROR(measure_variants(c, plain, r, dir, cal));
  SHOAL_RETURN_IF_ERROR(read_splits(c, *forward, cal, groups));
  SHOAL_RETURN_IF_ERROR(measure_built(c, plain, r, *forward, dir, cal));
  SHOAL_ASSIGN_OR_RETURN(cal.contention, measure_contention(c, plain.threads));
  if (Status st = measure_links(c, job_groups(r), job_shard_groups(r), cal); !st.ok())
    return st.with_context("timing the groups' collectives");
  cal.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return cal;
}

// One forked rank of `calibrate`: rank 0 writes the result for the parent.
int calibrate_rank(int rank, const train::TrainOptions& base, const PlanRequest& r,
                   const std::string& dir) {
  log::set_identity(rank, r.ranks, "plan");
  log::logger().set_level(spdlog::level::warn);  // the trainers' set-up lines, r.ranks times
  net::FileStore store(dir + "/store");
  auto co = comm::CommOptions::from_env();
  if (!co.ok()) return 2;
  co->timeout_seconds = std::min(co->timeout_seconds, 60.0);  // a stuck rank, named in a minute
  auto c = comm::Communicator::create(rank, r.ranks, store, *co);
  Result<Calibration> cal = c.ok() ? measure(**c, base, r, dir) : Result<Calibration>(c.status());
  if (!cal.ok()) {
    SHOAL_LOG_ERROR("shoal plan: {}", cal.status().to_string());
    return 1;
  }
  if (rank == 0 && !write_file_atomic(dir + "/calibration.json", calibration_json(*cal)).ok())
    return 1;
  c->reset();  // the communicator's threads end before the process does
  return 0;
}

}  // namespace

int group_color(const Group& g, int rank, int world) {
  const int span = g.span > 0 ? g.span : world;
  const int block = rank / span, at = rank % span - g.shift * g.stride;
  const int width = g.size * g.stride;
  if (at < 0 || (at / width + 1) * width + g.shift * g.stride > span) return -1;
  return block * span + (at / width) * g.stride + at % g.stride;
}

Result<Calibration> calibrate(const train::TrainOptions& base, const PlanRequest& r,
                              double deadline_s) {
  SHOAL_RETURN_IF_ERROR(check_request(r));
  PlanRequest req = r;
  req.cores = r.cores > 0 ? r.cores : runtime::num_cores();
  const std::string dir =
      (fs::temp_directory_path() / fmt::format("shoal_plan_{}", ::getpid())).string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < r.ranks; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) break;
    if (pid == 0) ::_exit(calibrate_rank(rank, base, req, dir));
    pids.push_back(pid);
  }
  // Every rank, bounded by the deadline; one that fails stops the others.
  std::string failed;
  const auto until = Clock::now() + std::chrono::duration<double>(deadline_s);
  std::size_t left = pids.size();
  std::vector<bool> done(pids.size(), false);
  while (left > 0) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (done[i] || ::waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      done[i] = true;
      --left;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && failed.empty()) {
        failed =
            fmt::format("calibration rank {} {}", i,
                        WIFEXITED(status) ? fmt::format("exited {}", WEXITSTATUS(status))
                                          : fmt::format("died of signal {}", WTERMSIG(status)));
        for (std::size_t j = 0; j < pids.size(); ++j)
          if (!done[j]) ::kill(pids[j], SIGTERM);
      }
    }
    if (left > 0 && Clock::now() > until) {
      for (std::size_t j = 0; j < pids.size(); ++j)
        if (!done[j]) ::kill(pids[j], SIGKILL);
      if (failed.empty()) failed = fmt::format("calibration took over {:.0f} s", deadline_s);
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (pids.size() < static_cast<std::size_t>(r.ranks) && failed.empty()) failed = "fork failed";
  Result<Calibration> cal = internal_error("plan: {}", failed);
  if (failed.empty()) {
    auto text = read_file(dir + "/calibration.json");
    cal = text.ok() ? parse_calibration(*text) : Result<Calibration>(text.status());
  }
  fs::remove_all(dir, ec);
  return cal;
}

Result<Calibration> calibrate_job(const train::TrainOptions& base, const PlanRequest& r,
                                  comm::Communicator& c) {
  if (r.ranks != c.size())
    return invalid_argument("plan: {} ranks asked, the job has {}", r.ranks, c.size());
  SHOAL_RETURN_IF_ERROR(check_request(r));
  PlanRequest req = r;
  req.cores = r.cores > 0 ? r.cores : runtime::num_cores();
  // The trainers' run directories and traces: this rank's own, on its host.
  const std::string dir =
      (fs::temp_directory_path() / fmt::format("shoal_plan_{}_{}", ::getpid(), c.rank())).string();
  auto& logger = log::logger();
  const auto level = logger.level();
  logger.set_level(spdlog::level::warn);  // the trainers' set-up lines, at every size
  Result<Calibration> cal = measure(c, base, req, dir);
  logger.set_level(level);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return cal;
}

}  // namespace shoal::dist
