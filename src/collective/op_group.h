// What the collective graph ops (allgather.cc, broadcast.cc,
// scatter_gather.cc, and mp's tp_ops.cc) read from a node: its communicator, root
// and every rank's rows, each checked with errors that name the node.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "shoal/collective/registry.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/graph.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/kernel.h"

namespace shoal::collective::detail {

// Each file's ops, registered once by collective::register_ops.
void register_allgather_reduce_scatter();
void register_broadcast_reduce();
void register_scatter_gather();

// The communicator the node's "comm" attribute names (register_communicator).
inline Result<comm::Communicator*> communicator_of(const graph::Node& n) {
  const std::int64_t id = n.attrs.get_int_or("comm", -1);
  comm::Communicator* c = communicator(id);
  if (!c) return failed_precondition("{}: no communicator registered as id {}", n.label(), id);
  return c;
}

// The node's "root": a rank of c.
inline Result<int> root_of(const graph::Node& n, const comm::Communicator& c) {
  const std::int64_t root = n.attrs.get_int_or("root", -1);
  if (root < 0 || root >= c.size())
    return invalid_argument("{}: root {} is not a rank of a group of {}", n.label(), root,
                            c.size());
  return static_cast<int>(root);
}

// Every rank's rows ("sizes"), their total, and this rank's first row.
struct Rows {
  std::vector<std::int64_t> sizes;
  std::int64_t total = 0, first = 0;
  std::int64_t mine(const comm::Communicator& c) const {
    return sizes[static_cast<std::size_t>(c.rank())];
  }
};

inline Result<Rows> rows_of(const graph::Node& n, const comm::Communicator& c) {
  Rows r{n.attrs.get_ints_or("sizes", {})};
  if (static_cast<int>(r.sizes.size()) != c.size())
    return invalid_argument("{}: {} sizes for a group of {} ranks", n.label(), r.sizes.size(),
                            c.size());
  for (std::size_t i = 0; i < r.sizes.size(); ++i) {
    if (r.sizes[i] < 0) return invalid_argument("{}: a rank's size is {}", n.label(), r.sizes[i]);
    if (static_cast<int>(i) < c.rank()) r.first += r.sizes[i];
    r.total += r.sizes[i];
  }
  return r;
}

// The output of an op that takes this rank's rows to every rank's
// (`to_all`: gathers) or every rank's rows to this rank's (scatters).
// `halves`: f16 and bf16 tensors too (they travel as themselves).
inline Result<std::vector<graph::TensorType>> infer_rows(const graph::Node& n,
                                                         const graph::TensorType& x,
                                                         const comm::Communicator& c, const Rows& r,
                                                         bool to_all, bool halves = false) {
  const bool half = x.dtype == DType::kF16 || x.dtype == DType::kBF16;
  if ((x.dtype != DType::kF32 && !(halves && half)) || x.shape.empty())
    return invalid_argument("{}: needs an {} tensor of rank >= 1, got {}", n.label(),
                            halves ? "f32, f16 or bf16" : "f32", x.str());
  const std::int64_t want = to_all ? r.mine(c) : r.total;
  if (x.shape[0] != want)
    return invalid_argument("{}: rank {} holds {} rows, the sizes say {}", n.label(), c.rank(),
                            x.shape[0], want);
  graph::TensorType out = x;
  out.shape[0] = to_all ? r.total : r.mine(c);
  return std::vector<graph::TensorType>{out};
}

// Registers a collective graph op whose gradient is its twin `grad_name`
// applied to dy with the same attributes (allgather/reduce_scatter,
// broadcast/reduce, scatter/gather, tp_copy/tp_allreduce), and its CPU
// kernel. Never constant-folded: its value depends on other ranks.
inline void add_paired_op(const char* name, const char* grad_name, std::vector<std::string> attrs,
                          std::function<Result<std::vector<graph::TensorType>>(
                              const graph::Node&, const std::vector<graph::TensorType>&)>
                              infer,
                          runtime::KernelFactory kernel) {
  graph::OpDef d;
  d.name = name;
  d.attrs = std::move(attrs);
  d.random = true;
  d.infer = std::move(infer);
  d.grad = [grad_name](graph::GradInputs& g) -> std::vector<graph::Value> {
    return {g.b.op(grad_name, {g.output_grads[0]}, g.node.attrs)};
  };
  graph::OpRegistry::global().add(d);
  runtime::KernelRegistry::cpu().add(name, std::move(kernel));
}

}  // namespace shoal::collective::detail
