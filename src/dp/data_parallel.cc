#include "shoal/dp/data_parallel.h"

#include <unistd.h>

#include <mutex>
#include <numeric>
#include <string_view>

#include "shoal/collective/registry.h"
#include "shoal/core/logging.h"
#include "shoal/dp/sharded.h"
#include "shoal/runtime/kernel.h"

namespace shoal::dp {

// A few hundred bytes, once at start-up: a difference is reported by name
// and value, not as two hashes.
Status agree_options(comm::Communicator& c, const train::Peers::Options& options) {
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

namespace {

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
  Status agree_options(const Options& options) override { return dp::agree_options(c_, options); }
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

// ZeRO-1 and 2 over communicator `id`: the update pass reduce-scatters the
// gradients, updates this rank's shard, all-gathers the parameters.
Status attach_sharded_update(train::TrainOptions& o, std::int64_t id, const DpOptions& d,
                             bool lead) {
  const train::OptimizerOptions oo = train::optimizer_options(o);
  const std::int64_t bucket = d.zero == 2 ? f32_elements(d.zero_bucket_mb) : 0;
  o.update_pass = [id, oo, lead, bucket, stage = d.zero, wire = d.wire](
                      graph::Builder& b,
                      const std::vector<train::ParamRef>& params) -> Result<train::OptimizerGraph> {
    std::vector<std::int64_t> shards;
    SHOAL_ASSIGN_OR_RETURN(train::OptimizerGraph og,
                           inject_sharded(b, params, oo, id, bucket, &shards, wire));
    if (lead) {
      std::int64_t total = 0, mine = 0;
      for (const auto& p : params) total += num_elements(b.shape(p.param));
      for (std::int64_t n : shards) mine += n;
      SHOAL_LOG_INFO(
          "data parallel, ZeRO-{}: gradients reduce-scattered in {} part(s), wire {}; rank 0 "
          "holds {} of the {} elements of each optimizer slot",
          stage, shards.size(), dtype_name(wire), mine, total);
    }
    return og;
  };
  return ok_status();
}

}  // namespace

// ZeRO-3: the forward reads every parameter through an all-gather of its
// rows (dp/sharded.h); after autodiff the backward gathers again, and each
// rank's summed row gradients become the global batch's mean.
Status attach_zero3(train::TrainOptions& o, comm::Communicator& c, std::int64_t id) {
  if (train::is_layerwise(o.optimizer))
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

std::shared_ptr<train::Peers> peers(comm::Communicator& c) {
  return std::make_shared<CommPeers>(c);
}

train::Peers::Options named_options(const DpOptions& d) {
  // The wire type changes the sums; the bucket sizes, the calls each rank
  // makes (a mismatch would otherwise surface as differing call sequences).
  return {{"--wire", std::string(dtype_name(d.wire))},
          {"--bucket-mb", fmt::format("{}", d.bucket_mb)},
          {"--first-bucket-mb", fmt::format("{}", d.first_bucket_mb)},
          {"--zero", std::to_string(d.zero)},
          {"--zero-bucket-mb", fmt::format("{}", d.zero_bucket_mb)}};
}

Status attach_group(train::TrainOptions& o, comm::Communicator& group, const DpOptions& d,
                    bool lead) {
  o.data_rank = group.rank();
  o.data_world = group.size();
  o.prefetch = false;
  const std::int64_t id = collective::register_communicator(&group, false);
  if (d.zero == 3) return attach_zero3(o, group, id);
  if (d.zero > 0) return attach_sharded_update(o, id, d, lead);
  DpOptions dd = d;
  dd.overlap = DpOptions::Overlap::kOff;
  o.grad_pass = [id, dd, lead](graph::Graph& g, std::vector<train::ParamRef>& params) -> Status {
    SHOAL_ASSIGN_OR_RETURN(BucketPlan plan, inject_allreduce(g, params, id, dd));
    if (lead) SHOAL_LOG_INFO("data parallel: {} gradient buckets", plan.buckets.size());
    return ok_status();
  };
  return ok_status();
}

Status attach(train::TrainOptions& o, comm::Communicator& c, const DpOptions& d) {
  SHOAL_RETURN_IF_ERROR(validate(d));
  o.rank = c.rank();
  o.world = c.size();
  if (c.size() == 1) return ok_status();  // one process: nothing to synchronize
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
  std::int64_t id = collective::register_communicator(&c, overlap);
  if (d.zero == 3) {
    SHOAL_RETURN_IF_ERROR(attach_zero3(o, c, collective::register_communicator(&c, false)));
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
  o.peers = peers(c);
  // The step's arena (where the planner puts each bucket's gradients) in
  // shared memory: ranks on one host all-reduce buckets over mappings of
  // each other's arenas.
  o.arena_allocator = comm::Communicator::shared_arena;
  return ok_status();
}

}  // namespace shoal::dp
