// Graph passes the CPU backend runs before it makes kernels (compile(),
// cpu_backend.cc): constant folding, by running the CPU kernels on the
// constants, and ReLU fused into the linear or convolution before it.
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
    if ((p.op != "linear" && p.op != "conv2d") || p.attrs.has("activation") || uses[v] != 1)
      continue;
    p.attrs.set("activation", std::string("relu"));
    r.alive = false;
    g.replace_all_uses(Value{id, 0}, v);
    ++fused;
  }
  return fused;
}

}  // namespace shoal::runtime
