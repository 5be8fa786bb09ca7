#include "shoal/dp/data_parallel.h"

#include <unistd.h>

#include <mutex>
#include <numeric>
#include <string_view>

#include "dp/layout_binding.h"
#include "shoal/core/logging.h"
#include "shoal/dp/sharded.h"
#include "shoal/mp/accumulate.h"
#include "shoal/mp/pipeline.h"
#include "shoal/mp/tensor_parallel.h"
#include "shoal/net/shared_memory.h"
#include "shoal/runtime/kernel.h"

namespace shoal::dp {
namespace {

// Every rank's (option, value) list, gathered whole (a few hundred bytes,
// once at start-up), so that a difference is reported by name and value,
// not as two hashes.
Status agree_named(comm::Communicator& c, const train::Peers::Options& options) {
  std::string mine;
  for (const auto& [k, v] : options) mine += k + '\0' + v + '\0';
  const auto n = static_cast<std::size_t>(c.size());
  std::int64_t len = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lens(n);
  SHOAL_RETURN_IF_ERROR(c.allgather(&len, lens.data(), 1, DType::kI64)
                            .with_context("agreeing on the training options"));
  std::vector<std::size_t> counts(lens.begin(), lens.end());
  std::string all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}), '\0');
  SHOAL_RETURN_IF_ERROR(c.allgatherv(mine.data(), all.data(), counts, DType::kU8)
                            .with_context("agreeing on the training options"));
  auto parse = [](std::string_view s) {
    std::vector<std::string_view> f;
    for (std::size_t p = 0, z; (z = s.find('\0', p)) != std::string_view::npos; p = z + 1)
      f.push_back(s.substr(p, z - p));
    return f;
  };
  const auto first = parse(std::string_view(all).substr(0, counts[0]));
  for (std::size_t r = 1, off = counts[0]; r < n; off += counts[r], ++r) {
    const auto theirs = parse(std::string_view(all).substr(off, counts[r]));
    for (std::size_t i = 0; i + 1 < std::max(first.size(), theirs.size()); i += 2) {
      if (i + 1 >= first.size() || i + 1 >= theirs.size() || first[i] != theirs[i])
        return failed_precondition(
            "the ranks of this job check different options (rank 0: '{}', rank {}: '{}'): do "
            "they run the same shoal build?",
            i < first.size() ? first[i] : "", r, i < theirs.size() ? theirs[i] : "");
      if (first[i + 1] != theirs[i + 1])
        return failed_precondition(
            "the ranks of this job disagree on {}: rank 0 has {}, rank {} has {} (every rank must "
            "be started with the same options: they change the math)",
            first[i], first[i + 1], r, theirs[i + 1]);
    }
  }
  return ok_status();
}

class CommPeers final : public train::Peers {
 public:
  explicit CommPeers(comm::Communicator& c) : c_(c) {}

  Status agree(const std::string& what, std::uint64_t value) override {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(c_.size()));
    SHOAL_RETURN_IF_ERROR(
        c_.allgather(&value, all.data(), 1, DType::kI64).with_context("agreeing on " + what));
    for (int r = 1; r < c_.size(); ++r)
      if (all[static_cast<std::size_t>(r)] != all[0])
        return failed_precondition(
            "the ranks of this job disagree on the {}: rank 0 has {:016x}, rank {} has {:016x} "
            "(every rank must run the same shoal build with the same model and options)",
            what, all[0], r, all[static_cast<std::size_t>(r)]);
    return ok_status();
  }
  Status agree_options(const Options& options) override { return agree_named(c_, options); }
  Status broadcast(Tensor& t) override {
    return c_.broadcast(t.raw_data(), static_cast<std::size_t>(t.numel()), t.dtype(), 0);
  }
  Status sum(std::vector<double>& v) override {
    return c_.allreduce(v.data(), v.data(), v.size(), DType::kF64, comm::ReduceOp::kSum);
  }
  Status average(Tensor& t) override {
    return c_.allreduce(t.raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()), t.dtype(),
                        comm::ReduceOp::kAvg);
  }

 private:
  comm::Communicator& c_;
};

// Sub-communicators live as long as the process (the trainers built over
// them hold their ids).
comm::Communicator* keep(std::unique_ptr<comm::Communicator> c) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<comm::Communicator>> kept;
  std::lock_guard<std::mutex> lk(mu);
  kept.push_back(std::move(c));
  return kept.back().get();
}

