// GELU (exact, erf form) and its gradient in f32 on AVX-512, and their
// bf16 writers. Both evaluate erfc by Abramowitz-Stegun 7.1.26 and one
// vector exp; the gradient reuses the exp for the density:
//   GELU(x)  = x Phi(x),  Phi(x) = erfc(-x/sqrt 2) / 2
//   GELU'(x) = Phi(x) + x phi(x),  phi(x) = exp(-x^2/2) / sqrt(2 pi)
// The gradient replaces oneDNN's eltwise backward in f32 (one pass over x
// and dy where oneDNN's took 1.3 ms for the base GPT's [2048, 512] on one
// thread). Registered after oneDNN's overrides and the other writers.
#include <algorithm>
#include <cmath>
#include <span>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/vec_math.h"

namespace shoal::runtime::cpu {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

#if defined(__AVX512F__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Phi(v) on 16 lanes, and e = exp(-v^2/2) for the caller's density.
// erfc(|z|) = t * P(t) * e^-z^2, t = 1/(1 + p|z|) (|error| <= 1.5e-7), then
// erfc(-z) = 2 - erfc(z) for z >= 0: no cancellation in the negative tail.
inline __m512 phi16(__m512 v, __m512* e) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 z = _mm512_mul_ps(v, _mm512_set1_ps(kInvSqrt2));
  const __m512 a = _mm512_abs_ps(z);
  const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(a, _mm512_set1_ps(0.3275911f), one));
  __m512 p = _mm512_set1_ps(1.061405429f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
  *e = vec::exp16(_mm512_mul_ps(a, _mm512_sub_ps(_mm512_setzero_ps(), a)));
  const __m512 q = _mm512_mul_ps(_mm512_mul_ps(p, t), *e);
  const __mmask16 pos = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GE_OQ);
  return _mm512_mul_ps(_mm512_set1_ps(0.5f), _mm512_mask_sub_ps(q, pos, _mm512_set1_ps(2.0f), q));
}
#pragma GCC diagnostic pop
#endif

inline float phi_scalar(float x) { return 0.5f * std::erfc(-x * kInvSqrt2); }

// GELU of n floats into y.
void gelu_f32(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    __m512 e;
    _mm512_storeu_ps(y + i, _mm512_mul_ps(v, phi16(v, &e)));
  }
#endif
  for (; i < n; ++i) y[i] = x[i] * phi_scalar(x[i]);
}

// dx = dy * GELU'(x) over n floats.
void gelu_grad_f32(const float* x, const float* dy, float* dx, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    __m512 e;
    const __m512 cdf = phi16(v, &e);
    const __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(v, _mm512_set1_ps(kInvSqrt2Pi)), e, cdf);
    _mm512_storeu_ps(dx + i, _mm512_mul_ps(_mm512_loadu_ps(dy + i), d));
  }
#endif
  for (; i < n; ++i)
    dx[i] = dy[i] * (phi_scalar(x[i]) + x[i] * kInvSqrt2Pi * std::exp(-0.5f * x[i] * x[i]));
}

// GELU's or its gradient's kernel over blocks of kBlock elements (in
// parallel when large): each input read as f32 (a bf16 one widened in L1),
// the result written as f32 or stored bf16, by the node's types.
constexpr std::int64_t kBlock = 1024;
Result<std::unique_ptr<Kernel>> gelu_kernel(bool grad, const char* impl) {
  return make_fn(
      [grad](const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) {
        const std::int64_t n = in[0].numel(), count = (n + kBlock - 1) / kBlock;
        const bool wide = out[0].dtype() == DType::kF32;
        float* y32 = wide ? out[0].data<float>() : nullptr;
        auto* y16 = wide ? nullptr : static_cast<std::uint16_t*>(out[0].raw_data());
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
        for (std::int64_t b = 0; b < count; ++b) {
          const std::int64_t lo = b * kBlock, m = std::min(kBlock, n - lo);
          alignas(64) float tx[kBlock], tdy[kBlock], ty[kBlock];
          const float* x = as_f32(in[0], lo, m, tx);
          float* y = wide ? y32 + lo : ty;
          if (grad)
            gelu_grad_f32(x, as_f32(in[1], lo, m, tdy), y, m);
          else
            gelu_f32(x, y, m);
          if (!wide) to_bf16_serial(ty, y16 + lo, m);
        }
        return ok_status();
      },
      impl);
}

}  // namespace

void register_gelu(KernelRegistry& r) {
  // f32: the gradient here (one pass; oneDNN's forward stays, as fast);
  // any layout every operand shares is the same flat array.
  const KernelFactory* prev = r.find("gelu_grad");
  SHOAL_CHECK(prev != nullptr, "no kernel for gelu_grad");
  KernelFactory before = *prev;
  r.add("gelu_grad", [before](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    const bool blocked = blocked_output(n, 0);
    if (n.outputs[0].dtype != DType::kF32 || in[0].dtype != DType::kF32 ||
        in[1].dtype != DType::kF32 || in[0].shape != in[1].shape ||
        blocked_input(n, 0) != blocked || blocked_input(n, 1) != blocked)
      return before(n, in);
    return gelu_kernel(true, "vector");
  });
  // bf16 in or out: what the node reads bf16 it widens, what it writes
  // bf16 it stores (graph/precision.cc's bf16 readers and writers).
  auto impl = [](const Node& n) {
    return n.outputs[0].dtype == DType::kBF16 ? "bf16-writer" : "bf16-reader";
  };
  add_writer(
      r, "gelu", [impl](const Node& n, const Inputs&) { return gelu_kernel(false, impl(n)); },
      true);
  add_writer(
      r, "gelu_grad",
      [impl](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
        if (in[0].shape != in[1].shape)
          return failed_precondition("a bf16 GELU gradient takes x and dy of one shape");
        return gelu_kernel(true, impl(n));
      },
      true);
}

}  // namespace shoal::runtime::cpu
