// Graph passes the CPU backend runs before it makes kernels (compile(),
// cpu_backend.cc): constant folding, by running the CPU kernels on the
// constants, ReLU fused into the linear, convolution or batch norm before
// it, a residual add fused into the layer norm after it, sums of
// slice_scatters made one op, and a pooled ReLU's gradient one pass.
#include <algorithm>
#include <initializer_list>

#include "runtime/cpu/kernels_internal.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/backend.h"

namespace shoal::runtime {

using graph::Graph;
using graph::Node;
using graph::Value;

Result<int> constant_fold(Graph& g) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> order, g.topo_order());
  int folded = 0;
  for (int id : order) {
    Node& n = g.mutable_node(id);
    if (n.op == "input" || n.op == "constant" || n.outputs.size() != 1 || n.inputs.empty())
      continue;
    const graph::OpDef* def = graph::OpRegistry::global().find(n.op);
    if (def == nullptr || def->random) continue;
    bool all_const = true;
    for (const Value& v : n.inputs) all_const = all_const && g.node(v.node).op == "constant";
    if (!all_const) continue;
    const KernelFactory* f = KernelRegistry::cpu().find(n.op);
    if (f == nullptr) continue;
    std::vector<graph::TensorType> in_types;
    std::vector<Tensor> ins;
    for (const Value& v : n.inputs) {
      in_types.push_back(g.type(v));
      ins.push_back(g.node(v.node).constant);
    }
    SHOAL_ASSIGN_OR_RETURN(auto k, make_kernel(*f, n, in_types));
    if (k->is_async()) continue;
    std::vector<Tensor> outs = {Tensor::empty(n.outputs[0].shape, n.outputs[0].dtype)};
    Status st = run_kernel(*k, KernelContext{n, 0}, ins, outs);
    if (!st.ok()) return st.with_context(fmt::format("constant folding {}", n.label()));
    n.op = "constant";
    n.inputs.clear();
    n.attrs = {};
    n.constant = outs[0];
    ++folded;
  }
  return folded;
}

int fuse_activations(Graph& g) {
  auto order = g.topo_order();
  if (!order.ok()) return 0;
  auto uses = g.use_counts();
  int fused = 0;
  for (int id : *order) {
    Node& r = g.mutable_node(id);
    if (!r.alive || r.op != "relu") continue;
    Value v = r.inputs[0];
    Node& p = g.mutable_node(v.node);
    const bool producer = p.op == "linear" || p.op == "conv2d" || p.op == "batch_norm";
    if (!producer || v.index != 0 || p.attrs.has("activation") || uses[v] != 1) continue;
    // A ReLU that writes bf16 (--precision bf16): the producer writes the
    // ReLU'd result in bf16 (a bf16 linear's or convolution's dst, batch
    // norm's dst); where the producer cannot (an f32 product), the ReLU stays.
    const bool bf16 = r.attrs.get_string_or("dst", "") == "bf16";
    const graph::Attrs before = p.attrs;
    p.attrs.set("activation", std::string("relu"));
    if (bf16) {
      p.attrs.set("dst", std::string("bf16"));
      if (!g.reinfer(p.id).ok() || p.outputs[0].dtype != DType::kBF16) {
        p.attrs = before;  // this producer cannot write bf16: the ReLU stays
        (void)g.reinfer(p.id);
        continue;
      }
    }
    r.alive = false;
    g.replace_all_uses(Value{id, 0}, v);
    ++fused;
  }
  return fused;
}

