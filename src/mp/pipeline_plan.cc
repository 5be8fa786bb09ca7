// Where a forward graph is cut into pipeline stages, and in which order a
// stage runs its micro-batches (mp/pipeline.h).
#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "shoal/graph/passes.h"
#include "shoal/mp/pipeline.h"

namespace shoal::mp {
namespace {

// Estimated cost of one node: 2·M·N·K for products, the output's elements
// otherwise. Only the ratios between stages matter.
double node_cost(const graph::Graph& g, const graph::Node& n) {
  if (const double f = graph::node_flops(g, n); f > 0) return f;
  double out = 0;
  for (const auto& t : n.outputs) out += static_cast<double>(num_elements(t.shape));
  return out;
}

// A collective of the graph's inputs alone (sequence parallelism's
// tp_copy of a norm's scale: its gradient summed over the tensor group) is
// ready from the start, and a topological order may put it pieces before
// the op that reads it: that piece would hold the parameter, the reader's
// none, and every cut between them would carry two values. Each such node
// goes right before its first reader.
std::vector<int> beside_readers(const graph::Graph& g, const std::vector<int>& order) {
  std::set<int> early;
  for (int id : order) {
    const graph::Node& n = g.node(id);
    if (n.op == "input" || !n.attrs.has("comm")) continue;
    const bool inputs_only = std::all_of(n.inputs.begin(), n.inputs.end(), [&](graph::Value v) {
      return g.node(v.node).op == "input" || g.node(v.node).op == "constant";
    });
    if (inputs_only) early.insert(id);
  }
  std::vector<int> out;
  std::set<int> placed;
  for (int id : order) {
    if (early.count(id)) continue;
    for (const graph::Value& v : g.node(id).inputs)
      if (early.count(v.node) && placed.insert(v.node).second) out.push_back(v.node);
    out.push_back(id);
  }
  for (int id : order)  // read by nothing
    if (early.count(id) && placed.insert(id).second) out.push_back(id);
  return out;
}

}  // namespace

bool from_inputs_only(const graph::Graph& g, int id) {
  const graph::Node& n = g.node(id);
  if (n.op == "input") return !n.name.starts_with("param/");  // parameters place their users
  if (n.op == "constant") return true;
  if (n.attrs.has("comm")) return false;  // a collective runs where the schedule puts it
  for (const auto& v : n.inputs)
    if (!from_inputs_only(g, v.node)) return false;
  return true;
}

namespace {

// The cheapest way to put `stages` - 1 cuts among the candidates so that the
// largest stage is smallest (prefix costs; candidates are few).
std::vector<std::size_t> balance(const std::vector<double>& before, double total, int stages) {
  const std::size_t n = before.size();
  auto seg = [&](std::size_t from, std::size_t to) {  // candidate indices; n = the end
    const double a = from == n + 1 ? 0 : before[from];
    const double b = to == n ? total : before[to];
    return b - a;
  };
  // best[k][j]: the largest stage when k cuts end with candidate j.
  const double inf = std::numeric_limits<double>::infinity();
  const auto k_max = static_cast<std::size_t>(stages - 1);
  std::vector<std::vector<double>> best(k_max + 1, std::vector<double>(n, inf));
  std::vector<std::vector<std::size_t>> from(k_max + 1, std::vector<std::size_t>(n, 0));
  for (std::size_t j = 0; j < n; ++j) best[1][j] = before[j];
  for (std::size_t k = 2; k <= k_max; ++k)
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < j; ++i) {
        const double v = std::max(best[k - 1][i], seg(i, j));
        if (v < best[k][j]) {
          best[k][j] = v;
          from[k][j] = i;
        }
      }
  std::size_t last = 0;
  double top = inf;
  for (std::size_t j = 0; j < n; ++j)
    if (const double v = std::max(best[k_max][j], seg(j, n)); v < top) {
      top = v;
      last = j;
    }
  std::vector<std::size_t> cuts(k_max);
  for (std::size_t k = k_max; k >= 1; --k) {
    cuts[k - 1] = last;
    last = from[k][last];
  }
  return cuts;
}

// Interleaved stages: rank r runs pieces r, r + ranks, ...; each rank runs
// every one of its pieces once per micro-batch, and the pipeline fills and
// drains through ranks - 1 pieces, so a step takes about
//   micro x (the largest sum of a rank's pieces) + (ranks - 1) x (the largest piece).
// Branch and bound over the cuts for the smallest such time with a
// parameter in every piece, starting from the largest-piece balance; at
// most kBudget partial choices are tried (a deep model keeps the best found
// by then, never worse than the start).
class RankBalance {
 public:
  // Boundary b: 0 the start, j + 1 candidate j, n + 1 the end.
  RankBalance(const std::vector<double>& before, double total, const std::vector<int>& params,
              int params_total, int pieces, const Interleave& il)
      : before_(before),
        params_(params),
        total_(total),
        params_total_(params_total),
        n_(before.size()),
        pieces_(static_cast<std::size_t>(pieces)),
        ranks_(static_cast<std::size_t>(il.ranks)),
        micro_(std::max(il.micro, 1)) {}

