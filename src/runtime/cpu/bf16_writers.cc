// Producers that write bf16 themselves under --precision bf16: where the
// only reader of an f32 value was a cast to bf16 (graph/precision.cc's
// narrow_producers), the producer computes in f32 and stores bf16, and the
// value is never written or read at f32 width. Layer norm (its gradient
// reads x) and softmax's gradient along the last axis (attention's
// scores, read by two products) here; GELU and its gradient in gelu.cc.
// Registered after oneDNN's overrides; an f32 output keeps the kernels
// registered before.
#include <algorithm>
#include <cmath>
#include <span>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/layer_norm_rows.h"

namespace shoal::runtime::cpu {
namespace {

// Layer norm over rows of d: each row normalized in f32, stored bf16.
void layer_norm_to_bf16(double eps, std::span<const Tensor> in, Tensor& out) {
  const std::int64_t d = in[0].shape().back();
  auto* y = static_cast<std::uint16_t*>(out.raw_data());
  layer_norm_rows(
      eps, in,
      [d, y](std::int64_t r, const float* p, float m, float rstd, const float* g, const float* b) {
        chunks_to_bf16(y + r * d, d, [&](std::int64_t lo, std::int64_t k, float* t) {
#pragma omp simd
          for (std::int64_t i = 0; i < k; ++i)
            t[i] = (p[lo + i] - m) * rstd * g[lo + i] + b[lo + i];
        });
      });
}

// dx = scale * y * (dy - sum(dy * y)) along rows of n, stored bf16.
void softmax_grad_to_bf16(const float* y, const float* dy, std::uint16_t* dx, std::int64_t rows,
                          std::int64_t n, float scale) {
#pragma omp parallel for if (rows * n > kParallelGrain) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * n;
    const float* gr = dy + r * n;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t j = 0; j < n; ++j) dot += gr[j] * yr[j];
    chunks_to_bf16(dx + r * n, n, [&](std::int64_t lo, std::int64_t k, float* t) {
#pragma omp simd
      for (std::int64_t j = 0; j < k; ++j) t[j] = scale * yr[lo + j] * (gr[lo + j] - dot);
    });
  }
}

}  // namespace

void add_writer(KernelRegistry& r, const char* op, KernelFactory bf16) {
  const KernelFactory* prev = r.find(op);
  SHOAL_CHECK(prev != nullptr, "no kernel for {}", op);
  KernelFactory f32 = *prev;
  r.add(op, [f32, bf16](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    if (n.outputs[0].dtype != DType::kBF16) return f32(n, in);
    for (std::size_t i = 0; i < in.size(); ++i)
      if (in[i].dtype != DType::kF32 || blocked_input(n, static_cast<int>(i)))
        return failed_precondition("{}: a bf16 {} reads plain f32, not {}", n.label(), n.op,
                                   in[i].str());
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
          layer_norm_to_bf16(eps, x, y[0]);
          return ok_status();
        },
        "bf16-writer");
  });
  add_writer(
      r, "softmax_grad", [](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
        const auto rank = static_cast<std::int64_t>(in[0].shape.size());
        const std::int64_t axis = n.attrs.get_int_or("axis", -1);
        if (rank == 0 || (axis != -1 && axis != rank - 1))
          return failed_precondition("{}: a bf16 softmax gradient runs along the last axis, not {}",
                                     n.label(), axis);
        const std::int64_t len = in[0].shape.back();
        const std::int64_t rows = len == 0 ? 0 : num_elements(in[0].shape) / len;
        const auto scale = static_cast<float>(n.attrs.get_float_or("scale", 1.0));
        return make_fn(
            [rows, len, scale](const KernelContext&, std::span<const Tensor> x,
                               std::span<Tensor> y) {
              softmax_grad_to_bf16(x[0].data<float>(), x[1].data<float>(),
                                   static_cast<std::uint16_t*>(y[0].raw_data()), rows, len, scale);
              return ok_status();
            },
            "bf16-writer");
      });
}

}  // namespace shoal::runtime::cpu
