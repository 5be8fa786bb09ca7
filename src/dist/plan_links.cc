// dist/plan.h's calibration of the links and cores: each group's
// collectives timed at several sizes, every group of a kind at once in the
// ranks' own places, what a collective inside a step adds in waiting, and
// how many of the ranks' threads compete for a core.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>

#include "dist/plan_internal.h"
#include "shoal/comm/communicator.h"
#include "shoal/core/logging.h"
#include "shoal/dp/sharded.h"

namespace shoal::dist {
namespace {

using Clock = std::chrono::steady_clock;

// `group`'s all-reduce (null: this rank sits out).
Status group_allreduce(comm::Communicator* group, float* buf, std::size_t n) {
  return group == nullptr ? ok_status()
                          : group->allreduce(buf, buf, n, DType::kF32, comm::ReduceOp::kSum);
}

// `group`'s reduce-scatter of `n` floats then all-gather of the shards
// back (ZeRO's pair, and sequence parallelism's).
Status group_shard_pair(comm::Communicator* group, float* buf, std::size_t n,
                        std::vector<float>& shard) {
  if (group == nullptr) return ok_status();
  const std::vector<std::int64_t> sizes =
      dp::shard_sizes(static_cast<std::int64_t>(n), group->size());
  const std::vector<std::size_t> counts(sizes.begin(), sizes.end());
  shard.resize(std::max<std::size_t>(counts[static_cast<std::size_t>(group->rank())], 1));
  SHOAL_RETURN_IF_ERROR(
      group->reduce_scatter(buf, shard.data(), counts, DType::kF32, comm::ReduceOp::kSum));
  return group->allgatherv(shard.data(), buf, counts, DType::kF32);
}

// `op` (one collective in every group at once): the slowest rank's mean.
Result<double> time_collective(comm::Communicator& world, const std::function<Status()>& op) {
  for (int w = 0; w < 2; ++w) SHOAL_RETURN_IF_ERROR(op());
  // Repetitions for ~20 ms, the same on every rank (each group's ranks
  // must make the same calls).
  auto t0 = Clock::now();
  SHOAL_RETURN_IF_ERROR(op());
  double one = std::chrono::duration<double>(Clock::now() - t0).count();
  SHOAL_RETURN_IF_ERROR(world.allreduce(&one, &one, 1, DType::kF64, comm::ReduceOp::kMax));
  const int iters = std::clamp(static_cast<int>(0.02 / std::max(one, 1e-7)), 3, 200);
  SHOAL_RETURN_IF_ERROR(world.barrier());
  t0 = Clock::now();
  for (int i = 0; i < iters; ++i) SHOAL_RETURN_IF_ERROR(op());
  double mean = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  SHOAL_RETURN_IF_ERROR(world.allreduce(&mean, &mean, 1, DType::kF64, comm::ReduceOp::kMax));
  return mean;
}

// Spins for `cpu_s` of this thread's CPU time: longer on the wall clock
// while another process holds the core.
void busy(double cpu_s) {
  auto now = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  const double until = now() + cpu_s;
  volatile double x = 1;
  while (now() < until)
    for (int i = 0; i < 256; ++i) x = x * 1.0000001 + 1e-9;
}

// The cost of a small all-reduce among `group`'s ranks between bursts of
// compute on every rank, beyond the bursts alone: what each collective
// inside a step adds (on an oversubscribed host, mostly waiting for a
// peer to get a core). The slowest rank's, per collective.
Result<double> sync_cost(comm::Communicator& world, comm::Communicator* group) {
  constexpr int kBursts = 40;
  constexpr double kBurst = 1e-3;
  float v[16] = {};
  double wall[2] = {0, 0};
  for (int with = 0; with < 2; ++with) {
    SHOAL_RETURN_IF_ERROR(world.barrier());
    const auto t0 = Clock::now();
    for (int k = 0; k < kBursts; ++k) {
      busy(kBurst);
      if (with) SHOAL_RETURN_IF_ERROR(group_allreduce(group, v, 16));
    }
    SHOAL_RETURN_IF_ERROR(world.barrier());
    wall[with] = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  double extra = std::max(0.0, (wall[1] - wall[0]) / kBursts);
  SHOAL_RETURN_IF_ERROR(world.allreduce(&extra, &extra, 1, DType::kF64, comm::ReduceOp::kMax));
  return extra;
}

}  // namespace

// `op(n)` at each size: the fit. A size that took more than kDisturbedRate
// times the one before it per byte (a collective's time grows at most in
// proportion, as alpha + bytes x beta; a larger buffer that leaves the
// cache, ~1.2x) was disturbed: it is measured again, twice at most, the
// faster kept (seen on the netns hosts: 4 MiB over 4 ranks at 119 ms
// after 512 KiB at 6.0; 54 ms the hour before). Every rank sees the
// slowest rank's time, so all of them decide alike.
Result<LinkFit> fit_sizes(comm::Communicator& world, const std::function<Status(std::size_t)>& op) {
  constexpr double kDisturbedRate = 1.5;
  const std::size_t sizes[] = {4 << 10, 64 << 10, 512 << 10, 4 << 20};
  const std::size_t small = sizes[0], large = sizes[3];
  LinkFit f;
  for (std::size_t bytes : sizes) {
    const std::size_t n = std::max<std::size_t>(bytes / 4, 1);
    auto once = [&] { return time_collective(world, [&] { return op(n); }); };
    SHOAL_ASSIGN_OR_RETURN(double t, once());
    const double first = t;
    for (int again = 0; again < 2 && !f.points.empty(); ++again) {
      const auto [b0, t0] = f.points.back();
      if (t <= kDisturbedRate * t0 * static_cast<double>(bytes) / b0) break;
      SHOAL_ASSIGN_OR_RETURN(double t2, once());
      t = std::min(t, t2);
    }
    // Said where it mattered (a cache's step up, measured again alike, is
    // not news), once.
    if (first > kDisturbedRate * t && world.rank() == 0)
      SHOAL_LOG_WARN(
          "shoal plan: a collective of {} bytes took {:.2f} ms, then {:.2f}: kept the "
          "faster",
          bytes, first * 1e3, t * 1e3);
    f.points.emplace_back(static_cast<double>(bytes), t);
  }
  const double t_small = f.points.front().second, t_large = f.points.back().second;
  f.beta = std::max(0.0, (t_large - t_small) / static_cast<double>(large - small));
  f.alpha = std::max(1e-6, t_small - f.beta * static_cast<double>(small));
  return f;
}

// Every rank's `threads` threads spin for the same CPU time at once: the
// mean over ranks of wall time / CPU time (how many compete for a core).
Result<double> measure_contention(comm::Communicator& c, int threads) {
  constexpr double kCpu = 0.03;
  double k[3];
  for (double& x : k) {
    SHOAL_RETURN_IF_ERROR(c.barrier());
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads)
    busy(kCpu);
    x = std::chrono::duration<double>(Clock::now() - t0).count() / kCpu;
  }
  std::sort(k, k + 3);
  double mean = k[1];  // the median of three
  SHOAL_RETURN_IF_ERROR(c.allreduce(&mean, &mean, 1, DType::kF64, comm::ReduceOp::kSum));
  return std::max(1.0, mean / c.size());
}

// Each group the layouts use, every one of its kind at once, in the
// ranks' own places (across hosts, over the links the job will use); the
// reduce-scatter + all-gather pair in those of `shards`.
Status measure_links(comm::Communicator& c, const std::vector<Group>& groups,
                     const std::vector<Group>& shards, Calibration& cal) {
  std::vector<float> buf((4 << 20) / 4, 1.0f), shard;
  const int r = c.rank();
  for (const Group g : groups) {
    std::unique_ptr<comm::Communicator> sub;
    comm::Communicator* grp = &c;
    if (g.size < c.size() || g.shift > 0) {
      SHOAL_ASSIGN_OR_RETURN(sub, c.split(group_color(g, r, c.size()), r));
      grp = sub.get();  // null where this rank sits out
    }
    SHOAL_ASSIGN_OR_RETURN(cal.allreduce[g], fit_sizes(c, [&](std::size_t n) {
                             return group_allreduce(grp, buf.data(), n);
                           }));
    SHOAL_ASSIGN_OR_RETURN(cal.sync_s[g], sync_cost(c, grp));
    if (std::find(shards.begin(), shards.end(), g) == shards.end()) continue;
    SHOAL_ASSIGN_OR_RETURN(cal.shard[g], fit_sizes(c, [&](std::size_t n) {
                             return group_shard_pair(grp, buf.data(), n, shard);
                           }));
  }
  return ok_status();
}

}  // namespace shoal::dist
