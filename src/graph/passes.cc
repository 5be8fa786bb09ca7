#include "shoal/graph/passes.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "shoal/graph/op_registry.h"

namespace shoal::graph {

int eliminate_dead_code(Graph& g) {
  std::vector<bool> live(static_cast<std::size_t>(g.num_nodes()), false);
  std::vector<int> stack;
  for (const Value& v : g.outputs()) stack.push_back(v.node);
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (live[id]) continue;
    live[id] = true;
    for (const Value& v : g.node(id).inputs) stack.push_back(v.node);
  }
  int removed = 0;
  for (int id = 0; id < g.num_nodes(); ++id) {
    Node& n = g.mutable_node(id);
    // Inputs stay so feeds remain valid even when unused.
    if (n.alive && !live[id] && n.op != "input") {
      n.alive = false;
      ++removed;
    }
  }
  return removed;
}

Status verify(const Graph& g) {
  for (const Node& n : g.nodes()) {
    if (!n.alive || n.op == "input" || n.op == "constant") continue;
    auto r = g.infer_types(n);
    if (!r.ok()) return r.status().with_context("verify");
    if (*r != n.outputs) {
      std::string want, have;
      for (const auto& t : *r) want += t.str() + " ";
      for (const auto& t : n.outputs) have += t.str() + " ";
      return invalid_argument("verify: {}: stored output types {}differ from inferred {}",
                              n.label(), have, want);
    }
  }
  for (const Value& v : g.outputs())
    if (v.node < 0 || v.node >= g.num_nodes() || !g.node(v.node).alive)
      return invalid_argument("verify: graph output refers to missing or dead node {}", v.node);
  return g.topo_order().status();
}

