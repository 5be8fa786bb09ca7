// Vectorized f32 exp and row reductions shared by the softmax family and
// the cross-entropy loss. Internal to runtime/cpu.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace shoal::runtime::cpu::vec {

// exp(x) in f32 with plain arithmetic GCC vectorizes (no libm call):
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, Cephes' degree-6
// polynomial for e^r, then 2^n through the exponent bits. Within 2 ulp of
// expf over [-87, 88]; below, clamped (e^-87 ~ 1.6e-38: softmax's masked
// or -inf entries come out 0 against the row's maximum of 1).
inline float exp_f32(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}
inline double exp_any(double x) { return std::exp(x); }
inline float exp_any(float x) { return exp_f32(x); }

#if defined(__AVX512F__)
// GCC 12's AVX-512 headers trip its own maybe-uninitialized warning
// (_mm512_max_ps's unused pass-through operand).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// exp_f32 on 16 lanes; 2^n by vscalefps.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// Horizontal max and sum through memory: GCC 12's _mm512_reduce_* warn
// (maybe-uninitialized) inside their own headers.
inline float lanes_max(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  return *std::max_element(t, t + 16);
}
inline float lanes_sum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0;
  for (float f : t) s += f;
  return s;
}

inline __mmask16 first(std::int64_t k) {
  return k >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << k) - 1);
}
#pragma GCC diagnostic pop
#endif

// log(sum(exp(x))) over n > 0 floats, its max subtracted first; f32 lanes.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline float logsumexp(const float* x, std::int64_t n) {
#if defined(__AVX512F__)
  const __m512 low = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vmx = low;
  for (std::int64_t j = 0; j < n; j += 16)
    vmx = _mm512_max_ps(vmx, _mm512_mask_loadu_ps(low, first(n - j), x + j));
  const float mx = lanes_max(vmx);
  const __m512 shift = _mm512_set1_ps(-mx);
  __m512 vsum = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = first(n - j);
    vsum = _mm512_add_ps(
        vsum, _mm512_maskz_mov_ps(m, exp16(_mm512_add_ps(_mm512_maskz_loadu_ps(m, x + j), shift))));
  }
  return mx + std::log(lanes_sum(vsum));
#else
  const float mx = *std::max_element(x, x + n);
  float sum = 0;
  for (std::int64_t j = 0; j < n; ++j) sum += exp_f32(x[j] - mx);
  return mx + std::log(sum);
#endif
}
#pragma GCC diagnostic pop

// One row's mean and 1/std, in two passes (mean, then squared deviations:
// no cancellation): layer norm's forward, its gradient and its bf16 writer.
inline void row_stats(const float* p, std::int64_t d, float eps, float* mean, float* rstd) {
  const auto fd = static_cast<float>(d);
  float m = 0, v = 0;
#pragma omp simd reduction(+ : m)
  for (std::int64_t i = 0; i < d; ++i) m += p[i];
  m /= fd;
#pragma omp simd reduction(+ : v)
  for (std::int64_t i = 0; i < d; ++i) v += (p[i] - m) * (p[i] - m);
  *mean = m;
  *rstd = 1.0f / std::sqrt(v / fd + eps);
}

}  // namespace shoal::runtime::cpu::vec
