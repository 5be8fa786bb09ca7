// Layer norm's forward row loop, shared by the f32 kernel and the residual
// add fused before it (norm_ref.cc) and the bf16 writer (bf16_writers.cc):
// they differ only in where a row comes from and how it is stored.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/vec_math.h"

namespace shoal::runtime::cpu {

// Rows read as they are.
struct PlainRows {
  const float* x;
  const float* row(std::int64_t r, std::int64_t d) const { return x + r * d; }
};
// Rows of a + b, written to s as they are made (add_layer_norm): the
// normalization then reads them from L1.
struct SumRows {
  const float *a, *b;
  float* s;
  const float* row(std::int64_t r, std::int64_t d) const {
    const float *pa = a + r * d, *pb = b + r * d;
    float* ps = s + r * d;
#pragma omp simd
    for (std::int64_t i = 0; i < d; ++i) ps[i] = pa[i] + pb[i];
    return ps;
  }
};

// Stores row r's (x - mean) * rstd * gamma + beta as f32 or as bf16 bits.
struct StoreF32 {
  float* y;
  void operator()(std::int64_t r, std::int64_t d, const float* p, float m, float rstd,
                  const float* g, const float* b) const {
    float* q = y + r * d;
#pragma omp simd
    for (std::int64_t i = 0; i < d; ++i) q[i] = (p[i] - m) * rstd * g[i] + b[i];
  }
};
struct StoreBF16 {
  std::uint16_t* y;
  void operator()(std::int64_t r, std::int64_t d, const float* p, float m, float rstd,
                  const float* g, const float* b) const {
    chunks_to_bf16(y + r * d, d, [&](std::int64_t lo, std::int64_t k, float* t) {
#pragma omp simd
      for (std::int64_t i = 0; i < k; ++i) t[i] = (p[lo + i] - m) * rstd * g[lo + i] + b[lo + i];
    });
  }
};

// rows x d values from src, gamma g, beta b: each row's mean and 1/std in
// f32 (rows in parallel when large), then store writes the normalized row.
template <typename Rows, typename Store>
void layer_norm_rows(double eps, std::int64_t rows, std::int64_t d, Rows src, const float* g,
                     const float* b, Store store) {
  const auto feps = static_cast<float>(eps);
#pragma omp parallel for if (rows * d > kParallelGrain) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* p = src.row(r, d);
    float m = 0, rstd = 0;
    vec::row_stats(p, d, feps, &m, &rstd);
    store(r, d, p, m, rstd, g, b);
  }
}

// Layer norm of the rows of src, gamma g, beta b, into y: f32 or bf16 by
// y's dtype.
template <typename Rows>
void layer_norm_into(double eps, std::int64_t rows, std::int64_t d, Rows src, const float* g,
                     const float* b, Tensor& y) {
  if (y.dtype() == DType::kBF16)
    layer_norm_rows(eps, rows, d, src, g, b, StoreBF16{static_cast<std::uint16_t*>(y.raw_data())});
  else
    layer_norm_rows(eps, rows, d, src, g, b, StoreF32{y.data<float>()});
}

// Layer norm of x (in[0]) with gamma in[1] and beta in[2] into y, f32 or
// bf16 by y's dtype.
inline void layer_norm_f32(double eps, std::span<const Tensor> in, Tensor& y) {
  const std::int64_t d = in[0].shape().back(), rows = in[0].numel() / std::max<std::int64_t>(d, 1);
  layer_norm_into(eps, rows, d, PlainRows{in[0].data<float>()}, in[1].data<float>(),
                  in[2].data<float>(), y);
}

}  // namespace shoal::runtime::cpu
