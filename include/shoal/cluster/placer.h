// Where a job's ranks go. ClusterState is what is free; Placer finds a
// whole gang or nothing (never part of a sync job), keeps ring and mesh
// jobs on adjacent chips, and packs so that whole nodes stay free. The cost
// of a placement is the α-β time of the job's ring all-reduce over the hops
// it actually gets, so "adjacent" is measured in seconds.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "shoal/cluster/spec.h"
#include "shoal/cluster/topology.h"

namespace shoal::cluster {

struct RankSlot {
  int node = -1;
  std::uint64_t accels = 0;  // bit i: chip i of the node
};
// Ranks in ring order.
struct Placement {
  std::vector<RankSlot> ranks;
};

class ClusterState {
 public:
  explicit ClusterState(const Topology& t);

  const Topology& topology() const { return *t_; }
  int free_cpus(int n) const { return free_[n].cpus; }
  std::int64_t free_mem_mb(int n) const { return free_[n].mem; }
  std::uint64_t free_accels(int n) const { return free_[n].accels; }
  bool up(int n) const { return free_[n].up; }
  bool idle(int n) const;  // up and nothing of it in use
  // Ranks of `j` that node n can still hold.
  int capacity(int n, const JobSpec& j) const;

  // Resources of ranks placed by a Placer; take() checks they are free.
  Status take(const JobSpec& j, const std::vector<RankSlot>& ranks);
  void give(const JobSpec& j, const std::vector<RankSlot>& ranks);
  void set_up(int n, bool up);

  int free_accels_total() const { return accels_; }
  int free_cpus_total() const { return cpus_; }
  std::int64_t free_mem_total() const { return mem_; }
  // Free accelerators (CPUs on a cluster without any) that sit on nodes
  // already partly used, as a fraction of all free ones: 0 when every free
  // chip is on a wholly idle node, near 1 when the free space is scattered.
  double fragmentation() const;

 private:
  struct Free {
    int cpus = 0;
    std::int64_t mem = 0;
    std::uint64_t accels = 0;
    bool up = true;
  };
  const Topology* t_;
  std::vector<Free> free_;
  int accels_ = 0, cpus_ = 0;
  std::int64_t mem_ = 0;
};

struct PlaceOptions {
  bool best_fit = true;   // false: first fit in node order
  bool adjacency = true;  // false: ring/mesh jobs placed as if kNone
};

// `ranks` of job j (j.ranks for a sync gang, fewer for a shrunk elastic
// job); std::nullopt when they cannot all be placed now.
std::optional<Placement> place(const ClusterState& s, const JobSpec& j, int ranks,
                               const PlaceOptions& o);
// Why j does not fit on `s`, counted per node as Volcano's FitErrors are:
// each node's first reason not to take one more rank, then what is left
// when the nodes have room but not in the shape the job's links need:
// "0/64 nodes can take a rank: 40 too few free GPUs (needs 4), 24 down".
std::string why_not(const ClusterState& s, const JobSpec& j);

// One verdict, for the CLI and the engines: placed now, or not now (and
// why), or never, not even on the empty cluster (and why). The empty
// cluster is tried only when `now` fails.
struct Fit {
  std::optional<Placement> p;  // set when it fits now
  bool ever = true;            // false: it cannot fit even on the empty cluster
  std::string why;             // when it does not fit: why_not, now or on the empty cluster
};
Fit fit(const ClusterState& now, const JobSpec& j);

// Whether the placement gives j the chip links it asked for.
bool adjacent(const Topology& t, const JobSpec& j, const Placement& p);
// α-β seconds of j's ring all-reduce (2(k−1) steps of S/k bytes, each
// step bounded by the slowest hop of the ring) under p, and under the best
// placement j could have on this topology.
double allreduce_seconds(const Topology& t, const JobSpec& j, const Placement& p);
double ideal_allreduce_seconds(const Topology& t, const JobSpec& j, int ranks);
// How much longer a step takes under p than under the ideal placement:
// 1 + comm_fraction·(T_p / T_ideal − 1).
double slowdown(const Topology& t, const JobSpec& j, const Placement& p);

}  // namespace shoal::cluster