// ZeRO-1 and 2 over communicator `id`: the update pass reduce-scatters the
// gradients, updates this rank's shard, all-gathers the parameters.
Status attach_sharded_update(train::TrainOptions& o, std::int64_t id, const DpOptions& d,
                             bool lead) {
  const train::OptimizerOptions oo = train::optimizer_options(o);
  const std::int64_t bucket = d.zero == 2 ? f32_elements(d.zero_bucket_mb) : 0;
  o.update_pass = [id, oo, lead, bucket, stage = d.zero](
                      graph::Builder& b,
                      const std::vector<train::ParamRef>& params) -> Result<train::OptimizerGraph> {
    std::vector<std::int64_t> shards;
    SHOAL_ASSIGN_OR_RETURN(train::OptimizerGraph og,
                           inject_sharded(b, params, oo, id, bucket, &shards));
    if (lead) {
      std::int64_t total = 0, mine = 0;
      for (const auto& p : params) total += num_elements(b.shape(p.param));
      for (std::int64_t n : shards) mine += n;
      SHOAL_LOG_INFO(
          "data parallel, ZeRO-{}: gradients reduce-scattered in {} part(s); rank 0 holds {} "
          "of the {} elements of each optimizer slot",
          stage, shards.size(), mine, total);
    }
    return og;
  };
  return ok_status();
}

Status attach_zero3(train::TrainOptions& o, comm::Communicator& c, std::int64_t id);

// Two forward passes, one after the other: `inner` slices the parameters,
// `outer` splits the slices again (ZeRO-3's row blocks of tensor-parallel
// slices). A rank's piece is outer's of inner's; the whole tensor is
// inner's gather of outer's.
train::TrainOptions::ParamSlices compose(train::TrainOptions::ParamSlices inner,
                                         train::TrainOptions::ParamSlices outer) {
  train::TrainOptions::ParamSlices ps = outer;
  ps.names.insert(inner.names.begin(), inner.names.end());
  ps.reports = inner.reports && outer.reports;
  if (!ps.correct.valid()) ps.correct = inner.correct;  // TP's vocabulary-parallel loss
  ps.slice = [inner, outer](const std::string& p, const Tensor& whole) {
    const Tensor mid = inner.names.count(p) ? inner.slice(p, whole) : whole;
    return outer.names.count(p) ? outer.slice(p, mid) : mid;
  };
  ps.gather = [inner, outer](const std::string& p, const Tensor& mine) -> Result<Tensor> {
    Tensor mid = mine;
    if (outer.names.count(p)) {
      SHOAL_ASSIGN_OR_RETURN(mid, outer.gather(p, mine));
    }
    if (!inner.names.count(p)) return mid;
    return inner.gather(p, mid);
  };
  return ps;
}

// Tensor parallelism over groups of T consecutive ranks; with more ranks
// than T, data parallelism across the groups (each gradient, sliced or
// whole, all-reduced among the ranks holding the same slice).
Status attach_tp(train::TrainOptions& o, comm::Communicator& c, const DpOptions& d) {
  if (d.zero > 0 && c.size() == d.tp)
    return invalid_argument(
        "--zero {} with --tp {} on {} ranks: no data-parallel group to shard over (run D x {} "
        "ranks, D > 1)",
        d.zero, d.tp, c.size(), d.tp);
  o.peers = std::make_shared<CommPeers>(c);
  const bool copied = d.micro_batches > 1;  // per micro-batch by gradient accumulation
  if (c.size() == d.tp)
    return mp::attach_tensor_parallel(o, register_communicator(&c, false), d.sequence_parallel,
                                      copied);
  SHOAL_ASSIGN_OR_RETURN(auto tp, c.split(c.rank() / d.tp, c.rank()));
  SHOAL_ASSIGN_OR_RETURN(auto dp, c.split(c.rank() % d.tp, c.rank()));
  comm::Communicator* tpc = keep(std::move(tp));
  comm::Communicator* dpc = keep(std::move(dp));
  SHOAL_RETURN_IF_ERROR(mp::attach_tensor_parallel(o, register_communicator(tpc, false),
                                                   d.sequence_parallel, copied));
  o.data_rank = dpc->rank();
  o.data_world = dpc->size();
  o.prefetch = false;
  const std::int64_t id = register_communicator(dpc, false);
  DpOptions dd = d;
  dd.overlap = DpOptions::Overlap::kOff;
  const bool lead = c.rank() == 0;
  if (lead) SHOAL_LOG_INFO("{} data-parallel groups x {} tensor-parallel ranks", dpc->size(), d.tp);
  // ZeRO over each slice's data-parallel group: the ranks holding the same
  // slices shard its gradients and state among them (3: the slices too,
  // as row blocks gathered where the step uses them).
  if (d.zero == 3) {
    auto tp_pass = o.forward_pass;
    SHOAL_RETURN_IF_ERROR(attach_zero3(o, *dpc, id));
    auto z3_pass = o.forward_pass;
    o.forward_pass = [tp_pass,
                      z3_pass](graph::Graph& g) -> Result<train::TrainOptions::ParamSlices> {
      SHOAL_ASSIGN_OR_RETURN(auto tp, tp_pass(g));
      SHOAL_ASSIGN_OR_RETURN(auto z3, z3_pass(g));
      return compose(std::move(tp), std::move(z3));
    };
    return ok_status();
  }
  if (d.zero > 0) return attach_sharded_update(o, id, d, lead);
  o.grad_pass = [id, dd, lead](graph::Graph& g, std::vector<train::ParamRef>& params) -> Status {
    SHOAL_ASSIGN_OR_RETURN(BucketPlan plan, inject_allreduce(g, params, id, dd));
    if (lead) SHOAL_LOG_INFO("data parallel: {} gradient buckets", plan.buckets.size());
    return ok_status();
  };
  return ok_status();
}

