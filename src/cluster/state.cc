#include <fmt/format.h>

#include <bit>
#include <map>

#include "cluster/chips.h"
#include "shoal/cluster/placer.h"

namespace shoal::cluster {

ClusterState::ClusterState(const Topology& t) : t_(&t), free_(t.nodes.size()) {
  for (std::size_t n = 0; n < t.nodes.size(); ++n) {
    const Node& node = t.nodes[n];
    free_[n] = {node.cpus, node.mem_mb, all_chips(node.accels), true};
    cpus_ += node.cpus;
    mem_ += node.mem_mb;
    accels_ += node.accels;
  }
}

bool ClusterState::idle(int n) const {
  const Node& node = t_->nodes[n];
  const Free& f = free_[n];
  return f.up && f.cpus == node.cpus && f.mem == node.mem_mb && f.accels == all_chips(node.accels);
}

int ClusterState::capacity(int n, const JobSpec& j) const {
  const Free& f = free_[n];
  if (!f.up) return 0;
  // Chips first: most often the bound, and zero on a full node. A division
  // only where a bound binds (the placer asks every node, many times).
  std::int64_t cap = 1 << 20;
  if (j.accels_per_rank > 0) {
    const int chips = std::popcount(f.accels);
    cap = j.accels_per_rank == 1 ? chips : chips / j.accels_per_rank;
    if (cap == 0) return 0;
  }
  if (j.cpus_per_rank > 0 && f.cpus < cap * j.cpus_per_rank) cap = f.cpus / j.cpus_per_rank;
  if (j.mem_mb_per_rank > 0 && f.mem < cap * j.mem_mb_per_rank) cap = f.mem / j.mem_mb_per_rank;
  return static_cast<int>(cap);
}

Status ClusterState::take(const JobSpec& j, const std::vector<RankSlot>& ranks) {
  // Check the whole gang first, so a refused take changes nothing.
  struct Need {
    int cpus = 0;
    std::int64_t mem = 0;
    std::uint64_t accels = 0;
  };
  std::map<int, Need> need;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const RankSlot& s = ranks[r];
    if (s.node < 0 || s.node >= static_cast<int>(free_.size()))
      return invalid_argument("job `{}` rank {}: node {} does not exist", j.name, r, s.node);
    Need& n = need[s.node];
    if (n.accels & s.accels)
      return invalid_argument("job `{}` rank {}: a chip of node `{}` given twice", j.name, r,
                              t_->nodes[s.node].name);
    n.cpus += j.cpus_per_rank;
    n.mem += j.mem_mb_per_rank;
    n.accels |= s.accels;
  }
  for (const auto& [node, n] : need) {
    const Free& f = free_[node];
    if (!f.up || f.cpus < n.cpus || f.mem < n.mem || (f.accels & n.accels) != n.accels)
      return invalid_argument(
          "job `{}`: node `{}` cannot hold its ranks (free {} CPUs, {} MB, chips {:#x}; "
          "asked {} CPUs, {} MB, chips {:#x}{})",
          j.name, t_->nodes[node].name, f.cpus, f.mem, f.accels, n.cpus, n.mem, n.accels,
          f.up ? "" : "; the node is down");
  }
  for (const auto& [node, n] : need) {
    Free& f = free_[node];
    f.cpus -= n.cpus;
    f.mem -= n.mem;
    f.accels &= ~n.accels;
    cpus_ -= n.cpus;
    mem_ -= n.mem;
    accels_ -= std::popcount(n.accels);
  }
  return ok_status();
}

void ClusterState::give(const JobSpec& j, const std::vector<RankSlot>& ranks) {
  for (const RankSlot& s : ranks) {
    Free& f = free_[s.node];
    f.cpus += j.cpus_per_rank;
    f.mem += j.mem_mb_per_rank;
    f.accels |= s.accels;
    if (f.up) {
      cpus_ += j.cpus_per_rank;
      mem_ += j.mem_mb_per_rank;
      accels_ += std::popcount(s.accels);
    }
  }
}

void ClusterState::set_up(int n, bool up) {
  Free& f = free_[n];
  if (f.up == up) return;
  int sign = up ? 1 : -1;
  cpus_ += sign * f.cpus;
  mem_ += sign * f.mem;
  accels_ += sign * std::popcount(f.accels);
  f.up = up;
}

double ClusterState::fragmentation() const {
  const bool chips = t_->total_accels() > 0;
  double total = 0, scattered = 0;
  for (std::size_t n = 0; n < free_.size(); ++n) {
    const Free& f = free_[n];
    if (!f.up) continue;
    double amount = chips ? std::popcount(f.accels) : f.cpus;
    total += amount;
    if (!idle(static_cast<int>(n))) scattered += amount;
  }
  return total > 0 ? scattered / total : 0;
}

std::string why_not(const ClusterState& s, const JobSpec& j) {
  const Topology& t = s.topology();
  const int nodes = static_cast<int>(t.nodes.size());
  // In the order a reader checks them; a node counts under its first.
  const std::string reasons[] = {
      "down", fmt::format("too few free CPUs (needs {})", j.cpus_per_rank),
      fmt::format("too little free memory (needs {} MB)", j.mem_mb_per_rank),
      fmt::format("too few free GPUs (needs {})", j.accels_per_rank)};
  int count[4] = {0, 0, 0, 0}, takers = 0;
  long room = 0;
  for (int n = 0; n < nodes; ++n) {
    const int cap = s.capacity(n, j);
    if (cap > 0) {
      ++takers;
      room += cap;
      continue;
    }
    const int r = !s.up(n)                               ? 0
                  : s.free_cpus(n) < j.cpus_per_rank     ? 1
                  : s.free_mem_mb(n) < j.mem_mb_per_rank ? 2
                                                         : 3;
    ++count[r];
  }
  std::string out = fmt::format("{}/{} nodes can take a rank", takers, nodes);
  std::string sep = ": ";
  for (int r = 0; r < 4; ++r)
    if (count[r] > 0) {
      out += fmt::format("{}{} {}", sep, count[r], reasons[r]);
      sep = ", ";
    }
  const int want = j.ranks + j.servers;
  if (room < want) return out + fmt::format("; room for {} of {} ranks", room, want);
  // Room enough, in the wrong shape: what the links ask for.
  switch (j.links) {
    case LinkNeed::kRing:
      return out + fmt::format(
                       "; room for all {} ranks, but not as a ring: {} linked chips in one "
                       "node, or whole nodes of one switch",
                       want, j.total_accels());
    case LinkNeed::kMesh:
      return out +
             fmt::format("; room for all {} ranks, but no free {}x{} block of one node's mesh",
                         want, j.mesh_w, j.mesh_h);
    case LinkNeed::kNone:
      break;
  }
  return out + fmt::format("; room for all {} ranks, but not in one placement", want);
}

Fit fit(const ClusterState& now, const JobSpec& j) {
  Fit f;
  f.p = place(now, j, j.ranks, {});
  if (f.p) return f;
  const ClusterState empty(now.topology());
  f.ever = place(empty, j, j.ranks, {}).has_value();
  f.why = why_not(f.ever ? now : empty, j);
  return f;
}

}  // namespace shoal::cluster
