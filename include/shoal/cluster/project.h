// All-reduce and data-parallel step time projected to 8–4,096 ranks from
// α-β link costs (those the comm tuner measures on this machine), for the
// flat ring, halving-doubling, recursive doubling and the two-level
// (hierarchical) algorithm:
// which wins where.
#pragma once

#include <string>
#include <vector>

#include "shoal/cluster/topology.h"

namespace shoal::cluster {

struct ProjectionRow {
  int ranks = 0;
  double bytes = 0;
  double ring = 0, halving_doubling = 0, hierarchical = 0;  // seconds
  double recursive_doubling = 0;
  const char* best = "";
};

// `ranks_per_node` ranks share a node (costs.host between them); nodes
// under one leaf switch talk at costs.leaf, beyond `nodes_per_switch` at
// costs.spine. Every algorithm is bounded by its slowest hop.
std::vector<ProjectionRow> project_allreduce(const LinkCosts& costs, const std::vector<int>& ranks,
                                             const std::vector<double>& bytes, int ranks_per_node,
                                             int nodes_per_switch);
// A table; with compute_s > 0 also each row's data-parallel step
// efficiency compute / (compute + the best all-reduce), no overlap.
std::string format_projection(const std::vector<ProjectionRow>& rows, double compute_s);

}  // namespace shoal::cluster