  std::vector<std::size_t> solve(const std::vector<std::size_t>& start) {
    best_ = start;
    best_time_ = time_of(start);
    sums_.assign(ranks_, 0);
    cur_.clear();
    dfs(0, 0, 0);
    return best_;
  }

 private:
  static constexpr long kBudget = 2'000'000;
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  double cost(std::size_t b) const { return b == 0 ? 0 : b > n_ ? total_ : before_[b - 1]; }
  int params(std::size_t b) const { return b == 0 ? 0 : b > n_ ? params_total_ : params_[b - 1]; }
  double time(double rank, double piece) const {
    return micro_ * rank + static_cast<double>(ranks_ - 1) * piece;
  }

  double time_of(const std::vector<std::size_t>& cuts) const {
    std::vector<double> sums(ranks_, 0);
    double rank = 0, piece = 0;
    std::size_t from = 0;
    for (std::size_t p = 0; p < pieces_; ++p) {
      const std::size_t to = p + 1 < pieces_ ? cuts[p] + 1 : n_ + 1;
      if (params(to) == params(from)) return kInf;  // a piece without a parameter
      sums[p % ranks_] += cost(to) - cost(from);
      rank = std::max(rank, sums[p % ranks_]);
      piece = std::max(piece, cost(to) - cost(from));
      from = to;
    }
    return time(rank, piece);
  }

  // Pieces before `from` are placed; `rank` and `piece` their largest so far
  // (the time they give is a lower bound of any completion's).
  void dfs(std::size_t from, double rank, double piece) {
    if (++visits_ > kBudget) return;
    const std::size_t k = cur_.size(), r = k % ranks_;
    const bool last = k + 1 == pieces_;
    const std::size_t lo = last ? n_ + 1 : from + 1, hi = last ? n_ + 1 : n_ - (pieces_ - 2 - k);
    for (std::size_t b = lo; b <= hi; ++b) {
      const double c = cost(b) - cost(from);
      if (params(b) == params(from)) continue;
      sums_[r] += c;
      const double next_rank = std::max(rank, sums_[r]), next_piece = std::max(piece, c);
      if (time(next_rank, next_piece) < best_time_) {
        if (last) {
          best_time_ = time(next_rank, next_piece);
          best_ = cur_;
        } else {
          cur_.push_back(b - 1);
          dfs(b, next_rank, next_piece);
          cur_.pop_back();
        }
      }
      sums_[r] -= c;
    }
  }

  const std::vector<double>& before_;
  const std::vector<int>& params_;
  const double total_;
  const int params_total_;
  const std::size_t n_, pieces_, ranks_;
  const double micro_;
  std::vector<std::size_t> best_, cur_;
  double best_time_ = kInf;
  std::vector<double> sums_;
  long visits_ = 0;
};

}  // namespace

std::pair<std::size_t, std::size_t> PipelinePlan::range(int s) const {
  const auto k = static_cast<std::size_t>(s);
  const std::size_t first = k == 0 ? 0 : candidates[cuts[k - 1]].pos;
  const std::size_t last = k == cuts.size() ? order.size() : candidates[cuts[k]].pos;
  return {first, last};
}