// Pipeline stages over groups of P consecutive ranks; with more ranks than
// P, data parallelism across the groups (each stage's gradients all-reduced
// among the ranks holding that stage).
Status attach_pp(train::TrainOptions& o, comm::Communicator& c, const DpOptions& d) {
  // ZeRO-3 would gather every parameter before each micro-batch's forward
  // and backward: m times its traffic per step, where a stage holds few
  // parameters anyway. DeepSpeed's pipeline engine refuses ZeRO-2 and 3.
  if (d.zero == 3)
    return invalid_argument(
        "--pp {} with --zero 3: a stage would gather each parameter again for every one of "
        "its --micro-batches {} (forward and backward); shard the optimizer state and "
        "gradients with --zero 1 or 2, or split the layers further with --tp",
        d.pp, d.micro_batches);
  if (d.zero > 0 && c.size() == d.pp * d.tp)
    return invalid_argument(
        "--zero {} with --pp {}{} on {} ranks: no data-parallel group to shard over (run D x {} "
        "ranks, D > 1)",
        d.zero, d.pp, d.tp > 1 ? fmt::format(" --tp {}", d.tp) : "", c.size(), d.pp * d.tp);
  o.peers = std::make_shared<CommPeers>(c);
  mp::PipelineOptions po;
  po.stages = d.pp;
  po.micro_batches = d.micro_batches;
  SHOAL_ASSIGN_OR_RETURN(po.schedule, mp::parse_schedule(d.pp_schedule));
  po.cuts = d.pp_cuts;
  po.chunks = d.pp_virtual;
  // Rank r = (data group g, stage s, tensor rank t): r = g·P·T + s·T + t.
  const int T = d.tp, P = d.pp, r = c.rank();
  const LayoutPlace at = place_in_layout(r, T, P);
  if (T > 1) {  // each stage's T ranks split its layers
    SHOAL_ASSIGN_OR_RETURN(auto tp, c.split(r / T, r));
    SHOAL_RETURN_IF_ERROR(mp::attach_tensor_parallel(
        o, register_communicator(keep(std::move(tp)), false), d.sequence_parallel, true));
  }
  comm::Communicator* ppc = &c;
  if (c.size() != P) {
    SHOAL_ASSIGN_OR_RETURN(auto pp, c.split(at.group * T + at.tensor, r));
    ppc = keep(std::move(pp));
  }
  o.data_rank = 0;
  o.data_world = 1;
  SHOAL_RETURN_IF_ERROR(mp::attach_pipeline(o, *ppc, po));
  if (c.size() == P * T) return ok_status();
  // The ranks holding the same stage and slice all-reduce its gradients.
  SHOAL_ASSIGN_OR_RETURN(auto dp, c.split(r % (P * T), r));
  comm::Communicator* dpc = keep(std::move(dp));
  o.data_rank = dpc->rank();
  o.data_world = dpc->size();
  o.prefetch = false;
  const std::int64_t id = register_communicator(dpc, false);
  DpOptions dd = d;
  dd.overlap = DpOptions::Overlap::kOff;
  if (r == 0)
    SHOAL_LOG_INFO("{} data-parallel groups x {} pipeline stages{}", dpc->size(), P,
                   T > 1 ? fmt::format(" x {} tensor-parallel ranks", T) : "");
  // ZeRO over each stage's (and slice's) data-parallel group.
  if (d.zero > 0) return attach_sharded_update(o, id, d, r == 0);
  o.grad_pass = [id, dd](graph::Graph& gr, std::vector<train::ParamRef>& params) -> Status {
    return inject_allreduce(gr, params, id, dd).status();
  };
  return ok_status();
}

