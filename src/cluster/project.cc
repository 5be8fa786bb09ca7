#include "shoal/cluster/project.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace shoal::cluster {

namespace {

// Which link joins ranks `d` apart (ranks laid out node by node, nodes
// switch by switch), and how many flows share it when every rank of a
// node talks that far at once.
struct Hop {
  LinkCost c;
  int flows = 1;
};
Hop hop(const LinkCosts& costs, int d, int per_node, int per_switch) {
  if (d < per_node) return {costs.host, 1};
  if (d < per_node * per_switch) return {costs.leaf, per_node};
  return {costs.spine, per_node};
}

// Ring over p ranks: 2(p−1) steps of n/p bytes, each as slow as the
// slowest hop; one edge per node leaves it, so no NIC is shared.
double ring(LinkCost c, double p, double n) {
  return p <= 1 ? 0 : 2 * (p - 1) * (c.alpha + n / p * c.beta);
}

// Halving-doubling over p ranks, near partners first: step k exchanges
// n/2^k bytes with the rank 2^(k−1) away (reduce-scatter), then the
// same in reverse (all-gather). Steps that leave the node share its NIC
// among all its ranks. Ranks beyond the largest power of two fold in and
// out with two whole-buffer exchanges, which share the NIC too.
double halving_doubling(const LinkCosts& costs, int p, double n, int per_node, int per_switch) {
  if (p <= 1) return 0;
  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  double t = 0, bytes = n;
  for (int d = 1; d < p2; d *= 2) {
    bytes /= 2;
    Hop h = hop(costs, d, per_node, per_switch);
    t += 2 * (h.c.alpha + bytes * h.c.beta * h.flows);
  }
  if (p2 != p) {
    // Ranks p2.. fold into ranks 0.. at once: where that leaves the node,
    // every folding rank of a node sends its whole buffer through one NIC
    // (24 ranks, 8 a node: the third node's 8 flows share it).
    Hop h = hop(costs, p2, per_node, per_switch);
    const int flows = std::min(h.flows, p - p2);
    t += 2 * (h.c.alpha + n * h.c.beta * flows);
  }
  return t;
}

// Recursive doubling over p ranks (Shoal's choice for small messages):
// log2 p steps, each exchanging the whole buffer with the rank 2^k away,
// every rank of a node at once through its NIC once the partner is off
// the node; extra ranks fold in and out as in halving-doubling.
double recursive_doubling(const LinkCosts& costs, int p, double n, int per_node, int per_switch) {
  if (p <= 1) return 0;
  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  double t = 0;
  for (int d = 1; d < p2; d *= 2) {
    Hop h = hop(costs, d, per_node, per_switch);
    t += h.c.alpha + n * h.c.beta * h.flows;
  }
  if (p2 != p) {
    Hop h = hop(costs, p2, per_node, per_switch);
    t += 2 * (h.c.alpha + n * h.c.beta * std::min(h.flows, p - p2));
  }
  return t;
}

LinkCost across(const LinkCosts& costs, int nodes, int per_switch) {
  return nodes <= 1 ? costs.host : nodes <= per_switch ? costs.leaf : costs.spine;
}

}  // namespace

std::vector<ProjectionRow> project_allreduce(const LinkCosts& costs, const std::vector<int>& ranks,
                                             const std::vector<double>& bytes, int ranks_per_node,
                                             int nodes_per_switch) {
  std::vector<ProjectionRow> rows;
  for (double n : bytes)
    for (int p : ranks) {
      const int local = std::min(p, ranks_per_node);
      const int nodes = (p + local - 1) / local;
      const LinkCost net = across(costs, nodes, nodes_per_switch);
      ProjectionRow r;
      r.ranks = p;
      r.bytes = n;
      r.ring = ring(net, p, n);
      r.halving_doubling = halving_doubling(costs, p, n, local, nodes_per_switch);
      r.recursive_doubling = recursive_doubling(costs, p, n, local, nodes_per_switch);
      // Reduce-scatter within the node (ring), then the `local` ranks each
      // all-reduce their 1/local slice across nodes at once (sharing the
      // NIC: the slices add up to n), then all-gather within the node.
      const double intra = (local - 1) * (costs.host.alpha + n / local * costs.host.beta);
      LinkCost shared = net;
      shared.beta *= local;
      const double slice = n / local;
      LinkCosts one_per_node = costs;
      one_per_node.leaf.beta *= local;
      one_per_node.spine.beta *= local;
      r.hierarchical =
          2 * intra + std::min(ring(shared, nodes, slice),
                               halving_doubling(one_per_node, nodes, slice, 1, nodes_per_switch));
      const double best =
          std::min({r.ring, r.halving_doubling, r.recursive_doubling, r.hierarchical});
      r.best = best == r.ring                 ? "ring"
               : best == r.halving_doubling   ? "halving-doubling"
               : best == r.recursive_doubling ? "recursive-doubling"
                                              : "hierarchical";
      rows.push_back(r);
    }
  return rows;
}

std::string format_projection(const std::vector<ProjectionRow>& rows, double compute_s) {
  std::string out =
      fmt::format("{:>10} {:>6} {:>12} {:>18} {:>14} {:>20} {:>18}{}\n", "bytes", "ranks",
                  "ring ms", "halving-doubling ms", "hierarchical ms", "recursive-doubling ms",
                  "best", compute_s > 0 ? "  step efficiency" : "");
  for (const ProjectionRow& r : rows) {
    double best = std::min({r.ring, r.halving_doubling, r.recursive_doubling, r.hierarchical});
    out += fmt::format("{:>10.0f} {:>6} {:>12.4f} {:>18.4f} {:>14.4f} {:>20.4f} {:>18}", r.bytes,
                       r.ranks, 1e3 * r.ring, 1e3 * r.halving_doubling, 1e3 * r.hierarchical,
                       1e3 * r.recursive_doubling, r.best);
    if (compute_s > 0) out += fmt::format("  {:>15.3f}", compute_s / (compute_s + best));
    out += "\n";
  }
  return out;
}

}  // namespace shoal::cluster
