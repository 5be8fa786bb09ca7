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
#include "runtime/cpu/vec_bf16.h"
#include "runtime/cpu/vec_math.h"

namespace shoal::runtime::cpu {
namespace {

using namespace vec;  // NOLINT: this directory's own vector helpers

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
  // t = 1/d, d >= 1: the 14-bit reciprocal and one Newton step (2^-28,
  // below f32's rounding) cost a third of a division's latency.
  const __m512 d = _mm512_fmadd_ps(a, _mm512_set1_ps(0.3275911f), one);
  __m512 t = _mm512_rcp14_ps(d);
  t = _mm512_mul_ps(t, _mm512_fnmadd_ps(d, t, _mm512_set1_ps(2.0f)));
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

// GELU of n values of x into y, or (dy given) dy * GELU'(x); each operand
// f32 or bf16 (vec_bf16.h), computed in f32.
template <typename X, typename D, typename Y>
void gelu_span(const X* x, const D* dy, Y* y, std::int64_t n) {
#if defined(SHOAL_VEC_BF16)
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first(n - i);
    prefetch_ahead(x + i);
    if (dy != nullptr) prefetch_ahead(dy + i);
    const __m512 v = load16(x + i, m);
    __m512 e;
    const __m512 cdf = phi16(v, &e);
    if (dy == nullptr) {
      store16(y + i, _mm512_mul_ps(v, cdf), m);
    } else {
      const __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(v, _mm512_set1_ps(kInvSqrt2Pi)), e, cdf);
      store16(y + i, _mm512_mul_ps(load16(dy + i, m), d), m);
    }
  }
#else
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = widen(x[i]);
    if (dy == nullptr)
      put(y + i, v * phi_scalar(v));
    else
      put(y + i, widen(dy[i]) * (phi_scalar(v) + v * kInvSqrt2Pi * std::exp(-0.5f * v * v)));
  }
#endif
}

// GELU's or its gradient's kernel over blocks of kBlock elements (in
// parallel when large), every operand f32 or bf16 by the node's types.
constexpr std::int64_t kBlock = 4096;
Result<std::unique_ptr<Kernel>> gelu_kernel(bool grad, const char* impl) {
  return make_fn(
      [grad](const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) {
        const std::int64_t n = in[0].numel(), count = (n + kBlock - 1) / kBlock;
        auto run = [&](const auto* x, const auto* dy, auto* y) {
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
          for (std::int64_t b = 0; b < count; ++b) {
            const std::int64_t lo = b * kBlock, m = std::min(kBlock, n - lo);
            gelu_span(x + lo, dy == nullptr ? dy : dy + lo, y + lo, m);
          }
        };
        typed_in(in[0], [&](const auto* x) {
          typed_out(out[0], [&](auto* y) {
            if (grad)
              typed_in(in[1], [&](const auto* dy) { run(x, dy, y); });
            else
              run(x, static_cast<const float*>(nullptr), y);
          });
        });
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
  add_writer(
      r, "gelu", [](const Node& n, const Inputs&) { return gelu_kernel(false, bf16_impl(n)); },
      true);
  add_writer(
      r, "gelu_grad",
      [](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
        if (in[0].shape != in[1].shape)
          return failed_precondition("a bf16 GELU gradient takes x and dy of one shape");
        return gelu_kernel(true, bf16_impl(n));
      },
      true);
}

}  // namespace shoal::runtime::cpu
