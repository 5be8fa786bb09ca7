// Activation recomputation (graph/passes.h): attention's softmax region
// (selective), or all but the norm layers' inputs (full), computed again
// for the backward.
#include <algorithm>
#include <map>
#include <set>

#include "shoal/graph/passes.h"

namespace shoal::graph {
namespace {

bool is_elementwise(const std::string& op) {
  return op == "add" || op == "mul" || op == "sub" || op == "div" || op == "where";
}

// Alive consumers of each node's outputs, and whether a graph output reads it.
struct Uses {
  std::map<int, std::vector<int>> users;  // node -> consuming nodes
  std::set<int> outputs;
  explicit Uses(const Graph& g) {
    for (const Node& n : g.nodes())
      if (n.alive)
        for (const Value& v : n.inputs) users[v.node].push_back(n.id);
    for (const Value& v : g.outputs()) outputs.insert(v.node);
  }
};

// The region ending at forward softmax `sm`: back through elementwise
// nodes to the product feeding them, each used only by the next region
// node. Empty when the softmax is not fed that way.
std::set<int> region_of(const Graph& g, const Uses& u, int sm, int forward_end) {
  std::set<int> region = {sm};
  int at = sm;
  for (int depth = 0; depth < 8; ++depth) {  // scale, mask, bias: a few steps
    int next = -1;
    for (const Value& v : g.node(at).inputs) {
      const Node& p = g.node(v.node);
      if (p.id >= forward_end || u.outputs.count(p.id) != 0) continue;
      const auto it = u.users.find(p.id);
      if (it == u.users.end() || it->second.size() != 1) continue;
      if (p.op == "matmul" || is_elementwise(p.op)) {
        next = p.id;
        break;
      }
    }
    if (next < 0) return {};
    region.insert(next);
    if (g.node(next).op == "matmul") return region;
    at = next;
  }
  return {};
}

// Copies value v's node once, and first whatever it reads that `keep`
// does not hold (inputs and constants are always read as they are). The
// copies go in schedule slot 1: after any ready node of the step.
template <typename Keep>
Result<Value> copy_of(Graph& g, Value v, const Keep& keep, std::map<int, int>& copies, int* count) {
  const Node& src = g.node(v.node);
  if (keep(v.node) || src.op == "input" || src.op == "constant") return v;
  if (auto it = copies.find(v.node); it != copies.end()) return Value{it->second, v.index};
  const Node n = src;  // a copy: add_node() may move the nodes
  std::vector<Value> inputs = n.inputs;
  for (Value& in : inputs) {
    SHOAL_ASSIGN_OR_RETURN(in, copy_of(g, in, keep, copies, count));
  }
  SHOAL_ASSIGN_OR_RETURN(std::vector<Value> outs,
                         g.add_node(n.op, inputs, n.attrs, n.name + "/recompute"));
  g.mutable_node(outs[0].node).slot = n.slot + 1;
  copies[v.node] = outs[0].node;
  ++*count;
  return Value{outs[0].node, v.index};
}

// The backward's readers of `from` (nodes from forward_end on) read `to`.
void redirect(Graph& g, const Uses& u, int forward_end, Value from, Value to) {
  const auto it = u.users.find(from.node);
  if (it == u.users.end()) return;
  for (int user : it->second) {
    if (user < forward_end) continue;
    for (Value& v : g.mutable_node(user).inputs)
      if (v == from) v = to;
  }
}

}  // namespace

Result<RecomputeReport> recompute_attention(Graph& g, int forward_end) {
  RecomputeReport r;
  const Uses u(g);
  std::vector<std::pair<int, std::set<int>>> regions;  // softmax, its region
  for (int id = 0; id < forward_end && id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (!n.alive || n.op != "softmax") continue;
    std::set<int> region = region_of(g, u, id, forward_end);
    if (!region.empty()) regions.emplace_back(id, std::move(region));
  }
  // Last layer first: its copy gets the lowest id, and runs first.
  for (auto it = regions.rbegin(); it != regions.rend(); ++it) {
    const Value sm{it->first, 0};
    const std::set<int>& region = it->second;
    auto outside = [&](int id) { return region.count(id) == 0; };
    std::map<int, int> copies;
    SHOAL_ASSIGN_OR_RETURN(Value c, copy_of(g, sm, outside, copies, &r.nodes));
    redirect(g, u, forward_end, sm, c);
    ++r.regions;
  }
  return r;
}

Result<RecomputeReport> recompute_full(Graph& g, int forward_end) {
  RecomputeReport r;
  const Uses u(g);
  std::set<int> kept;  // nodes whose values the backward keeps reading
  for (int id = 0; id < forward_end && id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.alive && (n.op == "layer_norm" || n.op == "batch_norm")) kept.insert(n.inputs[0].node);
    if (n.alive && u.outputs.count(id) != 0) kept.insert(id);  // the loss, the logits
  }
  // Forward nodes the backward reads, last first: the last layer's copies
  // get the lowest ids, so they run first.
  std::vector<int> read;
  for (int id = std::min(forward_end, g.num_nodes()) - 1; id >= 0; --id) {
    const Node& n = g.node(id);
    if (!n.alive || kept.count(id) != 0 || n.op == "input" || n.op == "constant") continue;
    const auto it = u.users.find(id);
    if (it == u.users.end()) continue;
    if (std::any_of(it->second.begin(), it->second.end(), [&](int x) { return x >= forward_end; }))
      read.push_back(id);
  }
  std::map<int, int> copies;
  auto keep = [&](int id) { return kept.count(id) != 0; };
  for (int id : read) {
    const int outputs = static_cast<int>(g.node(id).outputs.size());
    for (int k = 0; k < outputs; ++k) {
      SHOAL_ASSIGN_OR_RETURN(Value c, copy_of(g, Value{id, k}, keep, copies, &r.nodes));
      redirect(g, u, forward_end, Value{id, k}, c);
    }
    ++r.regions;
  }
  return r;
}

}  // namespace shoal::graph
