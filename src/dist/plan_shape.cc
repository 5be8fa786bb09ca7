// What each split leaves one rank of a model, read from its forward graph
// (dist/plan.h): tensor parallelism's rewrite run on a copy, the
// pipeline's plan of cuts. Nothing here runs a kernel.
#include <algorithm>

#include "dist/plan_internal.h"
#include "shoal/graph/passes.h"
#include "shoal/mp/pipeline.h"
#include "shoal/mp/tensor_parallel.h"

namespace shoal::dist {
namespace {

double bytes_of(const graph::TensorType& t) {
  return static_cast<double>(num_elements(t.shape) *
                             static_cast<std::int64_t>(dtype_size(t.dtype)));
}

// Products' FLOPs, other ops' output elements, parameter bytes, and the
// bytes of each tensor-parallel collective: all-reduces (tp_copy's in the
// backward, tp_allreduce's in the forward), sequence parallelism's
// reduce-scatters and all-gathers (the whole tensor's bytes), and its sums
// of parameter gradients (a bucket's outputs).
struct Sums {
  double flops = 0, elements = 0, params = 0;
  std::vector<double> collectives, shards, param_sums;
};

Sums sums(const graph::Graph& g) {
  Sums s;
  for (const graph::Node& n : g.nodes()) {
    if (!n.alive) continue;
    if (n.op == "input") {
      if (n.name.starts_with("param/")) s.params += bytes_of(n.outputs[0]);
      continue;
    }
    if (n.op == "constant") continue;
    if (n.op == "tp_copy" || n.op == "tp_allreduce") {
      const bool param = n.op == "tp_copy" && g.node(n.inputs[0].node).op == "input" &&
                         g.node(n.inputs[0].node).name.starts_with("param/");
      (param ? s.param_sums : s.collectives).push_back(bytes_of(n.outputs[0]));
      continue;
    }
    if (n.op == "tp_copy_bucket") {
      for (const auto& t : n.outputs) s.param_sums.push_back(bytes_of(t));
      continue;
    }
    if (n.op == "reduce_scatter") {  // the whole input's bytes
      s.shards.push_back(bytes_of(g.type(n.inputs[0])));
      continue;
    }
    if (n.op == "allgather") {
      s.shards.push_back(bytes_of(n.outputs[0]));
      continue;
    }
    if (const double f = graph::node_flops(g, n); f > 0) {
      s.flops += f;
      continue;
    }
    for (const auto& t : n.outputs) s.elements += static_cast<double>(num_elements(t.shape));
  }
  return s;
}

double ratio(double a, double b) { return b > 0 ? a / b : 1.0; }

// The arena the memory planner gives the forward and its gradients (the
// loss differentiated with respect to every parameter input), or 0.
double planned_arena(graph::Graph g) {
  graph::Value loss;
  std::vector<graph::Value> params;
  for (const graph::Node& n : g.nodes()) {
    if (!n.alive) continue;
    if (n.op.find("cross_entropy") != std::string::npos) loss = graph::Value{n.id, 0};
    if (n.op == "input" && n.name.starts_with("param/")) params.push_back({n.id, 0});
  }
  if (!loss.valid()) return 0;
  auto grads = graph::autodiff(g, loss, params);
  if (!grads.ok()) return 0;
  g.mark_output(loss);
  for (const graph::Value& v : *grads)
    if (v.valid()) g.mark_output(v);
  graph::eliminate_dead_code(g);
  auto order = g.topo_order();
  if (!order.ok()) return 0;
  return static_cast<double>(graph::plan_memory(g, *order).arena_bytes);
}

}  // namespace

std::int64_t forward_rows(const graph::Graph& g) {
  auto x = g.find_input("x");
  if (!x.ok() || g.type(*x).shape.empty()) return 1;
  return std::max<std::int64_t>(g.type(*x).shape[0], 1);
}

Result<mp::TpPlan> tp_plan(const graph::Graph& g, int T) {
  mp::register_tensor_parallel_ops();
  SHOAL_ASSIGN_OR_RETURN(mp::TpPlan plan, mp::plan_tensor_parallel(g, T));
  if (plan.regions.empty() && plan.tables.empty() && plan.heads.empty())
    return invalid_argument("nothing in the model splits across tensor-parallel ranks");
  return plan;
}

TpShape tp_shape(const graph::Graph& g, int T, std::int64_t comm_id, bool sequence) {
  TpShape s;
  auto plan = tp_plan(g, T);
  if (!plan.ok()) {
    s.refused = plan.status().message();
    return s;
  }
  graph::Graph split = g;
  if (Status st = mp::shard_tensor_parallel(split, *plan, comm_id); !st.ok()) {
    s.refused = st.message();
    return s;
  }
  if (sequence) {
    // As the trainer rewrites a step of one micro-batch (its parameters'
    // gradient sums in one bucket).
    std::vector<std::string> why;
    auto regions = mp::shard_sequence(split, comm_id, &why, true);
    if (!regions.ok()) {
      s.refused = regions.status().message();
      return s;
    }
    if (*regions == 0) {
      s.refused = why.empty() ? "no row-wise ops between the tensor-parallel regions"
                              : "no region of row-wise ops splits: " + why.front();
      return s;
    }
  }
  const Sums whole = sums(g), mine = sums(split);
  s.product_ratio = ratio(mine.flops, whole.flops);
  s.other_ratio = ratio(mine.elements, whole.elements);
  s.param_ratio = ratio(mine.params, whole.params);
  // The step's arena (activations and gradients) as the memory planner
  // lays out each graph's forward and backward.
  const double arena_whole = planned_arena(g), arena_mine = planned_arena(split);
  if (arena_whole > 0 && arena_mine > 0) s.arena_ratio = arena_mine / arena_whole;
  const double rows = static_cast<double>(forward_rows(g));
  for (double b : mine.collectives) s.collective_bytes_per_row.push_back(b / rows);
  for (double b : mine.shards) s.shard_bytes_per_row.push_back(b / rows);
  s.param_sum_bytes = mine.param_sums;
  return s;
}

PpShape pp_shape(const graph::Graph& g, int P, int chunks) {
  PpShape s;
  for (const graph::Node& n : g.nodes())
    if (n.alive && n.op == "input" && n.name.starts_with("buf/")) {
      // mp::attach_pipeline refuses such a model (its stages do not carry them).
      s.refused = fmt::format(
          "the model keeps running statistics ('{}', batch norm), which a pipeline's stages do "
          "not carry yet",
          n.name.substr(4));
      return s;
    }
  graph::Value loss;
  for (const graph::Node& n : g.nodes())
    if (n.alive && n.op == "cross_entropy") loss = graph::Value{n.id, 0};
  if (!loss.valid()) {
    s.refused = "no cross-entropy loss in the forward graph";
    return s;
  }
  const graph::Value logits = g.node(loss.node).inputs[0];
  auto plan = mp::plan_pipeline(g, {loss, logits}, P * chunks);
  if (!plan.ok()) {
    s.refused = plan.status().message();
    return s;
  }
  // Piece k runs on rank k % P.
  auto by_rank = [P](const std::vector<double>& piece) {
    std::vector<double> rank(static_cast<std::size_t>(P), 0.0);
    for (std::size_t k = 0; k < piece.size(); ++k)
      rank[k % static_cast<std::size_t>(P)] += piece[k];
    return *std::max_element(rank.begin(), rank.end());
  };
  s.stage_share = ratio(by_rank(plan->stage_cost), plan->total_cost);
  const double rows = static_cast<double>(forward_rows(g));
  for (std::size_t cut : plan->cuts)
    s.boundary_bytes_per_row =
        std::max(s.boundary_bytes_per_row, bytes_of(g.type(plan->candidates[cut].value)) / rows);
  auto held = mp::stage_params(g, *plan);
  if (!held.ok()) {
    s.refused = held.status().message();
    return s;
  }
  std::map<std::string, double> size;
  double total = 0;
  for (const graph::Node& n : g.nodes())
    if (n.alive && n.op == "input" && n.name.starts_with("param/")) {
      size[n.name.substr(6)] = bytes_of(n.outputs[0]);
      total += bytes_of(n.outputs[0]);
    }
  std::vector<double> piece_bytes;
  for (const auto& stage : *held) {
    double b = 0;
    for (const auto& p : stage) b += size.count(p) ? size[p] : 0;
    piece_bytes.push_back(b);
  }
  s.param_share = ratio(by_rank(piece_bytes), total);
  return s;
}

}  // namespace shoal::dist
