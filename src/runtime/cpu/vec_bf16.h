// Loads and stores of f32 values kept as f32 or bf16 in memory, for the
// kernels that read and write either (GELU, softmax and their gradients
// under --precision bf16): one name for both widths, so a kernel is one
// template instantiated per operand type. 16 lanes with a lane mask on
// AVX-512 (BW and VL for the 16-bit moves), one value otherwise. Internal
// to runtime/cpu.
#pragma once

#include <cstdint>

#include "shoal/tensor/dtype.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define SHOAL_VEC_BF16 1
#endif

namespace shoal::runtime::cpu::vec {

// bf16 is stored as its bits.
using bf16_t = std::uint16_t;

inline float widen(float v) { return v; }
inline float widen(bf16_t h) { return bf16_to_float(BF16{h}); }
inline void put(float* p, float v) { *p = v; }
inline void put(bf16_t* p, float v) { *p = float_to_bf16(v).bits; }

#if defined(SHOAL_VEC_BF16)
// GCC 12's AVX-512 headers trip its own maybe-uninitialized warning (the
// unused pass-through operands), as in vec_math.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Lanes outside m read 0 and are not written.
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const bf16_t* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Asks for the cache line 512 bytes past p. GELU's gradient read its
// operands from DRAM at 0.67 ms for the base GPT's [2048, 512] in bf16 and
// from cache at 0.41 ms: the compute between loads left the hardware
// prefetcher behind (Zen 4 VM); a software prefetch per vector hides it.
// Past the end of an array it is harmless (prefetches do not fault).
template <typename T>
inline void prefetch_ahead(const T* p) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + 512),
               _MM_HINT_T0);
}
inline void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
// Rounded to nearest even. VCVTNEPS2BF16 where the CPU has AVX-512 BF16
// (it reads f32 subnormals as zero, as the casts do); else the same
// rounding in integer lanes, NaN kept quiet.
inline void store16(bf16_t* p, __m512 v, __mmask16 m) {
#if defined(__AVX512BF16__)
  const auto h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#else
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  const __m256i h = _mm512_cvtepi32_epi16(r);
#endif
  _mm256_mask_storeu_epi16(p, m, h);
}
#pragma GCC diagnostic pop
#endif

}  // namespace shoal::runtime::cpu::vec