namespace {

// Whether any of the nodes `to` depends on node `from` (a path of alive
// edges from -> to).
bool depends_on(const Graph& g, std::initializer_list<int> to, int from) {
  std::vector<std::vector<int>> users(static_cast<std::size_t>(g.num_nodes()));
  for (const Node& n : g.nodes())
    if (n.alive)
      for (const Value& v : n.inputs) users[static_cast<std::size_t>(v.node)].push_back(n.id);
  std::vector<char> seen(users.size(), 0);
  std::vector<int> stack = {from};
  while (!stack.empty()) {
    const int id = stack.back();
    stack.pop_back();
    if (std::find(to.begin(), to.end(), id) != to.end()) return true;
    for (int u : users[static_cast<std::size_t>(id)])
      if (!seen[static_cast<std::size_t>(u)]) {
        seen[static_cast<std::size_t>(u)] = 1;
        stack.push_back(u);
      }
  }
  return false;
}

// An add of two f32 operands of its own shape (no broadcast, no dst).
bool plain_add(const Graph& g, const Node& n) {
  if (!n.alive || n.op != "add" || n.inputs.size() != 2 || n.outputs.size() != 1) return false;
  const graph::TensorType& t = n.outputs[0];
  return t.dtype == DType::kF32 && g.type(n.inputs[0]) == t && g.type(n.inputs[1]) == t;
}

// s = add(a, b); y = layer_norm(s, gamma, beta) -> (y, s) = add_layer_norm(...).
bool fuse_forward(Graph& g, int id) {
  const Node& l = g.node(id);
  if (l.op != "layer_norm" || l.inputs.size() != 3) return false;
  const int add = l.inputs[0].node;
  if (!plain_add(g, g.node(add)) || depends_on(g, {l.inputs[1].node, l.inputs[2].node}, add))
    return false;
  const Node& a = g.node(add);
  Node& n = g.mutable_node(id);
  n.op = "add_layer_norm";
  n.inputs = {a.inputs[0], a.inputs[1], n.inputs[1], n.inputs[2]};
  n.outputs.push_back(a.outputs[0]);
  g.mutable_node(add).alive = false;
  g.replace_all_uses(Value{add, 0}, Value{id, 1});
  return true;
}

// (dx, ...) = layer_norm_grad(s, gamma, dy); add(dx, r) -> layer_norm_grad(s, gamma, dy, r).
bool fuse_backward(Graph& g, int id, const std::map<Value, int>& uses) {
  const Node& l = g.node(id);
  const Value dx{id, 0};
  if (l.op != "layer_norm_grad" || l.inputs.size() != 3 || l.outputs[0].dtype != DType::kF32)
    return false;
  auto u = uses.find(dx);
  if (u == uses.end() || u->second != 1) return false;
  for (const Node& r : g.nodes()) {
    if (!plain_add(g, r) || (r.inputs[0] != dx && r.inputs[1] != dx)) continue;
    const Value res = r.inputs[0] == dx ? r.inputs[1] : r.inputs[0];
    if (res == dx || g.type(res) != l.outputs[0] || depends_on(g, {res.node}, id)) return false;
    const int sum = r.id;
    g.mutable_node(id).inputs.push_back(res);
    g.mutable_node(sum).alive = false;
    g.replace_all_uses(Value{sum, 0}, dx);
    return true;
  }
  return false;  // dx's one use is a graph output
}

}  // namespace

int fuse_residual_norms(Graph& g) {
  int fused = 0;
  for (int id = 0; id < g.num_nodes(); ++id)
    if (g.node(id).alive && fuse_forward(g, id)) ++fused;
  const auto uses = g.use_counts();
  for (int id = 0; id < g.num_nodes(); ++id)
    if (g.node(id).alive && fuse_backward(g, id, uses)) ++fused;
  return fused;
}

