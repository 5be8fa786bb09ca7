// ZeRO-3 (dp/sharded.h): parameters held as row blocks, all-gathered where
// the step uses them.
#include <algorithm>
#include <map>
#include <memory>

#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/core/logging.h"
#include "shoal/dp/allreduce.h"
#include "shoal/dp/sharded.h"
#include "shoal/graph/builder.h"

namespace shoal::dp {
namespace {

// The whole tensor from every rank's rows.
Result<Tensor> gather_rows(comm::Communicator* c, const Shape& whole_shape,
                           const std::vector<std::int64_t>& sizes, const Tensor& mine) {
  const std::int64_t row = whole_shape.empty() ? 1 : num_elements(whole_shape) / whole_shape[0];
  std::vector<std::size_t> counts;
  for (std::int64_t s : sizes) counts.push_back(static_cast<std::size_t>(s * row));
  Tensor whole = Tensor::empty(whole_shape, DType::kF32);
  SHOAL_RETURN_IF_ERROR(c->allgatherv(mine.raw_data(), whole.raw_data(), counts, DType::kF32)
                            .with_context("gathering a ZeRO-3 parameter"));
  return whole;
}

// `nodes` sorted by the position of their first user (from node
// `users_from` on) in the graph's execution order; unused ones last.
Result<std::vector<int>> in_order_of_use(const graph::Graph& g, std::vector<int> nodes,
                                         int users_from = 0) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> order, g.topo_order());
  std::map<int, std::size_t> first;
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (order[i] < users_from) continue;
    for (const graph::Value& v : g.node(order[i]).inputs) first.try_emplace(v.node, i);
  }
  auto at = [&](int id) {
    auto f = first.find(id);
    return f == first.end() ? order.size() : f->second;
  };
  std::stable_sort(nodes.begin(), nodes.end(), [&](int a, int b) { return at(a) < at(b); });
  return nodes;
}

}  // namespace

Result<train::TrainOptions::ParamSlices> shard_parameters(graph::Graph& g, std::int64_t comm_id,
                                                          std::vector<Zero3Gather>* gathers) {
  comm::Communicator* c = collective::communicator(comm_id);
  if (!c) return failed_precondition("ZeRO-3: no communicator registered as id {}", comm_id);
  collective::register_ops();
  const int rank = c->rank(), world = c->size();
  auto shapes = std::make_shared<std::map<std::string, Shape>>();
  auto rows = std::make_shared<std::map<std::string, std::vector<std::int64_t>>>();
  graph::Builder b(g);
  // Gathers are created in the order the forward first uses the parameters,
  // so the executor (smallest ready id first) runs each when the forward
  // needs it, not every lower-numbered one before it.
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> params, in_order_of_use(g, g.input_nodes()));
  for (int id : params) {
    const graph::Node& n = g.node(id);
    if (!n.name.starts_with("param/")) continue;
    const Shape whole = n.outputs[0].shape;
    if (whole.empty() || n.outputs[0].dtype != DType::kF32)
      return invalid_argument("ZeRO-3: parameter {} is {}; row blocks need f32 of rank >= 1",
                              n.name, n.outputs[0].str());
    const std::string name = n.name.substr(6);
    const std::vector<std::int64_t> sizes = shard_sizes(whole[0], world);
    (*shapes)[name] = whole;
    (*rows)[name] = sizes;
    // The input becomes this rank's rows; every use reads their gather.
    g.mutable_node(id).outputs[0].shape[0] = sizes[static_cast<std::size_t>(rank)];
    const graph::Value shard{id, 0};
    const graph::Value wv = collective::allgather(b, shard, comm_id, sizes);
    SHOAL_RETURN_IF_ERROR(b.status().with_context("ZeRO-3"));
    g.replace_all_uses(shard, wv);
    g.mutable_node(wv.node).inputs[0] = shard;
    if (gathers) gathers->push_back({name, shard, wv, sizes});
  }
  train::TrainOptions::ParamSlices ps;
  for (const auto& [name, s] : *shapes) ps.names.insert(name);
  ps.eval_in_lockstep = true;
  ps.slice = [rows, rank](const std::string& p, const Tensor& whole) {
    const auto& sizes = rows->at(p);
    std::int64_t first = 0;
    for (int r = 0; r < rank; ++r) first += sizes[static_cast<std::size_t>(r)];
    const std::int64_t n = sizes[static_cast<std::size_t>(rank)];
    Shape s = whole.shape();
    const std::int64_t row = num_elements(s) / std::max<std::int64_t>(s[0], 1);
    s[0] = n;
    Tensor t = Tensor::empty(s, DType::kF32);
    std::copy_n(whole.data<float>() + first * row, n * row, t.data<float>());
    return t;
  };
  ps.gather = [rows, shapes, c](const std::string& p, const Tensor& mine) {
    return gather_rows(c, shapes->at(p), rows->at(p), mine);
  };
  return ps;
}

Status regather_for_backward(graph::Graph& g, int forward_end,
                             const std::vector<Zero3Gather>& gathers, std::int64_t comm_id) {
  graph::Builder b(g);
  // In the order the backward first needs them: the executor runs the
  // smallest ready id, so each gather runs just in time. (In the reverse of
  // the forward's order instead, a GPT's backward gathered every parameter
  // at its start: the whole model in the arena, 70 of its 71 MB.)
  std::vector<int> wholes;
  for (const auto& z : gathers) wholes.push_back(z.whole.node);
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> need, in_order_of_use(g, wholes, forward_end));
  std::map<int, const Zero3Gather*> by_node;
  for (const auto& z : gathers) by_node[z.whole.node] = &z;
  for (int node : need) {
    const Zero3Gather* it = by_node.at(node);
    std::vector<int> users;
    for (int id = forward_end; id < g.num_nodes(); ++id) {
      const graph::Node& n = g.node(id);
      if (!n.alive || n.op == "allgather") continue;
      if (std::find(n.inputs.begin(), n.inputs.end(), it->whole) != n.inputs.end())
        users.push_back(id);
    }
    if (users.empty()) continue;
    const graph::Value again = collective::allgather(b, it->shard, comm_id, it->sizes);
    SHOAL_RETURN_IF_ERROR(b.status().with_context("ZeRO-3: gathering again for the backward"));
    for (int id : users)
      for (graph::Value& v : g.mutable_node(id).inputs)
        if (v == it->whole) v = again;
  }
  return ok_status();
}

}  // namespace shoal::dp