// ZeRO-3: the forward reads every parameter through an all-gather of its
// rows (dp/sharded.h); after autodiff the backward gathers again, and each
// rank's summed row gradients become the global batch's mean.
Status attach_zero3(train::TrainOptions& o, comm::Communicator& c, std::int64_t id) {
  if (o.optimizer == "lars" || o.optimizer == "lamb")
    return invalid_argument(
        "--zero needs an element-wise optimizer (sgd, momentum, nesterov, adam, adamw): {} "
        "scales each layer by norms of the whole layer, which a shard does not hold",
        o.optimizer);
  auto gathers = std::make_shared<std::vector<Zero3Gather>>();
  auto forward_end = std::make_shared<int>(0);
  o.forward_pass = [id, gathers, forward_end](graph::Graph& g) {
    gathers->clear();
    auto ps = shard_parameters(g, id, gathers.get());
    *forward_end = g.num_nodes();
    return ps;
  };
  const double scale = 1.0 / c.size();
  const bool lead = c.rank() == 0;
  o.grad_pass = [id, gathers, forward_end, scale, lead](
                    graph::Graph& g, std::vector<train::ParamRef>& params) -> Status {
    SHOAL_RETURN_IF_ERROR(regather_for_backward(g, *forward_end, *gathers, id));
    graph::Builder b(g);
    for (auto& p : params) p.grad = b.mul(p.grad, b.scalar(scale));
    if (lead)
      SHOAL_LOG_INFO("data parallel, ZeRO-3: {} parameters held as row blocks, gathered where used",
                     gathers->size());
    return b.status();
  };
  return ok_status();
}

}  // namespace

Status check_layout(const DpOptions& d, int ranks) {
  SHOAL_RETURN_IF_ERROR(validate(d));
  // The model's split: "--tp T", "--pp P" or "--tp T x --pp P".
  const std::string split = d.pp == 1   ? fmt::format("--tp {}", d.tp)
                            : d.tp == 1 ? fmt::format("--pp {}", d.pp)
                                        : fmt::format("--tp {} x --pp {}", d.tp, d.pp);
  if (ranks % (d.tp * d.pp) != 0)
    return invalid_argument("{} must divide the job's {} ranks", split, ranks);
  if (d.dp > 0 && d.dp * d.tp * d.pp != ranks)
    return invalid_argument("--dp {} x {} is {} ranks, the job has {}", d.dp, split,
                            d.dp * d.tp * d.pp, ranks);
  return ok_status();
}

