// Producers that write bf16 themselves under --precision bf16: where the
// only reader of an f32 value was a cast to bf16 (graph/precision.cc's
// narrow_producers), the producer computes in f32 and stores bf16, and the
// value is never written or read at f32 width. Layer norm (its gradient
// reads x) here; GELU and its gradient in gelu.cc, softmax and its
// gradient in softmax.cc (those also read bf16); ReLU and its gradient.
// Registered after oneDNN's overrides; an f32 output keeps the kernels
// registered before.
#include <algorithm>
#include <cmath>
#include <span>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/layer_norm_rows.h"
#include "runtime/cpu/vec_bf16.h"
#include "shoal/runtime/parallel.h"

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

namespace {

// ReLU writing bf16 (one no producer took in, fuse_activations) and its
// gradient reading y or dy in bf16: flat loops, so any layout the
// operands share (the layout pass gives full-size operands one).
// max(x, 0) as the f32 kernel (NaN -> 0), stored bf16; branch-free (a
// compare per element mispredicts on ReLU's random signs: 2 ms for the
// 800k of ResNet-20's first stage, 0.1 ms as here).
void relu_to_bf16(const float* x, std::uint16_t* y, std::int64_t n) {
  constexpr std::int64_t kChunk = 1 << 12;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
#if defined(SHOAL_VEC_BF16)
    const __m512 zero = _mm512_setzero_ps();
    for (std::int64_t i = lo; i < hi; i += 16) {
      const auto m = static_cast<__mmask16>(hi - i >= 16 ? 0xffff : (1u << (hi - i)) - 1);
      const __m512 v = vec::load16(x + i, m);
      vec::store16(y + i, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ), v), m);
    }
#else
    for (std::int64_t i = lo; i < hi; ++i) vec::put(y + i, x[i] > 0.0f ? x[i] : 0.0f);
#endif
  }
}

// dy * step(y), as the f32 kernel (NaN y -> 0 * dy).
template <typename D, typename Y>
void relu_grad_wide(const D* dy, const Y* y, float* dx, std::int64_t n) {
  simd_loop(n, [&](std::int64_t i) {
    dx[i] = vec::widen(dy[i]) * static_cast<float>(vec::widen(y[i]) > 0.0f);
  });
}

// ReLU and its gradient: the f32 kernels unless the node writes or reads bf16.
void add_relu_kernels(KernelRegistry& r) {
  const KernelFactory* relu = r.find("relu");
  const KernelFactory* grad = r.find("relu_grad");
  SHOAL_CHECK(relu != nullptr && grad != nullptr, "no kernels for relu");
  r.add("relu", [f32 = *relu](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    if (n.outputs[0].dtype != DType::kBF16) return f32(n, in);
    if (in[0].dtype != DType::kF32)
      return failed_precondition("{}: a bf16 relu reads f32, not {}", n.label(), in[0].str());
    return make_fn(
        [](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
          relu_to_bf16(x[0].data<float>(), static_cast<std::uint16_t*>(y[0].raw_data()),
                       x[0].numel());
          return ok_status();
        },
        "bf16-writer");
  });
  r.add("relu_grad",
        [f32 = *grad](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
          if (in[0].dtype != DType::kBF16 && in[1].dtype != DType::kBF16) return f32(n, in);
          for (const TensorType& t : in)
            if ((t.dtype != DType::kF32 && t.dtype != DType::kBF16) || t.shape != in[0].shape)
              return failed_precondition(
                  "{}: a bf16 relu_grad reads f32 or bf16 of one shape, not {}", n.label(),
                  t.str());
          return make_fn(
              [](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
                typed_in(x[0], [&](auto dy) {
                  typed_in(x[1], [&](auto yv) {
                    relu_grad_wide(dy, yv, y[0].data<float>(), y[0].numel());
                  });
                });
                return ok_status();
              },
              "bf16-reader");
        });
}

}  // namespace

void register_bf16_writers(KernelRegistry& r) {
  add_relu_kernels(r);
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
