// Producers that write bf16 themselves under --precision bf16: where the
// only reader of an f32 value was a cast to bf16 (graph/precision.cc's
// narrow_producers), the producer computes in f32 and stores bf16, and the
// value is never written or read at f32 width. Layer norm (its gradient
// reads x) here; GELU and its gradient in gelu.cc, softmax and its
// gradient in softmax.cc (those also read bf16).
// Registered after oneDNN's overrides; an f32 output keeps the kernels
// registered before.
#include <algorithm>
#include <cmath>
#include <span>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/layer_norm_rows.h"

namespace shoal::runtime::cpu {

void add_writer(KernelRegistry& r, const char* op, KernelFactory bf16, bool reads) {
  const KernelFactory* prev = r.find(op);
  SHOAL_CHECK(prev != nullptr, "no kernel for {}", op);
  KernelFactory f32 = *prev;
  r.add(op, [f32, bf16, reads](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    bool narrow = n.outputs[0].dtype == DType::kBF16;
    for (const TensorType& t : in) narrow = narrow || (reads && t.dtype == DType::kBF16);
    if (!narrow) return f32(n, in);
    for (std::size_t i = 0; i < in.size(); ++i) {
      const bool readable = in[i].dtype == DType::kF32 || (reads && in[i].dtype == DType::kBF16);
      if (!readable || blocked_input(n, static_cast<int>(i)))
        return failed_precondition("{}: a bf16 {} reads plain f32{}, not {}", n.label(), n.op,
                                   reads ? " or bf16" : "", in[i].str());
    }
    if (blocked_output(n, 0))
      return failed_precondition("{}: a bf16 {} writes the plain layout", n.label(), n.op);
    return bf16(n, in);
  });
}

void register_bf16_writers(KernelRegistry& r) {
  add_writer(r, "layer_norm", [](const Node& n, const Inputs&) {
    const double eps = n.attrs.get_float_or("eps", 1e-5);
    return make_fn(
        [eps](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
          layer_norm_f32(eps, x, y[0]);
          return ok_status();
        },
        "bf16-writer");
  });
}

}  // namespace shoal::runtime::cpu
