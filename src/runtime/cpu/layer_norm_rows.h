// Layer norm's forward row loop, shared by the f32 kernel (norm_ref.cc) and
// the bf16 writer (bf16_writers.cc): they differ only in how a row is stored.
#pragma once

#include <algorithm>
#include <span>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/vec_math.h"

namespace shoal::runtime::cpu {

// x (in[0]) over rows of d, gamma in[1], beta in[2]: each row's mean and
// 1/std in f32 (rows in parallel when large), then store(r, x_row, mean,
// rstd, gamma, beta) writes row r's (x - mean) * rstd * gamma + beta.
template <typename Store>
void layer_norm_rows(double eps, std::span<const Tensor> in, Store store) {
  const std::int64_t d = in[0].shape().back(), rows = in[0].numel() / std::max<std::int64_t>(d, 1);
  const float* x = in[0].data<float>();
  const float* g = in[1].data<float>();
  const float* b = in[2].data<float>();
  const auto feps = static_cast<float>(eps);
#pragma omp parallel for if (rows * d > kParallelGrain) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* p = x + r * d;
    float m = 0, rstd = 0;
    vec::row_stats(p, d, feps, &m, &rstd);
    store(r, p, m, rstd, g, b);
  }
}

}  // namespace shoal::runtime::cpu