std::string PipelinePlan::str(const graph::Graph& g, int ranks) const {
  std::string s;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const bool chosen = std::find(cuts.begin(), cuts.end(), i) != cuts.end();
    s += fmt::format("  {} cut {}: before {}, {:.1f}% of the cost before it\n", chosen ? "*" : " ",
                     i, g.node(order[candidates[i].pos]).label(),
                     100.0 * candidates[i].cost_before / std::max(total_cost, 1.0));
  }
  const auto p = static_cast<std::size_t>(std::max(ranks, 1));
  for (std::size_t k = 0; k < stage_cost.size(); ++k)
    s += fmt::format("  {}: {:.1f}% of the cost\n",
                     stage_cost.size() > p
                         ? fmt::format("piece {} (stage {}, chunk {})", k, k % p, k / p)
                         : fmt::format("stage {}", k),
                     100.0 * stage_cost[k] / std::max(total_cost, 1.0));
  return s;
}

Result<PipelinePlan> plan_pipeline(const graph::Graph& g, const std::vector<graph::Value>& outputs,
                                   int stages, const std::vector<std::size_t>& cuts,
                                   const Interleave& il) {
  if (stages < 1) return invalid_argument("pipeline: {} stages", stages);
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> sorted, g.topo_order());
  const std::vector<int> all = beside_readers(g, sorted);
  std::vector<bool> needed(static_cast<std::size_t>(g.num_nodes()), false);
  for (const auto& v : outputs) needed[static_cast<std::size_t>(v.node)] = true;
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (needed[static_cast<std::size_t>(*it)])
      for (const auto& v : g.node(*it).inputs) needed[static_cast<std::size_t>(v.node)] = true;
  // Nodes computed from inputs and constants only (the labels' reshape)
  // are not placed: each stage that reads one computes it (StageCopier).
  PipelinePlan p;
  for (int id : all)
    if (needed[static_cast<std::size_t>(id)] && g.node(id).op != "input" &&
        !from_inputs_only(g, id))
      p.order.push_back(id);
  // Last use (position) of every activation; a cut before position i is one
  // where exactly one activation made before i is used at or after i.
  std::map<graph::Value, std::size_t> last_use;
  std::map<int, std::size_t> pos_of;
  for (std::size_t i = 0; i < p.order.size(); ++i) pos_of[p.order[i]] = i;
  for (std::size_t i = 0; i < p.order.size(); ++i)
    for (const auto& v : g.node(p.order[i]).inputs)
      if (pos_of.count(v.node)) last_use[v] = std::max(last_use[v], i);
  std::set<graph::Value> live;
  double cost = 0;
  int params = 0;  // nodes that read a parameter
  std::vector<double> before;
  std::vector<int> params_before;
  for (std::size_t i = 0; i < p.order.size(); ++i) {
    if (i > 0 && live.size() == 1 && g.type(*live.begin()).dtype == DType::kF32) {
      p.candidates.push_back({i, *live.begin(), cost});
      before.push_back(cost);
      params_before.push_back(params);
    }
    const graph::Node& n = g.node(p.order[i]);
    cost += node_cost(g, n);
    params += std::any_of(n.inputs.begin(), n.inputs.end(), [&](const graph::Value& v) {
      return g.node(v.node).op == "input" && g.node(v.node).name.starts_with("param/");
    });
    for (const auto& v : n.inputs)
      if (live.count(v) && last_use[v] == i) live.erase(v);
    for (std::size_t o = 0; o < n.outputs.size(); ++o) {
      const graph::Value v{n.id, static_cast<int>(o)};
      if (last_use.count(v)) live.insert(v);
    }
  }
  p.total_cost = cost;
  if (static_cast<int>(p.candidates.size()) < stages - 1)
    return invalid_argument(
        "pipeline: {} stages need {} cuts; the model has {} places where one activation "
        "crosses between layers",
        stages, stages - 1, p.candidates.size());
  if (!cuts.empty()) {
    if (static_cast<int>(cuts.size()) != stages - 1)
      return invalid_argument("pipeline: {} cuts given for {} stages (need {})", cuts.size(),
                              stages, stages - 1);
    for (std::size_t k = 0; k < cuts.size(); ++k)
      if (cuts[k] >= p.candidates.size() || (k > 0 && cuts[k] <= cuts[k - 1]))
        return invalid_argument(
            "pipeline: cuts must be increasing indices below {} (the model's cut places), got "
            "{}",
            p.candidates.size(), fmt::join(cuts, ","));
    p.cuts = cuts;
  } else if (stages > 1) {
    p.cuts = balance(before, cost, stages);
    if (il.ranks > 1 && il.ranks < stages)
      p.cuts = RankBalance(before, cost, params_before, params, stages, il).solve(p.cuts);
  }
  for (int s = 0; s < stages; ++s) {
    const auto [first, last] = p.range(s);
    const double a =
        first == 0 ? 0 : p.candidates[p.cuts[static_cast<std::size_t>(s) - 1]].cost_before;
    const double b = last == p.order.size()
                         ? cost
                         : p.candidates[p.cuts[static_cast<std::size_t>(s)]].cost_before;
    p.stage_cost.push_back(b - a);
  }
  return p;
}

