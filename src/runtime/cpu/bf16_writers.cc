// Producers that write bf16 themselves under --precision bf16: where the
// only reader of an f32 value was a cast to bf16 (graph/precision.cc's
// narrow_producers), the producer computes in f32 and stores bf16, and the
// value is never written or read at f32 width. GELU here: the MLP's
// [B*T, 4D] activation, read only by its cast (its gradient reads GELU's
// input). Registered after oneDNN's overrides; an f32 GELU keeps them.
#include <algorithm>
#include <cmath>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/vec_math.h"

namespace shoal::runtime::cpu {
namespace {

// GELU, x * Phi(x) = x/2 * erfc(-x/sqrt 2), of n floats into y.
void gelu_f32(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__AVX512F__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
  // erfc(|z|) = t * P(t) * e^-z^2, t = 1/(1 + p|z|) (Abramowitz-Stegun
  // 7.1.26, |error| <= 1.5e-7), then erfc(-z) = 2 - erfc(z) for z >= 0:
  // no cancellation in the negative tail.
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 z = _mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f));
    const __m512 a = _mm512_abs_ps(z);
    const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(a, _mm512_set1_ps(0.3275911f), one));
    __m512 p = _mm512_set1_ps(1.061405429f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    const __m512 q = _mm512_mul_ps(
        _mm512_mul_ps(p, t), vec::exp16(_mm512_mul_ps(a, _mm512_sub_ps(_mm512_setzero_ps(), a))));
    const __mmask16 pos = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GE_OQ);
    const __m512 erfc_neg = _mm512_mask_sub_ps(q, pos, _mm512_set1_ps(2.0f), q);
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(half, v), erfc_neg));
  }
#pragma GCC diagnostic pop
#endif
  for (; i < n; ++i) y[i] = 0.5f * x[i] * std::erfc(-x[i] * 0.70710678118654752f);
}

// In blocks that stay in L1 between the two passes.
void gelu_to_bf16(const float* x, std::uint16_t* y, std::int64_t n) {
  constexpr std::int64_t kBlock = 1024;
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) {
    alignas(64) float tmp[kBlock];
    const std::int64_t lo = b * kBlock, m = std::min(kBlock, n - lo);
    gelu_f32(x + lo, tmp, m);
    to_bf16_serial(tmp, y + lo, m);
  }
}

}  // namespace

void register_bf16_writers(KernelRegistry& r) {
  const KernelFactory* prev = r.find("gelu");
  SHOAL_CHECK(prev != nullptr, "no kernel for gelu");
  KernelFactory f32 = *prev;
  r.add("gelu", [f32](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    if (n.outputs[0].dtype != DType::kBF16) return f32(n, in);
    if (in[0].dtype != DType::kF32 || blocked_input(n, 0) || blocked_output(n, 0))
      return failed_precondition("{}: a bf16 GELU reads plain f32, not {}", n.label(), in[0].str());
    return make_fn(
        [](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
          gelu_to_bf16(x[0].data<float>(), static_cast<std::uint16_t*>(y[0].raw_data()),
                       x[0].numel());
          return ok_status();
        },
        "bf16-writer");
  });
}

}  // namespace shoal::runtime::cpu