MemoryPlan plan_memory(const Graph& g, const std::vector<int>& order,
                       const std::map<Value, int>& extend_until, std::size_t alignment,
                       const std::vector<Pack>& packs, const std::set<Value>& outside) {
  MemoryPlan plan;
  std::map<int, int> pos;
  for (std::size_t i = 0; i < order.size(); ++i) pos[order[i]] = static_cast<int>(i);
  const int end = static_cast<int>(order.size());
  struct Interval {
    Value v;
    int def, last;
    std::size_t bytes;
  };
  std::map<Value, Interval> iv;
  for (int id : order) {
    const Node& n = g.node(id);
    if (n.op == "input" || n.op == "constant") continue;
    for (std::size_t i = 0; i < n.outputs.size(); ++i) {
      Value v{id, static_cast<int>(i)};
      if (outside.count(v)) continue;
      std::size_t bytes = static_cast<std::size_t>(num_elements(n.outputs[i].shape)) *
                          dtype_size(n.outputs[i].dtype);
      bytes = (std::max<std::size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
      iv[v] = Interval{v, pos[id], pos[id], bytes};
    }
  }
  for (int id : order)
    for (const Value& v : g.node(id).inputs) {
      auto it = iv.find(v);
      if (it != iv.end()) it->second.last = std::max(it->second.last, pos[id]);
    }
  for (const Value& v : g.outputs()) {
    auto it = iv.find(v);
    if (it != iv.end()) it->second.last = end;
  }
  for (const auto& [v, p] : extend_until) {
    auto it = iv.find(v);
    if (it != iv.end()) it->second.last = std::max(it->second.last, p);
  }
  // A pack becomes one interval (under its first member's key) spanning its
  // members' and aliases' lifetimes; members and aliases get their offsets
  // within it after placement.
  struct Within {
    Value pack;
    std::size_t off;
  };
  std::map<Value, Within> within;
  for (const Pack& pk : packs) {
    if (pk.members.empty()) continue;
    Interval whole{pk.members[0], end, 0, 0};
    std::size_t off = 0;
    for (std::size_t i = 0; i < pk.members.size(); ++i) {
      const Value m = pk.members[i];
      const graph::TensorType& t = g.type(m);
      const std::size_t exact =
          static_cast<std::size_t>(num_elements(t.shape)) * dtype_size(t.dtype);
      const Interval& mi = iv.at(m);
      whole.def = std::min(whole.def, mi.def);
      whole.last = std::max(whole.last, mi.last);
      if (i < pk.aliases.size()) {
        const Interval& ai = iv.at(pk.aliases[i]);
        whole.last = std::max(whole.last, ai.last);
        within[pk.aliases[i]] = Within{pk.members[0], off};
        iv.erase(pk.aliases[i]);
      }
      within[m] = Within{pk.members[0], off};
      off += exact;
      iv.erase(m);
    }
    whole.bytes = (std::max<std::size_t>(off, 1) + alignment - 1) / alignment * alignment;
    iv[pk.members[0]] = whole;
  }
  // Greedy by size (largest first), each placed at the lowest offset that
  // does not collide with an already placed value whose lifetime overlaps.
  std::vector<Interval> items;
  for (const auto& [v, i] : iv) items.push_back(i);
  std::stable_sort(items.begin(), items.end(),
                   [](const Interval& a, const Interval& b) { return a.bytes > b.bytes; });
  struct Placed {
    std::size_t off, bytes;
    int def, last;
  };
  std::vector<Placed> placed;
  for (const Interval& it : items) {
    std::vector<std::pair<std::size_t, std::size_t>> busy;
    for (const Placed& p : placed)
      if (!(p.last < it.def || it.last < p.def)) busy.emplace_back(p.off, p.off + p.bytes);
    std::sort(busy.begin(), busy.end());
    std::size_t off = 0;
    for (const auto& [b, e] : busy) {
      if (off + it.bytes <= b) break;
      off = std::max(off, e);
    }
    placed.push_back({off, it.bytes, it.def, it.last});
    plan.offset[it.v] = off;
    plan.arena_bytes = std::max(plan.arena_bytes, off + it.bytes);
    plan.naive_bytes += it.bytes;
  }
  for (const auto& [v, w] : within) plan.offset[v] = plan.offset.at(w.pack) + w.off;
  return plan;
}

namespace {
nlohmann::json attr_json(const AttrValue& v) {
  return std::visit([](const auto& x) { return nlohmann::json(x); }, v);
}
}  // namespace

std::string to_json(const Graph& g) {
  nlohmann::json j;
  j["nodes"] = nlohmann::json::array();
  for (const Node& n : g.nodes()) {
    if (!n.alive) continue;
    nlohmann::json jn;
    jn["id"] = n.id;
    jn["op"] = n.op;
    if (!n.name.empty()) jn["name"] = n.name;
    for (const auto& [k, v] : n.attrs.all()) jn["attrs"][k] = attr_json(v);
    jn["inputs"] = nlohmann::json::array();
    for (const Value& v : n.inputs) jn["inputs"].push_back({v.node, v.index});
    jn["outputs"] = nlohmann::json::array();
    for (const TensorType& t : n.outputs)
      jn["outputs"].push_back({{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}});
    j["nodes"].push_back(jn);
  }
  j["outputs"] = nlohmann::json::array();
  for (const Value& v : g.outputs()) j["outputs"].push_back({v.node, v.index});
  return j.dump(1);
}

std::string to_dot(const Graph& g) {
  std::string out = "digraph shoal {\n  rankdir=TB;\n  node [shape=box, fontname=monospace];\n";
  for (const Node& n : g.nodes()) {
    if (!n.alive) continue;
    std::string types;
    for (const TensorType& t : n.outputs) types += "\\n" + t.str();
    std::string shape = n.op == "input"      ? ", shape=ellipse"
                        : n.op == "constant" ? ", shape=note"
                                             : "";
    out += fmt::format("  n{} [label=\"{}{}{}\"{}];\n", n.id, n.op,
                       n.name.empty() ? "" : " " + n.name, types, shape);
    for (const Value& v : n.inputs)
      out += fmt::format("  n{} -> n{}{};\n", v.node, n.id,
                         v.index ? fmt::format(" [label=\"{}\"]", v.index) : "");
  }
  return out + "}\n";
}

}  // namespace shoal::graph
