// What a placement costs a job: the α-β time of its ring all-reduce over
// the hops it got, against the best placement the topology allows.
#include <algorithm>
#include <bit>
#include <map>
#include <set>

#include "cluster/chips.h"
#include "shoal/cluster/placer.h"

namespace shoal::cluster {

namespace {

// The chips the job holds on each node, nodes in rank order.
std::vector<std::pair<int, std::uint64_t>> chips_by_node(const Placement& p) {
  std::vector<std::pair<int, std::uint64_t>> out;
  for (const RankSlot& r : p.ranks) {
    if (!out.empty() && out.back().first == r.node) {
      out.back().second |= r.accels;
      continue;
    }
    bool merged = false;
    for (auto& [n, mask] : out)
      if (n == r.node) mask |= r.accels, merged = true;
    if (!merged) out.push_back({r.node, r.accels});
  }
  return out;
}

bool linked_in_node(const Node& n, std::uint64_t mask, const JobSpec& j) {
  if (n.links == ChipLinks::kRing) return is_arc(mask, n.accels);
  if (n.links == ChipLinks::kMesh) {
    if (j.links == LinkNeed::kMesh) return is_block(mask, n.mesh_w, n.mesh_h, j.mesh_w, j.mesh_h);
    // Any block whose snake closes into a ring of neighbours.
    int k = std::popcount(mask);
    for (int w = 1; w <= n.mesh_w; ++w)
      if (k % w == 0 && k / w <= n.mesh_h && is_block(mask, n.mesh_w, n.mesh_h, w, k / w))
        return true;
  }
  return false;
}

// Whole ring nodes, consecutive under one leaf switch.
bool ring_of_whole_nodes(const Topology& t, const std::vector<std::pair<int, std::uint64_t>>& by) {
  int leaf = t.nodes[by[0].first].leaf;
  const auto& order = t.switches[leaf].nodes;
  std::vector<std::size_t> pos;
  for (const auto& [n, mask] : by) {
    const Node& node = t.nodes[n];
    if (node.leaf != leaf || node.links != ChipLinks::kRing || mask != all_chips(node.accels))
      return false;
    pos.push_back(std::find(order.begin(), order.end(), n) - order.begin());
  }
  std::sort(pos.begin(), pos.end());
  return pos.back() - pos.front() + 1 == pos.size();
}

double ring_time(LinkCost c, int k, double bytes) {
  if (k <= 1) return 0;
  return 2.0 * (k - 1) * (c.alpha + bytes / k * c.beta);
}

int endpoints(const JobSpec& j, int ranks) {
  return j.accels_per_rank > 0 ? ranks * j.accels_per_rank : ranks;
}

}  // namespace

bool adjacent(const Topology& t, const JobSpec& j, const Placement& p) {
  if (j.links == LinkNeed::kNone) return true;
  auto by = chips_by_node(p);
  if (by.empty()) return false;
  if (by.size() == 1) {
    const Node& n = t.nodes[by[0].first];
    if (j.links == LinkNeed::kMesh)
      return n.links == ChipLinks::kMesh &&
             is_block(by[0].second, n.mesh_w, n.mesh_h, j.mesh_w, j.mesh_h);
    return linked_in_node(n, by[0].second, j);
  }
  return j.links == LinkNeed::kRing && ring_of_whole_nodes(t, by);
}

double allreduce_seconds(const Topology& t, const JobSpec& j, const Placement& p) {
  const double bytes = j.allreduce_mb * 1e6;
  const int k = endpoints(j, static_cast<int>(p.ranks.size()) - j.servers);
  std::vector<RankSlot> workers(p.ranks.begin(), p.ranks.end() - j.servers);
  auto by = chips_by_node(Placement{workers});
  if (by.empty()) return 0;
  LinkCost worst;
  if (by.size() == 1) {
    const Node& n = t.nodes[by[0].first];
    worst =
        j.accels_per_rank > 0 && linked_in_node(n, by[0].second, j) ? t.costs.chip : t.costs.host;
  } else if (j.accels_per_rank > 0 && ring_of_whole_nodes(t, by)) {
    worst = t.costs.chip;
  } else {
    int hops = 1;
    for (std::size_t i = 1; i < by.size(); ++i)
      hops = std::max(hops, t.switch_hops(by[0].first, by[i].first));
    worst = hops <= 1 ? t.costs.leaf : t.costs.spine;
  }
  return ring_time(worst, k, bytes);
}

double ideal_allreduce_seconds(const Topology& t, const JobSpec& j, int ranks) {
  const int k = endpoints(j, ranks);
  const double bytes = j.allreduce_mb * 1e6;
  int most_chips = 0, most_cpus = 0;
  bool chip_links = false;
  for (const Node& n : t.nodes) {
    most_chips = std::max(most_chips, n.accels);
    most_cpus = std::max(most_cpus, n.cpus);
    chip_links |= n.links != ChipLinks::kNone;
  }
  if (j.accels_per_rank > 0) {
    if (k <= most_chips) return ring_time(chip_links ? t.costs.chip : t.costs.host, k, bytes);
    if (chip_links && most_chips > 0 && k % most_chips == 0)
      return ring_time(t.costs.chip, k, bytes);
  } else if (static_cast<long>(ranks) * std::max(1, j.cpus_per_rank) <= most_cpus) {
    return ring_time(t.costs.host, k, bytes);
  }
  std::size_t per_leaf = 0;
  for (const Switch& s : t.switches) per_leaf = std::max(per_leaf, s.nodes.size());
  long leaf_room = static_cast<long>(per_leaf) * (j.accels_per_rank > 0 ? most_chips : most_cpus);
  long need = j.accels_per_rank > 0 ? k : static_cast<long>(ranks) * std::max(1, j.cpus_per_rank);
  return ring_time(need <= leaf_room ? t.costs.leaf : t.costs.spine, k, bytes);
}

double slowdown(const Topology& t, const JobSpec& j, const Placement& p) {
  const int ranks = static_cast<int>(p.ranks.size()) - j.servers;
  double ideal = ideal_allreduce_seconds(t, j, ranks);
  if (ideal <= 0) return 1;
  // Never below 1: the ideal is a bound, and a job gains nothing from it.
  return std::max(1.0, 1 + j.comm_fraction * (allreduce_seconds(t, j, p) / ideal - 1));
}

}  // namespace shoal::cluster
