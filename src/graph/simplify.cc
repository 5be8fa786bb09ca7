// Forward-graph simplifications that leave every value's contents as they
// were (passes.h).
#include <algorithm>
#include <set>

#include "shoal/graph/passes.h"

namespace shoal::graph {
namespace {

// Whether transposing by q puts back what transposing by p moved.
bool undoes(const std::vector<std::int64_t>& p, const std::vector<std::int64_t>& q) {
  if (p.size() != q.size()) return false;
  for (std::size_t i = 0; i < q.size(); ++i) {
    if (q[i] < 0 || q[i] >= static_cast<std::int64_t>(p.size())) return false;
    if (p[static_cast<std::size_t>(q[i])] != static_cast<std::int64_t>(i)) return false;
  }
  return true;
}

}  // namespace

bool elementwise(const std::string& op) {
  static const std::set<std::string> kOps = {
      "neg",       "exp",  "log",  "sqrt", "rsqrt",   "abs",  "relu",
      "step",      "sign", "tanh", "erf",  "sigmoid", "gelu", "gelu_grad",
      "relu_grad", "add",  "sub",  "mul",  "div",     "pow",  "equal"};
  return kOps.count(op) != 0;
}

namespace {

// Whether q undoes p, p and q both transposes or both reshapes: q's perm
// inverts p's, or q reshapes back to the shape p's input had.
bool undoes_node(const Graph& g, const Node& p, const Node& q) {
  if (p.op != q.op) return false;
  if (p.op == "transpose")
    return undoes(p.attrs.get_ints_or("perm", {}), q.attrs.get_ints_or("perm", {}));
  return p.op == "reshape" && q.outputs[0].shape == g.type(p.inputs[0]).shape;
}

}  // namespace

Result<int> cancel_shape_pairs(Graph& g, int first) {
  int done = 0;
  const int end = g.num_nodes();
  for (int id = std::max(first, 0); id < end; ++id) {
    const Node& q = g.node(id);
    if (!q.alive || (q.op != "transpose" && q.op != "reshape")) continue;
    const Node& f = g.node(q.inputs[0].node);
    if (f.alive && undoes_node(g, f, q)) {  // the pair with nothing between
      g.replace_all_uses(Value{id, 0}, f.inputs[0]);
      ++done;
      continue;
    }
    if (!f.alive || !elementwise(f.op) || f.inputs.size() != 1 || f.outputs.size() != 1) continue;
    const Node& p = g.node(f.inputs[0].node);
    if (!p.alive || !undoes_node(g, p, q)) continue;
    const std::string op = f.op, name = f.name;  // g.add may move the nodes
    const Attrs attrs = f.attrs;
    const Value x = p.inputs[0];
    SHOAL_ASSIGN_OR_RETURN(Value y, g.add(op, {x}, attrs, name.empty() ? name : name + "/direct"));
    g.replace_all_uses(Value{id, 0}, y);
    ++done;
  }
  return done;
}

}  // namespace shoal::graph
