// tp_copy and tp_allreduce (mp/tensor_parallel.h): Megatron's f and g, the
// two conjugate ops of tensor parallelism. tp_copy is the identity whose
// gradient sums over the group; tp_allreduce sums over the group and its
// gradient is the identity. tp_copy_bucket is tp_copy of many tensors at
// once: its gradient sums them all in one bucket all-reduce, one wait on
// the group instead of one per tensor.
#include <cstring>
#include <mutex>

#include "collective/op_group.h"
#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/mp/tensor_parallel.h"
#include "shoal/runtime/kernel.h"

namespace shoal::mp {
namespace {

Result<comm::Communicator*> group_of(const graph::Node& n) {
  return collective::detail::communicator_of(n);
}

class TpKernel final : public runtime::Kernel {
 public:
  TpKernel(comm::Communicator* c, bool reduce) : c_(c), reduce_(reduce) {}
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    if (!reduce_) {  // tp_copy, and tp_copy_bucket's many inputs
      for (std::size_t i = 0; i < in.size(); ++i) SHOAL_RETURN_IF_ERROR(out[i].copy_from(in[i]));
      return ok_status();
    }
    const Tensor x = in[0].contiguous();
    return c_->allreduce(x.raw_data(), out[0].raw_data(), static_cast<std::size_t>(x.numel()),
                         DType::kF32, comm::ReduceOp::kSum);
  }
  const char* impl() const override { return reduce_ ? "comm" : "copy"; }

 private:
  comm::Communicator* c_;
  bool reduce_;
};

void add(const char* name, const char* grad_name, bool reduce) {
  collective::detail::add_paired_op(
      name, grad_name, {"comm"},
      [](const graph::Node& n,
         const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
        SHOAL_RETURN_IF_ERROR(group_of(n).status());
        if (in[0].dtype != DType::kF32)
          return invalid_argument("{}: needs an f32 tensor, got {}", n.label(), in[0].str());
        return in;
      },
      [reduce](const graph::Node& n,
               const std::vector<graph::TensorType>&) -> Result<std::unique_ptr<runtime::Kernel>> {
        SHOAL_ASSIGN_OR_RETURN(comm::Communicator * c, group_of(n));
        return std::unique_ptr<runtime::Kernel>(std::make_unique<TpKernel>(c, reduce));
      });
}

void add_copy_bucket() {
  graph::OpDef d;
  d.name = "tp_copy_bucket";
  d.max_inputs = -1;
  d.attrs = {"comm"};
  d.random = true;
  d.infer = [](const graph::Node& n,
               const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
    SHOAL_RETURN_IF_ERROR(group_of(n).status());
    for (const auto& t : in)
      if (t.dtype != DType::kF32)
        return invalid_argument("{}: needs f32 tensors, got {}", n.label(), t.str());
    return in;
  };
  // The outputs' gradients summed over the group in one all-reduce; an
  // output no gradient reaches (the same on every rank: their graphs differ
  // only in shapes) stays out of it.
  d.grad = [](graph::GradInputs& g) -> std::vector<graph::Value> {
    std::vector<graph::Value> flowing, out(g.output_grads.size());
    for (const graph::Value& v : g.output_grads)
      if (v.valid()) flowing.push_back(v);
    if (flowing.empty()) return out;
    graph::Value sum =
        g.b.op("allreduce_bucket", flowing,
               {{"comm", g.node.attrs.get_int_or("comm", -1)}, {"op", std::string("sum")}});
    int k = 0;
    for (std::size_t i = 0; i < out.size(); ++i)
      if (g.output_grads[i].valid()) out[i] = graph::Value{sum.node, k++};
    return out;
  };
  graph::OpRegistry::global().add(d);
  runtime::KernelRegistry::cpu().add(
      "tp_copy_bucket",
      [](const graph::Node& n,
         const std::vector<graph::TensorType>&) -> Result<std::unique_ptr<runtime::Kernel>> {
        SHOAL_ASSIGN_OR_RETURN(comm::Communicator * c, group_of(n));
        return std::unique_ptr<runtime::Kernel>(std::make_unique<TpKernel>(c, false));
      });
}

}  // namespace

void register_tensor_parallel_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    add("tp_copy", "tp_allreduce", false);  // f: identity; its gradient sums
    add("tp_allreduce", "tp_copy", true);   // g: sums; its gradient is the identity
    collective::register_ops();             // allreduce_bucket: tp_copy_bucket's gradient
    add_copy_bucket();
    register_vocab_cross_entropy();
  });
}

}  // namespace shoal::mp
