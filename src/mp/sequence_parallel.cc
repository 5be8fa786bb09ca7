// Sequence parallelism (Korthikanti et al. 2022, Megatron-LM's
// --sequence-parallel) over a tensor-parallel graph: the ops between a
// row-parallel output's sum and the next column-parallel input (bias and
// residual adds, layer norms, reshapes: work every tensor rank repeats on
// the whole batch otherwise) run on this rank's block of rows. Each such
// tp_allreduce becomes a reduce_scatter along the first axis (gradient:
// all-gather) and each tp_copy reading the rows an allgather (gradient:
// reduce-scatter): the same bytes on the wire, a 1/T share of the work.
// What those ops read from outside (biases, norm scales, the position
// table) passes a tp_copy, whose gradient sums the ranks' row shares.
#include <map>
#include <set>

#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/comm/communicator.h"
#include "shoal/mp/tensor_parallel.h"

namespace shoal::mp {
namespace {

using graph::Graph;
using graph::Node;
using graph::Value;

const std::set<std::string> kRowOps = {"add", "sub", "mul", "layer_norm", "reshape"};

struct Region {
  std::set<int> nodes;  // the sums (sources) and the row-wise ops they reach
  std::set<int> sources, copies;
  std::string refused;  // why the region cannot be split, or ""
};

// Everything the sum `s` reaches through row-wise ops, up to tp_copy.
Region flood(const Graph& g, const std::map<int, std::vector<int>>& users,
             const std::set<int>& outputs, int s, int size) {
  Region r;
  std::vector<int> todo = {s};
  r.nodes.insert(s);
  r.sources.insert(s);
  while (!todo.empty() && r.refused.empty()) {
    const int id = todo.back();
    todo.pop_back();
    const Shape& shape = g.node(id).outputs[0].shape;
    if (outputs.count(id))
      r.refused = fmt::format("{} is an output of the graph", g.node(id).label());
    else if (shape.empty() || shape[0] % size != 0)
      r.refused = fmt::format("{} has {} rows, not a multiple of {}", g.node(id).label(),
                              shape.empty() ? 0 : shape[0], size);
    auto u = users.find(id);
    if (u == users.end()) continue;
    for (int user : u->second) {
      const Node& n = g.node(user);
      if (n.op == "tp_copy") {
        r.copies.insert(user);
      } else if (n.op == "tp_allreduce" || !kRowOps.count(n.op) || n.outputs.size() != 1) {
        r.refused = fmt::format("{} reads {}", n.label(), g.node(id).label());
      } else if (r.nodes.insert(user).second) {
        todo.push_back(user);
      }
    }
  }
  return r;
}

// An operand from outside the region must broadcast over the rows: fewer
// dimensions than the region's value, or one row.
bool broadcasts(const Graph& g, Value v, const Shape& out) {
  const Shape& s = g.type(v).shape;
  return s.size() < out.size() || (!s.empty() && s[0] == 1);
}

// The candidate sums' regions, merged where they meet.
std::vector<Region> regions(const Graph& g, int size) {
  std::map<int, std::vector<int>> users;
  for (const Node& n : g.nodes())
    if (n.alive)
      for (const Value& v : n.inputs) users[v.node].push_back(n.id);
  std::set<int> outputs;
  for (const Value& v : g.outputs()) outputs.insert(v.node);
  std::vector<Region> out;
  for (const Node& n : g.nodes()) {
    if (!n.alive || n.op != "tp_allreduce") continue;
    // Read by nothing (whole logits the vocabulary-parallel loss does not
    // need): dead code, left for the compiler to drop.
    if (!users.count(n.id) && !outputs.count(n.id)) continue;
    bool seen = false;
    for (const Region& r : out) seen = seen || r.nodes.count(n.id);
    if (seen) continue;
    Region r = flood(g, users, outputs, n.id, size);
    // Merge every earlier region this one meets.
    for (auto it = out.begin(); it != out.end();) {
      bool meets = false;
      for (int id : it->nodes) meets = meets || r.nodes.count(id);
      if (!meets) {
        ++it;
        continue;
      }
      r.nodes.insert(it->nodes.begin(), it->nodes.end());
      r.sources.insert(it->sources.begin(), it->sources.end());
      r.copies.insert(it->copies.begin(), it->copies.end());
      if (r.refused.empty()) r.refused = it->refused;
      it = out.erase(it);
    }
    out.push_back(std::move(r));
  }
  for (Region& r : out) {
    for (int id : r.nodes) {
      const Node& n = g.node(id);
      if (r.sources.count(id)) continue;
      for (const Value& v : n.inputs)
        if (!r.nodes.count(v.node) && !broadcasts(g, v, n.outputs[0].shape) && r.refused.empty())
          r.refused = fmt::format("{} reads {} whole", n.label(), g.node(v.node).label());
    }
  }
  return out;
}

bool is_param(const Graph& g, Value v) {
  const Node& n = g.node(v.node);
  return n.op == "input" && n.name.starts_with("param/");
}

// One tp_copy_bucket for every parameter the split regions read: the
// gradients of all of them (each rank's from its rows) summed over the
// group in one all-reduce at the end of the backward pass, instead of one
// all-reduce, and one wait on every rank, per parameter.
Status copy_params_at_once(Graph& g, std::int64_t comm_id,
                           const std::vector<std::pair<int, std::size_t>>& reads) {
  if (reads.empty()) return ok_status();
  std::vector<Value> params;
  std::map<Value, int> slot;
  for (const auto& [id, i] : reads) {
    const Value v = g.node(id).inputs[i];
    if (slot.emplace(v, static_cast<int>(params.size())).second) params.push_back(v);
  }
  SHOAL_ASSIGN_OR_RETURN(
      std::vector<Value> copies,
      g.add_node("tp_copy_bucket", params, {{"comm", comm_id}}, "sequence_parallel/param_copies"));
  for (const auto& [id, i] : reads) {
    Node& n = g.mutable_node(id);
    n.inputs[i] = copies[static_cast<std::size_t>(slot.at(n.inputs[i]))];
  }
  return ok_status();
}

}  // namespace

Result<int> shard_sequence(Graph& g, std::int64_t comm_id, std::vector<std::string>* refused,
                           bool one_sum_for_params) {
  comm::Communicator* c = collective::communicator(comm_id);
  if (!c) return failed_precondition("sequence parallelism: no communicator {}", comm_id);
  collective::register_ops();
  const int size = c->size();
  int split = 0;
  std::vector<std::pair<int, std::size_t>> param_reads;  // (node, input) of a parameter
  for (const Region& r : regions(g, size)) {
    if (!r.refused.empty()) {
      if (refused) refused->push_back(r.refused);
      continue;
    }
    ++split;
    for (int id : r.sources) {
      Node& n = g.mutable_node(id);
      const std::int64_t rows = g.type(n.inputs[0]).shape[0];
      n.op = "reduce_scatter";
      n.attrs.set("sizes", std::vector<std::int64_t>(static_cast<std::size_t>(size), rows / size));
    }
    for (int id : r.nodes) {
      Node& n = g.mutable_node(id);
      if (n.op != "reshape") continue;
      auto dims = n.attrs.get_ints_or("shape", {});
      if (dims.empty() || dims[0] <= 0) continue;  // -1: inferred from the rows
      dims[0] /= size;
      n.attrs.set("shape", dims);
    }
    // What the rows read from outside (biases, norm scales, the position
    // table): each rank's gradient of it comes from its rows only, so a
    // tp_copy sums it over the group (Megatron all-reduces these too).
    // Parameters' copies are left for one tp_copy_bucket after the loop.
    std::map<Value, Value> shared;
    for (int id : r.nodes) {
      if (r.sources.count(id)) continue;
      for (std::size_t i = 0; i < g.node(id).inputs.size(); ++i) {
        const Value v = g.node(id).inputs[i];
        if (r.nodes.count(v.node) || g.node(v.node).op == "constant") continue;
        if (one_sum_for_params && is_param(g, v)) {
          param_reads.push_back({id, i});
          continue;
        }
        if (!shared.count(v)) {
          SHOAL_ASSIGN_OR_RETURN(shared[v], g.add("tp_copy", {v}, {{"comm", comm_id}}));
        }
        g.mutable_node(id).inputs[i] = shared[v];
      }
    }
    for (int id : r.copies) {
      Node& n = g.mutable_node(id);
      const std::int64_t rows = g.type(n.inputs[0]).shape[0] / size;
      n.op = "allgather";
      n.attrs.set("sizes", std::vector<std::int64_t>(static_cast<std::size_t>(size), rows));
    }
  }
  SHOAL_RETURN_IF_ERROR(copy_params_at_once(g, comm_id, param_reads));
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> order, g.topo_order());
  for (int id : order) SHOAL_RETURN_IF_ERROR(g.reinfer(id).with_context("sequence parallelism"));
  return split;
}

}  // namespace shoal::mp
