// broadcast and reduce as graph ops (collective/ops.h; named comm_broadcast
// and comm_reduce: "broadcast" is numpy's broadcast_to): one rank's tensor
// to every rank, and every rank's tensors summed on one. Each is the
// other's gradient: d/dx_root of broadcast is the sum of every rank's dy
// (reduce to the root; zero elsewhere), and d/dx_r of reduce is the root's
// dy on every rank (broadcast from the root).
#include <cstring>
#include <mutex>

#include "collective/op_group.h"
#include "shoal/collective/ops.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/kernel.h"

namespace shoal::collective {
namespace {

struct Rooted {
  comm::Communicator* c;
  int root;
};

Result<Rooted> rooted(const graph::Node& n) {
  SHOAL_ASSIGN_OR_RETURN(comm::Communicator * c, detail::communicator_of(n));
  SHOAL_ASSIGN_OR_RETURN(int root, detail::root_of(n, *c));
  return Rooted{c, root};
}

class RootedKernel final : public runtime::Kernel {
 public:
  RootedKernel(Rooted r, bool broadcast) : r_(r), broadcast_(broadcast) {}
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    const Tensor x = in[0].contiguous();
    Tensor& y = out[0];
    const auto n = static_cast<std::size_t>(x.numel());
    if (broadcast_) {
      if (r_.c->rank() == r_.root) std::memcpy(y.raw_data(), x.raw_data(), x.nbytes());
      return r_.c->broadcast(y.raw_data(), n, DType::kF32, r_.root);
    }
    SHOAL_RETURN_IF_ERROR(
        r_.c->reduce(x.raw_data(), y.raw_data(), n, DType::kF32, comm::ReduceOp::kSum, r_.root));
    // Only the root holds the sum; the others' outputs are zero (so that
    // the reduce's value, and its gradient, are those of one tensor).
    if (r_.c->rank() != r_.root) std::memset(y.raw_data(), 0, y.nbytes());
    return ok_status();
  }
  const char* impl() const override { return "comm"; }

 private:
  Rooted r_;
  bool broadcast_;
};

void add(const char* name, const char* grad_name, bool broadcast) {
  detail::add_paired_op(
      name, grad_name, {"comm", "root"},
      [](const graph::Node& n,
         const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
        SHOAL_RETURN_IF_ERROR(rooted(n).status());
        if (in[0].dtype != DType::kF32)
          return invalid_argument("{}: needs an f32 tensor, got {}", n.label(), in[0].str());
        return in;
      },
      [broadcast](const graph::Node& n, const std::vector<graph::TensorType>&)
          -> Result<std::unique_ptr<runtime::Kernel>> {
        SHOAL_ASSIGN_OR_RETURN(Rooted r, rooted(n));
        return std::unique_ptr<runtime::Kernel>(std::make_unique<RootedKernel>(r, broadcast));
      });
}

}  // namespace

void detail::register_broadcast_reduce() {
  static std::once_flag once;
  std::call_once(once, [] {
    add("comm_broadcast", "comm_reduce", true);
    add("comm_reduce", "comm_broadcast", false);
  });
}

graph::Value broadcast(graph::Builder& b, graph::Value x, std::int64_t comm, int root) {
  register_ops();
  return b.op("comm_broadcast", {x}, {{"comm", comm}, {"root", std::int64_t{root}}});
}

graph::Value reduce(graph::Builder& b, graph::Value x, std::int64_t comm, int root) {
  register_ops();
  return b.op("comm_reduce", {x}, {{"comm", comm}, {"root", std::int64_t{root}}});
}

}  // namespace shoal::collective
