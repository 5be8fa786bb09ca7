// Selective activation recomputation (graph/passes.h): attention's
// softmax region computed again for the backward.
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
std::vector<int> region_of(const Graph& g, const Uses& u, int sm, int forward_end) {
  std::vector<int> region = {sm};
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
    region.push_back(next);
    if (g.node(next).op == "matmul") {
      std::reverse(region.begin(), region.end());
      return region;
    }
    at = next;
  }
  return {};
}

}  // namespace

Result<RecomputeReport> recompute_attention(Graph& g, int forward_end) {
  RecomputeReport r;
  const Uses u(g);
  std::vector<std::vector<int>> regions;
  for (int id = 0; id < forward_end && id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (!n.alive || n.op != "softmax") continue;
    std::vector<int> region = region_of(g, u, id, forward_end);
    if (!region.empty()) regions.push_back(std::move(region));
  }
  // Last layer first: its copy gets the lowest id, and runs first.
  for (auto it = regions.rbegin(); it != regions.rend(); ++it) {
    const std::vector<int>& region = *it;
    const int sm = region.back();
    std::map<int, Value> copy;  // region node -> its copy's output
    for (int id : region) {
      const Node n = g.node(id);  // a copy: add() may move the nodes
      std::vector<Value> inputs = n.inputs;
      for (Value& v : inputs)
        if (auto c = copy.find(v.node); c != copy.end()) v = c->second;
      SHOAL_ASSIGN_OR_RETURN(Value c, g.add(n.op, inputs, n.attrs, n.name + "/recompute"));
      g.mutable_node(c.node).slot = n.slot + 1;  // after any ready node of the step
      copy[id] = c;
      ++r.nodes;
    }
    // The backward's readers of the softmax output read the copy.
    const Value from{sm, 0}, to = copy.at(sm);
    for (int user : u.users.count(sm) ? u.users.at(sm) : std::vector<int>{}) {
      if (user < forward_end) continue;
      for (Value& v : g.mutable_node(user).inputs)
        if (v == from) v = to;
    }
    ++r.regions;
  }
  return r;
}

namespace {

// Copies node `id` (and, first, whatever of its inputs is not kept) once.
Result<Value> copy_of(Graph& g, Value v, const std::set<int>& kept, std::map<int, int>& copies,
                      int* count) {
  const Node& src = g.node(v.node);
  if (kept.count(v.node) != 0 || src.op == "input" || src.op == "constant") return v;
  if (auto it = copies.find(v.node); it != copies.end()) return Value{it->second, v.index};
  const Node n = src;  // a copy: add_node() may move the nodes
  std::vector<Value> inputs = n.inputs;
  for (Value& in : inputs) {
    SHOAL_ASSIGN_OR_RETURN(in, copy_of(g, in, kept, copies, count));
  }
  SHOAL_ASSIGN_OR_RETURN(std::vector<Value> outs,
                         g.add_node(n.op, inputs, n.attrs, n.name + "/recompute"));
  g.mutable_node(outs[0].node).slot = n.slot + 1;
  copies[v.node] = outs[0].node;
  ++*count;
  return Value{outs[0].node, v.index};
}

}  // namespace

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
  for (int id : read) {
    const int outputs = static_cast<int>(g.node(id).outputs.size());
    for (int k = 0; k < outputs; ++k) {
      SHOAL_ASSIGN_OR_RETURN(Value c, copy_of(g, Value{id, k}, kept, copies, &r.nodes));
      for (int user : u.users.at(id)) {
        if (user < forward_end) continue;
        for (Value& v : g.mutable_node(user).inputs)
          if (v == Value{id, k}) v = c;
      }
    }
    ++r.regions;
  }
  return r;
}

}  // namespace shoal::graph