namespace {

// The axis a slice_scatter or slice_scatter_sum places along, from 0.
std::int64_t scatter_axis(const Node& n) {
  const std::int64_t ax = n.attrs.get_int_or("axis", 0);
  return ax < 0 ? ax + std::ssize(n.outputs[0].shape) : ax;
}

// A slice_scatter or slice_scatter_sum whose result has one reader.
bool scatter_operand(const Graph& g, Value v, const std::map<Value, int>& uses) {
  const Node& n = g.node(v.node);
  if (n.op != "slice_scatter" && n.op != "slice_scatter_sum") return false;
  auto u = uses.find(v);
  return u != uses.end() && u->second == 1;
}

// The pieces of the scatters an add tree sums: each one's input and slice.
struct Pieces {
  std::vector<Value> inputs;
  std::vector<std::int64_t> starts, ends, steps;
  void add(const Node& n) {
    inputs.insert(inputs.end(), n.inputs.begin(), n.inputs.end());
    if (n.op == "slice_scatter_sum") {
      for (auto [name, to] : {std::pair{"starts", &starts}, {"ends", &ends}, {"steps", &steps}}) {
        const auto v = n.attrs.get_ints_or(name, {});
        to->insert(to->end(), v.begin(), v.end());
      }
      return;
    }
    starts.push_back(n.attrs.get_int_or("start", 0));
    ends.push_back(
        n.attrs.get_int_or("end", n.outputs[0].shape[static_cast<std::size_t>(scatter_axis(n))]));
    steps.push_back(n.attrs.get_int_or("step", 1));
  }
};

}  // namespace

int fuse_slice_scatters(Graph& g) {
  auto order = g.topo_order();
  if (!order.ok()) return 0;
  const auto uses = g.use_counts();
  int fused = 0;
  for (int id : *order) {
    const Node& a = g.node(id);
    if (!a.alive || a.op != "add" || a.inputs.size() != 2 || a.attrs.has("dst")) continue;
    const graph::TensorType& t = a.outputs[0];
    if ((t.dtype != DType::kF32 && t.dtype != DType::kF64) || a.inputs[0] == a.inputs[1] ||
        g.type(a.inputs[0]) != t || g.type(a.inputs[1]) != t)
      continue;
    if (!scatter_operand(g, a.inputs[0], uses) || !scatter_operand(g, a.inputs[1], uses)) continue;
    const Node& l = g.node(a.inputs[0].node);
    const Node& r = g.node(a.inputs[1].node);
    if (scatter_axis(l) != scatter_axis(r)) continue;
    Pieces p;
    p.add(l);
    p.add(r);
    const std::int64_t axis = scatter_axis(l);
    const int left = l.id, right = r.id;
    const Node before = a;
    Node& n = g.mutable_node(id);
    n.op = "slice_scatter_sum";
    n.inputs = p.inputs;
    n.attrs = {};
    n.attrs.set("axis", axis);
    n.attrs.set("shape", t.shape);
    n.attrs.set("starts", p.starts);
    n.attrs.set("ends", p.ends);
    n.attrs.set("steps", p.steps);
    if (!g.reinfer(id).ok()) {  // pieces the op cannot take: the add stays
      g.mutable_node(id) = before;
      continue;
    }
    g.mutable_node(left).alive = false;
    g.mutable_node(right).alive = false;
    ++fused;
  }
  return fused;
}

int fuse_pool_relu_grads(Graph& g) {
  const auto uses = g.use_counts();
  int fused = 0;
  for (int id = 0; id < g.num_nodes(); ++id) {
    const Node& r = g.node(id);
    if (!r.alive || r.op != "relu_grad" || r.inputs.size() != 2 || !r.attrs.all().empty()) continue;
    const Value pooled = r.inputs[0];
    const Node& m = g.node(pooled.node);
    auto u = uses.find(pooled);
    if (m.op != "max_pool2d_grad" || m.attrs.has("relu") || m.inputs[0] != r.inputs[1] ||
        u == uses.end() || u->second != 1 || m.outputs[0] != r.outputs[0])
      continue;
    g.mutable_node(pooled.node).attrs.set("relu", std::int64_t{1});
    g.mutable_node(id).alive = false;
    g.replace_all_uses(Value{id, 0}, pooled);
    ++fused;
  }
  return fused;
}

}  // namespace shoal::runtime