Result<std::vector<std::vector<std::string>>> stage_params(const graph::Graph& g,
                                                           const PipelinePlan& plan) {
  const int stages = static_cast<int>(plan.cuts.size()) + 1;
  std::vector<std::vector<std::string>> out(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    const auto [first, last] = plan.range(s);
    std::set<std::string> seen;
    for (std::size_t i = first; i < last; ++i)
      for (const auto& v : g.node(plan.order[i]).inputs) {
        const graph::Node& in = g.node(v.node);
        if (in.op != "input" || !in.name.starts_with("param/")) continue;
        const std::string name = in.name.substr(6);
        if (seen.insert(name).second) out[static_cast<std::size_t>(s)].push_back(name);
      }
  }
  for (int s = 0; s < stages; ++s)
    if (out[static_cast<std::size_t>(s)].empty())
      return invalid_argument("pipeline: stage {} of {} holds no parameter; use fewer stages", s,
                              stages);
  return out;
}

Result<Schedule> parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::kGPipe;
  if (name == "1f1b") return Schedule::k1F1B;
  return invalid_argument("pipeline schedule '{}' is not gpipe or 1f1b", name);
}

std::vector<std::pair<int, bool>> schedule_order(Schedule s, int stage, int stages, int micro) {
  std::vector<std::pair<int, bool>> out;
  if (s == Schedule::kGPipe) {
    for (int i = 0; i < micro; ++i) out.emplace_back(i, true);
    for (int i = 0; i < micro; ++i) out.emplace_back(i, false);
    return out;
  }
  const int warm = std::min(stages - stage - 1, micro);
  for (int i = 0; i < warm; ++i) out.emplace_back(i, true);
  for (int i = 0; i < micro - warm; ++i) {
    out.emplace_back(warm + i, true);
    out.emplace_back(i, false);
  }
  for (int i = micro - warm; i < micro; ++i) out.emplace_back(i, false);
  return out;
}

std::vector<Work> stage_work(Schedule s, int stage, int stages, int micro, int chunks) {
  std::vector<Work> out;
  if (chunks <= 1) {
    for (auto [i, fwd] : schedule_order(s, stage, stages, micro)) out.push_back({0, i, fwd});
    return out;
  }
  // The k-th forward (backward) of this rank, in groups of `stages`
  // micro-batches per chunk; backwards take the chunks from the last.
  const int group = stages * chunks, total = micro * chunks;
  auto work = [&](int k, bool fwd) {
    const int c = (k % group) / stages;
    return Work{fwd ? c : chunks - 1 - c, (k / group) * stages + k % stages, fwd};
  };
  int warm = total;
  if (s == Schedule::k1F1B && micro != stages)
    warm = std::min(total, 2 * (stages - stage - 1) + (chunks - 1) * stages);
  for (int k = 0; k < warm; ++k) out.push_back(work(k, true));
  for (int k = 0; k < total - warm; ++k) {
    out.push_back(work(warm + k, true));
    out.push_back(work(k, false));
  }
  for (int k = total - warm; k < total; ++k) out.push_back(work(k, false));
  return out;
}

}  // namespace shoal::mp
