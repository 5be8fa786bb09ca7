#include <algorithm>
#include <set>

#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/graph/passes.h"

namespace shoal::graph {

Result<std::vector<Value>> autodiff(Graph& g, Value loss, const std::vector<Value>& wrt) {
  if (!loss.valid() || loss.node >= g.num_nodes())
    return invalid_argument("autodiff: loss is not a value of this graph");
  const TensorType lt = g.type(loss);
  if (!is_floating(lt.dtype))
    return invalid_argument("autodiff: loss must be floating, got {}", lt.str());
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> order, g.topo_order());

  // Nodes on a path from some wrt to loss.
  std::set<int> from_wrt;
  for (const Value& w : wrt) from_wrt.insert(w.node);
  std::vector<bool> fwd(static_cast<std::size_t>(g.num_nodes()), false);
  for (int id : order) {
    if (from_wrt.count(id)) fwd[id] = true;
    for (const Value& v : g.node(id).inputs)
      if (fwd[v.node]) fwd[id] = true;
  }
  std::vector<bool> back(static_cast<std::size_t>(g.num_nodes()), false);
  back[loss.node] = true;
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (back[*it])
      for (const Value& v : g.node(*it).inputs) back[v.node] = true;

  Builder b(g);
  std::map<Value, Value> grads;
  grads[loss] = b.constant(Tensor::full(lt.shape, lt.dtype, 1.0));
  auto accumulate = [&](Value v, Value gv) {
    auto it = grads.find(v);
    if (it == grads.end())
      grads[v] = gv;
    else
      it->second = b.add(it->second, gv);
  };

  // Only nodes in the original graph are differentiated.
  std::vector<int> rev;
  for (int id : order)
    if (fwd[id] && back[id]) rev.push_back(id);
  std::reverse(rev.begin(), rev.end());
  for (int id : rev) {
    Node node = g.node(id);  // copy: the graph grows below
    if (node.op == "input" || node.op == "constant") continue;
    std::vector<Value> outs, dys;
    bool any = false;
    for (std::size_t i = 0; i < node.outputs.size(); ++i) {
      Value o{id, static_cast<int>(i)};
      outs.push_back(o);
      auto it = grads.find(o);
      dys.push_back(it == grads.end() ? Value{} : it->second);
      any = any || it != grads.end();
    }
    if (!any) continue;
    bool needs = false;
    for (const Value& v : node.inputs)
      needs = needs || (fwd[v.node] && is_floating(g.type(v).dtype));
    if (!needs) continue;
    const OpDef* def = OpRegistry::global().find(node.op);
    if (def == nullptr || !def->grad)
      return invalid_argument("autodiff: {} has no gradient rule", node.label());
    if (!dys[0].valid()) {
      // Multi-output ops take their first output's gradient as zeros when
      // only a later output is used.
      dys[0] = b.zeros(node.outputs[0]);
    }
    GradInputs gi{b, node, outs, dys};
    std::vector<Value> in_grads = def->grad(gi);
    SHOAL_RETURN_IF_ERROR(b.status().with_context(fmt::format("autodiff of {}", node.label())));
    for (std::size_t i = 0; i < node.inputs.size() && i < in_grads.size(); ++i) {
      Value x = node.inputs[i];
      if (!in_grads[i].valid() || !fwd[x.node]) continue;
      if (g.type(in_grads[i]) != g.type(x))
        return internal_error("autodiff: gradient of {} input {} is {} but the input is {}",
                              node.label(), i, g.type(in_grads[i]).str(), g.type(x).str());
      accumulate(x, in_grads[i]);
    }
    SHOAL_RETURN_IF_ERROR(b.status());
  }
  std::vector<Value> out;
  for (const Value& w : wrt) {
    auto it = grads.find(w);
    out.push_back(it != grads.end() ? it->second : b.zeros(g.type(w)));
  }
  SHOAL_RETURN_IF_ERROR(b.status());
  return out;
}

}  // namespace shoal::graph