Status attach(train::TrainOptions& o, comm::Communicator& c, const DpOptions& d) {
  SHOAL_RETURN_IF_ERROR(check_layout(d, c.size()));
  o.rank = c.rank();
  o.world = c.size();
  // Gradient accumulation wraps what the other passes did to the forward.
  if (d.pp == 1 && d.tp == 1) SHOAL_RETURN_IF_ERROR(mp::attach_accumulation(o, d.micro_batches));
  if (c.size() == 1) return ok_status();  // one process: nothing to synchronize
  // The wire type changes the sums; the bucket sizes, the calls each rank
  // makes (a mismatch would otherwise surface as differing call sequences).
  SHOAL_RETURN_IF_ERROR(
      agree_named(c, {{"--wire", std::string(dtype_name(d.wire))},
                      {"--bucket-mb", fmt::format("{}", d.bucket_mb)},
                      {"--first-bucket-mb", fmt::format("{}", d.first_bucket_mb)},
                      {"--zero", std::to_string(d.zero)},
                      {"--zero-bucket-mb", fmt::format("{}", d.zero_bucket_mb)},
                      {"--tp", std::to_string(d.tp)},
                      {"--sequence-parallel", d.sequence_parallel ? "on" : "off"},
                      {"--pp", std::to_string(d.pp)},
                      {"--micro-batches", std::to_string(d.micro_batches)},
                      {"--pp-schedule", d.pp_schedule},
                      {"--pp-virtual", std::to_string(d.pp_virtual)},
                      {"--pp-cuts", fmt::format("{}", fmt::join(d.pp_cuts, ","))}}));
  SHOAL_RETURN_IF_ERROR(bind_to_layout(c.rank(), c.size(), d.tp, d.pp));
  if (d.pp > 1) return attach_pp(o, c, d);
  if (d.tp > 1) {
    SHOAL_RETURN_IF_ERROR(attach_tp(o, c, d));
    return mp::attach_accumulation(o, d.micro_batches);
  }
  const bool lead = c.rank() == 0;
  DpOptions dd = d;
  // Is a core free on every rank's host? With every core computing, a
  // helper thread (the progress thread of an overlapped all-reduce, the
  // loader's prefetch worker) gets a core only by preempting a rank's
  // compute, and in lock-step that delay idles the other ranks too.
  // Measured, 2 ranks x 1 thread on 2 cores: the MLP 19% faster with the
  // all-reduce on the compute thread, 10.7% more without prefetch
  // (docs/data-parallel.md). All ranks decide alike: the bucket layout
  // follows the choice and is part of the graph.
  const int cores = runtime::num_cores();
  const int threads = o.threads > 0 ? o.threads : cores;
  std::int32_t free_core = c.local_size() * threads < cores ? 1 : 0, all = 0;
  SHOAL_RETURN_IF_ERROR(c.allreduce(&free_core, &all, 1, DType::kI32, comm::ReduceOp::kMin)
                            .with_context("asking the ranks whether a core is free"));
  const bool spare = all == 1;
  const bool overlap =
      d.overlap == DpOptions::Overlap::kAuto ? spare : d.overlap == DpOptions::Overlap::kOn;
  o.prefetch = spare;
  // Under a launcher that binds (mpirun's default), the cores are those of
  // the binding mask: say so, not "1 cores" of a 2-core host.
  const long host = ::sysconf(_SC_NPROCESSORS_ONLN);
  const std::string where =
      host > cores ? fmt::format("bound to {} core{} of {}", cores, cores == 1 ? "" : "s", host)
                   : fmt::format("on {} core{}", cores, cores == 1 ? "" : "s");
  if (lead)
    SHOAL_LOG_INFO(
        "data parallel: {} ranks on this host x {} thread{} {} ({}): all-reduce {}, batches {}",
        c.local_size(), threads, threads == 1 ? "" : "s", where,
        spare ? "a core to spare everywhere" : "no core to spare",
        overlap ? "overlapped on the progress thread" : "on the compute thread",
        spare ? "prefetched on a worker thread" : "prepared on the compute thread");
  dd.overlap = overlap ? DpOptions::Overlap::kOn : DpOptions::Overlap::kOff;
  std::int64_t id = register_communicator(&c, overlap);
  if (d.zero == 3) {
    SHOAL_RETURN_IF_ERROR(attach_zero3(o, c, register_communicator(&c, false)));
  } else if (d.zero > 0) {
    SHOAL_RETURN_IF_ERROR(attach_sharded_update(o, id, d, lead));
  } else {
    o.grad_pass = [id, d = dd, lead](graph::Graph& g,
                                     std::vector<train::ParamRef>& params) -> Status {
      SHOAL_ASSIGN_OR_RETURN(BucketPlan plan, inject_allreduce(g, params, id, d));
      if (lead) {
        std::vector<std::int64_t> sizes;
        for (const auto& b : plan.buckets) sizes.push_back(b.elements);
        SHOAL_LOG_INFO("data parallel: {} gradient buckets of {} elements, wire {}",
                       plan.buckets.size(), fmt::join(sizes, "+"), dtype_name(d.wire));
        SHOAL_LOG_DEBUG("{}", plan.str());
      }
      return ok_status();
    };
  }
  o.peers = std::make_shared<CommPeers>(c);
  // The step's arena (where the planner puts each bucket's gradients) in
  // shared memory: ranks on one host all-reduce buckets over mappings of
  // each other's arenas.
  o.arena_allocator = comm::Communicator::shared_arena;
  return ok_status();
}

}  // namespace shoal::dp
