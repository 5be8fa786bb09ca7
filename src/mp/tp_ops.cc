// tp_copy and tp_allreduce (mp/tensor_parallel.h): Megatron's f and g, the
// two conjugate ops of tensor parallelism. tp_copy is the identity whose
// gradient sums over the group; tp_allreduce sums over the group and its
// gradient is the identity.
#include <cstring>
#include <mutex>

#include "mp/op_group.h"
#include "shoal/comm/communicator.h"
#include "shoal/dp/allreduce.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/mp/tensor_parallel.h"
#include "shoal/runtime/kernel.h"

namespace shoal::mp {
namespace {

Result<comm::Communicator*> group_of(const graph::Node& n) { return detail::communicator_of(n); }

class TpKernel final : public runtime::Kernel {
 public:
  TpKernel(comm::Communicator* c, bool reduce) : c_(c), reduce_(reduce) {}
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    const Tensor x = in[0].contiguous();
    if (!reduce_) {
      std::memcpy(out[0].raw_data(), x.raw_data(), x.nbytes());
      return ok_status();
    }
    return c_->allreduce(x.raw_data(), out[0].raw_data(), static_cast<std::size_t>(x.numel()),
                         DType::kF32, comm::ReduceOp::kSum);
  }
  const char* impl() const override { return reduce_ ? "comm" : "copy"; }

 private:
  comm::Communicator* c_;
  bool reduce_;
};

void add(const char* name, const char* grad_name, bool reduce) {
  detail::add_paired_op(
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

}  // namespace

void register_tensor_parallel_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    add("tp_copy", "tp_allreduce", false);  // f: identity; its gradient sums
    add("tp_allreduce", "tp_copy", true);   // g: sums; its gradient is the identity
  });
}

}  // namespace shoal::mp
