// Batch and layer norm for any float dtype, in both layouts (plain NCHW
// and the blocked [N, C/16, H*W, 16] of kernels_internal.h), forward and
// backward. Sums are taken in a fixed order, so results do not depend on
// the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/layer_norm_rows.h"
#include "runtime/cpu/vec_math.h"

namespace shoal::runtime::cpu {
namespace {

// Batch norm over the blocked layout [N, C/16, H*W, 16] (see
// kernels_internal.h): the 16 channels of a block are SIMD lanes. Per-row
// partial sums (one row = one image's H*W for 16 channels) are taken in T
// in parallel over (image, block), then summed over images in a fixed order
// in double, so the result does not depend on the thread count.
constexpr std::int64_t kB = kBlockChannels;

// x as T: as stored, or (--precision bf16: a convolution wrote it in bf16)
// bf16 bits widened to f32.
template <typename T, typename X>
inline T wide(X v) {
  if constexpr (std::is_same_v<X, std::uint16_t>)
    return bf16_to_float(BF16{v});
  else
    return v;
}

std::vector<double>& bn_scratch(std::size_t n) {
  thread_local std::vector<double> v;
  if (v.size() < n) v.resize(n);
  return v;
}

// One channel's batch-norm statistics, shared by both layouts: in training
// from the sums of (x - k0) and (x - k0)^2 over cnt values (the shift k0
// against cancellation: var = E[(x-k0)^2] - E[x-k0]^2), else the running
// statistics in[3], in[4]. Writes mean and var; returns {scale, shift}.
template <typename T>
std::pair<T, T> bn_channel(bool training, double eps, std::span<const Tensor> in, std::int64_t ch,
                           double k0, double s1, double s2, double cnt, T* mean, T* var) {
  double m, v;
  if (training) {
    m = k0 + s1 / cnt;
    v = std::max(0.0, s2 / cnt - (s1 / cnt) * (s1 / cnt));
  } else {
    m = in[3].data<T>()[ch];
    v = in[4].data<T>()[ch];
  }
  mean[ch] = static_cast<T>(m);
  var[ch] = static_cast<T>(v);
  const T scale = static_cast<T>(in[1].data<T>()[ch] / std::sqrt(v + eps));
  return {scale, static_cast<T>(in[2].data<T>()[ch] - m * scale)};
}

// y = max(x sc + sh, low) over n values of one blocked row (sc, sh per
// lane) or of one channel (scalars), stored as T or, under --precision
// bf16 (a fused ReLU that writes bf16), as bf16 bits in chunks in L1.
template <typename T, typename X, typename Coef>
void bn_y(const X* p, Coef sc, Coef sh, T low, std::int64_t n, T* q) {
  if constexpr (std::is_pointer_v<Coef>) {
    for (std::int64_t s = 0; s < n / kB; ++s) {
#pragma omp simd
      for (std::int64_t l = 0; l < kB; ++l)
        q[s * kB + l] = std::max(wide<T>(p[s * kB + l]) * sc[l] + sh[l], low);
    }
  } else {
#pragma omp simd
    for (std::int64_t s = 0; s < n; ++s) q[s] = std::max(wide<T>(p[s]) * sc + sh, low);
  }
}
template <typename X, typename Coef>
void bn_y(const X* p, Coef sc, Coef sh, float low, std::int64_t n, std::uint16_t* q) {
  // Chunks of 512 keep a blocked row's lanes in place (512 % 16 == 0).
  chunks_to_bf16(
      q, n, [&](std::int64_t lo, std::int64_t k, float* t) { bn_y(p + lo, sc, sh, low, k, t); });
}

// relu: the output ReLU'd as stored (activation "relu", fuse_activations).
// x of type X, y of type Y (T, or bf16 bits).
template <typename T, typename X = T, typename Y = T>
void batch_norm_fwd_blocked(bool training, double eps, bool relu, std::span<const Tensor> in,
                            std::span<Tensor> out) {
  const Shape& xs = in[0].shape();
  const std::int64_t n = xs[0], c = xs[1], cb = c / kB, sp = xs[2] * xs[3];
  const X* x = static_cast<const X*>(in[0].raw_data());
  Y* y = static_cast<Y*>(out[0].raw_data());
  T* mean = out[1].data<T>();
  T* var = out[2].data<T>();
  std::vector<double>& part = bn_scratch(static_cast<std::size_t>(2 * n * c + 2 * c));
  double* p1 = part.data();    // [n][c] sum(x - k)
  double* p2 = p1 + n * c;     // [n][c] sum((x - k)^2)
  double* scale = p2 + n * c;  // [c]
  double* shift = scale + c;   // [c]
  if (training) {
#pragma omp parallel for collapse(2) schedule(static)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t b = 0; b < cb; ++b) {
        const X* k0 = x + b * sp * kB;  // image 0, first pixel: the shift
        const X* p = x + (i * cb + b) * sp * kB;
        T a[kB] = {}, q[kB] = {}, k[kB];
        for (std::int64_t l = 0; l < kB; ++l) k[l] = wide<T>(k0[l]);
        for (std::int64_t s = 0; s < sp; ++s) {
#pragma omp simd
          for (std::int64_t l = 0; l < kB; ++l) {
            T d = wide<T>(p[s * kB + l]) - k[l];
            a[l] += d;
            q[l] += d * d;
          }
        }
        for (std::int64_t l = 0; l < kB; ++l) {
          p1[i * c + b * kB + l] = a[l];
          p2[i * c + b * kB + l] = q[l];
        }
      }
  }
  const double cnt = static_cast<double>(std::max<std::int64_t>(n * sp, 1));
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double s1 = 0, s2 = 0;
    for (std::int64_t i = 0; training && i < n; ++i) {
      s1 += p1[i * c + ch];
      s2 += p2[i * c + ch];
    }
    const double k0 = wide<T>(x[(ch / kB) * sp * kB + ch % kB]);
    auto [sc, sh] = bn_channel<T>(training, eps, in, ch, k0, s1, s2, cnt, mean, var);
    scale[ch] = sc;
    shift[ch] = sh;
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t b = 0; b < cb; ++b) {
      T sc[kB], sh[kB];
      for (std::int64_t l = 0; l < kB; ++l) {
        sc[l] = static_cast<T>(scale[b * kB + l]);
        sh[l] = static_cast<T>(shift[b * kB + l]);
      }
      const T low = relu ? T(0) : -std::numeric_limits<T>::infinity();
      const std::int64_t at = (i * cb + b) * sp * kB;
      bn_y(x + at, sc, sh, low, sp * kB, y + at);
    }
}

// dx = A dy + B x + C over n values of one channel (A, B, C scalars) or of
// one blocked row (lanes: A, B, C per lane), stored as T or, under
// --precision bf16 (a bf16 writer: the convolutions read dx in bf16), as
// bf16 bits in chunks that stay in L1.
template <typename T, typename X, typename Coef>
void bn_dx(const X* p, const T* g, Coef A, Coef B, Coef C, std::int64_t n, T* q) {
  if constexpr (std::is_pointer_v<Coef>) {
    for (std::int64_t s = 0; s < n / kB; ++s) {
#pragma omp simd
      for (std::int64_t l = 0; l < kB; ++l)
        q[s * kB + l] = A[l] * g[s * kB + l] + B[l] * wide<T>(p[s * kB + l]) + C[l];
    }
  } else {
#pragma omp simd
    for (std::int64_t s = 0; s < n; ++s) q[s] = A * g[s] + B * wide<T>(p[s]) + C;
  }
}
template <typename X, typename Coef>
void bn_dx(const X* p, const float* g, Coef A, Coef B, Coef C, std::int64_t n, std::uint16_t* q) {
  // Chunks of 512 keep a blocked row's lanes in place (512 % 16 == 0).
  chunks_to_bf16(q, n, [&](std::int64_t lo, std::int64_t k, float* t) {
    bn_dx(p + lo, g + lo, A, B, C, k, t);
  });
}

// in: x, gamma, mean, var, dy -> dx, dgamma, dbeta; x, dy and dx blocked;
// dx of type O (T, or bf16 bits from f32), x of type X (T, or bf16 bits).
template <typename T, typename O = T, typename X = T>
void batch_norm_bwd_blocked(bool training, double eps, std::span<const Tensor> in,
                            std::span<Tensor> out) {
  const Shape& xs = in[0].shape();
  const std::int64_t n = xs[0], c = xs[1], cb = c / kB, sp = xs[2] * xs[3];
  const double cnt = static_cast<double>(std::max<std::int64_t>(n * sp, 1));
  const X* x = static_cast<const X*>(in[0].raw_data());
  const T* dy = in[4].data<T>();
  O* dx = static_cast<O*>(out[0].raw_data());
  std::vector<double>& part = bn_scratch(static_cast<std::size_t>(2 * n * c + 3 * c));
  double* p1 = part.data();  // [n][c] sum(dy)
  double* p2 = p1 + n * c;   // [n][c] sum(dy * (x - mean))
  double* ca = p2 + n * c;   // dx = A dy + B x + C per channel
  double* cbb = ca + c;
  double* cc = cbb + c;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t b = 0; b < cb; ++b) {
      T mt[kB], a[kB] = {}, q[kB] = {};
      for (std::int64_t l = 0; l < kB; ++l) mt[l] = in[2].data<T>()[b * kB + l];
      const X* p = x + (i * cb + b) * sp * kB;
      const T* g = dy + (i * cb + b) * sp * kB;
      for (std::int64_t s = 0; s < sp; ++s) {
#pragma omp simd
        for (std::int64_t l = 0; l < kB; ++l) {
          a[l] += g[s * kB + l];
          q[l] += g[s * kB + l] * (wide<T>(p[s * kB + l]) - mt[l]);
        }
      }
      for (std::int64_t l = 0; l < kB; ++l) {
        p1[i * c + b * kB + l] = a[l];
        p2[i * c + b * kB + l] = q[l];
      }
    }
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const double m = in[2].data<T>()[ch],
                 rstd = 1.0 / std::sqrt(static_cast<double>(in[3].data<T>()[ch]) + eps);
    double sdy = 0, sdyx = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      sdy += p1[i * c + ch];
      sdyx += p2[i * c + ch];
    }
    sdyx *= rstd;
    out[1].data<T>()[ch] = static_cast<T>(sdyx);
    out[2].data<T>()[ch] = static_cast<T>(sdy);
    const double gr = in[1].data<T>()[ch] * rstd;
    ca[ch] = static_cast<T>(gr);
    cbb[ch] = static_cast<T>(training ? -gr * rstd * sdyx / cnt : 0.0);
    cc[ch] = static_cast<T>(training ? -gr * sdy / cnt + gr * rstd * sdyx / cnt * m : 0.0);
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t b = 0; b < cb; ++b) {
      T A[kB], B[kB], C[kB];
      for (std::int64_t l = 0; l < kB; ++l) {
        A[l] = static_cast<T>(ca[b * kB + l]);
        B[l] = static_cast<T>(cbb[b * kB + l]);
        C[l] = static_cast<T>(cc[b * kB + l]);
      }
      const std::int64_t at = (i * cb + b) * sp * kB;
      bn_dx(x + at, dy + at, A, B, C, sp * kB, dx + at);
    }
}

template <typename T, typename X = T, typename Y = T>
void batch_norm_fwd(const Node& node, std::span<const Tensor> in, std::span<Tensor> out) {
  bool training = node.attrs.get_int_or("training", 1) != 0;
  double eps = node.attrs.get_float_or("eps", 1e-5);
  // A fused ReLU (activation "relu") stores max(0, y); else max(-inf, y) = y.
  const T low = node.attrs.get_string_or("activation", "") == "relu"
                    ? T(0)
                    : -std::numeric_limits<T>::infinity();
  const Shape& xs = in[0].shape();
  std::int64_t n = xs[0], c = xs[1], sp = num_elements(xs) / std::max<std::int64_t>(n * c, 1);
  const X* x = static_cast<const X*>(in[0].raw_data());
  Y* y = static_cast<Y*>(out[0].raw_data());
  T* mean = out[1].data<T>();
  T* var = out[2].data<T>();
  const double cnt = static_cast<double>(std::max<std::int64_t>(n * sp, 1));
#pragma omp parallel for schedule(static)
  for (std::int64_t ch = 0; ch < c; ++ch) {
    // One pass, shifted by the channel's first value: vectorized partial
    // sums per row in T, rows summed in double.
    const T k0 = n * sp > 0 ? wide<T>(x[ch * sp]) : T(0);
    double s1 = 0, s2 = 0;
    if (training) {
      for (std::int64_t i = 0; i < n; ++i) {
        const X* p = x + (i * c + ch) * sp;
        T a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
        for (std::int64_t s = 0; s < sp; ++s) {
          T d = wide<T>(p[s]) - k0;
          a += d;
          b += d * d;
        }
        s1 += a;
        s2 += b;
      }
    }
    auto [scale, shift] = bn_channel<T>(training, eps, in, ch, k0, s1, s2, cnt, mean, var);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t at = (i * c + ch) * sp;
      bn_y(x + at, scale, shift, low, sp, y + at);
    }
  }
}

// in: x, gamma, mean, var, dy -> dx, dgamma, dbeta; dx of type O, x of type X.
template <typename T, typename O = T, typename X = T>
void batch_norm_bwd(const Node& node, std::span<const Tensor> in, std::span<Tensor> out) {
  bool training = node.attrs.get_int_or("training", 1) != 0;
  double eps = node.attrs.get_float_or("eps", 1e-5);
  const Shape& xs = in[0].shape();
  std::int64_t n = xs[0], c = xs[1], sp = num_elements(xs) / std::max<std::int64_t>(n * c, 1);
  double cnt = static_cast<double>(std::max<std::int64_t>(n * sp, 1));
  const X* x = static_cast<const X*>(in[0].raw_data());
  const T* dy = in[4].data<T>();
  O* dx = static_cast<O*>(out[0].raw_data());
#pragma omp parallel for schedule(static)
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double m = in[2].data<T>()[ch],
           rstd = 1.0 / std::sqrt(static_cast<double>(in[3].data<T>()[ch]) + eps);
    const T mt = static_cast<T>(m);
    double sdy = 0, sdyx = 0;  // sum(dy), sum(dy * (x - m)); rows in T, vectorized
    for (std::int64_t i = 0; i < n; ++i) {
      const X* p = x + (i * c + ch) * sp;
      const T* g = dy + (i * c + ch) * sp;
      T a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
      for (std::int64_t s = 0; s < sp; ++s) {
        a += g[s];
        b += g[s] * (wide<T>(p[s]) - mt);
      }
      sdy += a;
      sdyx += b;
    }
    sdyx *= rstd;
    out[1].data<T>()[ch] = static_cast<T>(sdyx);
    out[2].data<T>()[ch] = static_cast<T>(sdy);
    // dx = gr (dy - sdy/cnt - xh sdyx/cnt) = A dy + B x + C.
    double gr = in[1].data<T>()[ch] * rstd;
    const T A = static_cast<T>(gr);
    const T B = static_cast<T>(training ? -gr * rstd * sdyx / cnt : 0.0);
    const T C = static_cast<T>(training ? -gr * sdy / cnt + gr * rstd * sdyx / cnt * m : 0.0);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t at = (i * c + ch) * sp;
      bn_dx(x + at, dy + at, A, B, C, sp, dx + at);
    }
  }
}

// f32 layer norm as the transformer runs it: rows in parallel, each row's
// statistics accumulated in f32 lanes, the gradient's gamma/beta sums in
// partials per block of rows added at the end. The f64 template below
// stays the reference the gradient checks use.

using vec::row_stats;

void layer_norm_bwd_f32(double eps, std::span<const Tensor> in, std::span<Tensor> out) {
  const std::int64_t d = in[0].shape().back(), rows = in[0].numel() / std::max<std::int64_t>(d, 1);
  const float* x = in[0].data<float>();
  const float* g = in[1].data<float>();
  const float* dy = in[2].data<float>();
  const float* res = in.size() == 4 ? in[3].data<float>() : nullptr;
  float* dx = out[0].data<float>();
  // gamma/beta partials per fixed block of rows (not per thread), added in
  // block order: the same sums on any thread count.
  const std::int64_t blocks = std::min<std::int64_t>(rows, 32);
  std::vector<float> part(static_cast<std::size_t>(blocks * 2 * d), 0.0f);
  const auto fd = static_cast<float>(d), feps = static_cast<float>(eps);
#pragma omp parallel for if (rows * d > kParallelGrain) schedule(static)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    float* dg = part.data() + blk * 2 * d;
    float* db = dg + d;
    for (std::int64_t r = rows * blk / blocks; r < rows * (blk + 1) / blocks; ++r) {
      const float* p = x + r * d;
      const float* gy = dy + r * d;
      float m = 0, rstd = 0, s1 = 0, s2 = 0;
      row_stats(p, d, feps, &m, &rstd);
#pragma omp simd reduction(+ : s1, s2)
      for (std::int64_t i = 0; i < d; ++i) {
        const float xh = (p[i] - m) * rstd, dxh = gy[i] * g[i];
        s1 += dxh;
        s2 += dxh * xh;
        dg[i] += gy[i] * xh;
        db[i] += gy[i];
      }
      s1 /= fd;
      s2 /= fd;
      float* q = dx + r * d;
      if (res == nullptr) {
#pragma omp simd
        for (std::int64_t i = 0; i < d; ++i)
          q[i] = rstd * (gy[i] * g[i] - s1 - (p[i] - m) * rstd * s2);
      } else {
        const float* pr = res + r * d;
#pragma omp simd
        for (std::int64_t i = 0; i < d; ++i)
          q[i] = rstd * (gy[i] * g[i] - s1 - (p[i] - m) * rstd * s2) + pr[i];
      }
    }
  }
  float* og = out[1].data<float>();
  float* ob = out[2].data<float>();
  for (std::int64_t i = 0; i < d; ++i) {
    float sg = 0, sb = 0;
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      sg += part[static_cast<std::size_t>(blk * 2 * d + i)];
      sb += part[static_cast<std::size_t>(blk * 2 * d + d + i)];
    }
    og[i] = sg;
    ob[i] = sb;
  }
}

template <typename T>
void layer_norm_fwd(double eps, std::span<const Tensor> in, std::span<Tensor> out) {
  if constexpr (std::is_same_v<T, float>) return layer_norm_f32(eps, in, out[0]);
  std::int64_t d = in[0].shape().back(), rows = in[0].numel() / std::max<std::int64_t>(d, 1);
  const T* x = in[0].data<T>();
  const T* g = in[1].data<T>();
  const T* b = in[2].data<T>();
  T* y = out[0].data<T>();
#pragma omp parallel for if (rows * d > kParallelGrain) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* p = x + r * d;
    double m = 0, v = 0;
    for (std::int64_t i = 0; i < d; ++i) m += p[i];
    m /= static_cast<double>(d);
    for (std::int64_t i = 0; i < d; ++i) v += (p[i] - m) * (p[i] - m);
    double rstd = 1.0 / std::sqrt(v / static_cast<double>(d) + eps);
    for (std::int64_t i = 0; i < d; ++i)
      y[r * d + i] = static_cast<T>((p[i] - m) * rstd * g[i] + b[i]);
  }
}

// in: x, gamma, dy[, r] -> dx (+ r), dgamma, dbeta.
template <typename T>
void layer_norm_bwd(double eps, std::span<const Tensor> in, std::span<Tensor> out) {
  if constexpr (std::is_same_v<T, float>) return layer_norm_bwd_f32(eps, in, out);
  std::int64_t d = in[0].shape().back(), rows = in[0].numel() / std::max<std::int64_t>(d, 1);
  const T* x = in[0].data<T>();
  const T* g = in[1].data<T>();
  const T* dy = in[2].data<T>();
  const T* res = in.size() == 4 ? in[3].data<T>() : nullptr;
  T* dx = out[0].data<T>();
  std::vector<double> dg(static_cast<std::size_t>(d), 0.0), db(static_cast<std::size_t>(d), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* p = x + r * d;
    const T* gy = dy + r * d;
    double m = 0, v = 0;
    for (std::int64_t i = 0; i < d; ++i) m += p[i];
    m /= static_cast<double>(d);
    for (std::int64_t i = 0; i < d; ++i) v += (p[i] - m) * (p[i] - m);
    double rstd = 1.0 / std::sqrt(v / static_cast<double>(d) + eps);
    double s1 = 0, s2 = 0;
    for (std::int64_t i = 0; i < d; ++i) {
      double xh = (p[i] - m) * rstd, dxh = gy[i] * g[i];
      s1 += dxh;
      s2 += dxh * xh;
      dg[i] += gy[i] * xh;
      db[i] += gy[i];
    }
    for (std::int64_t i = 0; i < d; ++i) {
      double xh = (p[i] - m) * rstd, dxh = gy[i] * g[i];
      dx[r * d + i] = static_cast<T>(
          rstd * (dxh - s1 / static_cast<double>(d) - xh * s2 / static_cast<double>(d)) +
          (res == nullptr ? 0.0 : static_cast<double>(res[r * d + i])));
    }
  }
  for (std::int64_t i = 0; i < d; ++i) {
    out[1].data<T>()[i] = static_cast<T>(dg[i]);
    out[2].data<T>()[i] = static_cast<T>(db[i]);
  }
}

// add_layer_norm (runtime::fuse_residual_norms): a, b, gamma, beta -> y =
// layer_norm(a + b), s = a + b. f32: each row of the sum written and
// normalized while in L1, y f32 or bf16; other types: the sum, then the
// reference layer norm of it (the gradient checks' f64).
template <typename T>
void add_layer_norm(double eps, std::span<const Tensor> in, std::span<Tensor> out) {
  const std::int64_t d = in[0].shape().back(), rows = in[0].numel() / std::max<std::int64_t>(d, 1);
  if constexpr (std::is_same_v<T, float>) {
    const SumRows src{in[0].data<float>(), in[1].data<float>(), out[1].data<float>()};
    layer_norm_into(eps, rows, d, src, in[2].data<float>(), in[3].data<float>(), out[0]);
  } else {
    const T *a = in[0].data<T>(), *b = in[1].data<T>();
    T* s = out[1].data<T>();
    for (std::int64_t i = 0; i < rows * d; ++i) s[i] = a[i] + b[i];
    const Tensor norm_in[3] = {out[1], in[2], in[3]};
    layer_norm_fwd<T>(eps, norm_in, out.first(1));
  }
}

// Batch norm in f32 reading x of type X and writing y of type Y.
template <typename X, typename Y>
Result<std::unique_ptr<Kernel>> bn_fwd_kernel(bool blocked, bool training, double eps, bool relu,
                                              const char* impl) {
  return make_fn(
      [=](const KernelContext& c, std::span<const Tensor> x, std::span<Tensor> y) {
        if (blocked)
          batch_norm_fwd_blocked<float, X, Y>(training, eps, relu, x, y);
        else
          batch_norm_fwd<float, X, Y>(c.node, x, y);
        return ok_status();
      },
      impl);
}

// Batch norm's gradient in f32 reading x of type X and writing dx of type O.
template <typename O, typename X>
Result<std::unique_ptr<Kernel>> bn_bwd_kernel(bool blocked, bool training, double eps,
                                              const char* impl) {
  return make_fn(
      [=](const KernelContext& c, std::span<const Tensor> x, std::span<Tensor> y) {
        if (blocked)
          batch_norm_bwd_blocked<float, O, X>(training, eps, x, y);
        else
          batch_norm_bwd<float, O, X>(c.node, x, y);
        return ok_status();
      },
      impl);
}

}  // namespace

void register_norms(KernelRegistry& r) {
  // The layout is fixed at compile time (reading attributes in a run would
  // allocate).
  r.add("batch_norm", [](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    const bool blocked = blocked_input(n, 0);
    const bool training = n.attrs.get_int_or("training", 1) != 0;
    const double eps = n.attrs.get_float_or("eps", 1e-5);
    const bool relu = n.attrs.get_string_or("activation", "") == "relu";
    // --precision bf16 (graph/precision.cc): x a convolution wrote in bf16,
    // y a fused ReLU writes in bf16.
    using U = std::uint16_t;
    const bool x16 = in[0].dtype == DType::kBF16, y16 = n.outputs[0].dtype == DType::kBF16;
    if (x16 && y16) return bn_fwd_kernel<U, U>(blocked, training, eps, relu, "bf16");
    if (x16) return bn_fwd_kernel<U, float>(blocked, training, eps, relu, "bf16-reader");
    if (y16) return bn_fwd_kernel<float, U>(blocked, training, eps, relu, "bf16-writer");
    if (blocked) return FLOAT_KERNEL(batch_norm_fwd_blocked<T>(training, eps, relu, in, out));
    return FLOAT_KERNEL(batch_norm_fwd<T>(c.node, in, out));
  });
  r.add("batch_norm_grad", [](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    const bool blocked = blocked_input(n, 0);
    const bool training = n.attrs.get_int_or("training", 1) != 0;
    const double eps = n.attrs.get_float_or("eps", 1e-5);
    const bool x16 = in[0].dtype == DType::kBF16, dx16 = n.outputs[0].dtype == DType::kBF16;
    if (x16 || dx16) {  // x read or dx written in bf16 (graph/precision.cc)
      if (in[4].dtype != DType::kF32)
        return failed_precondition("{}: bf16 x or dx goes with an f32 dy, not {}", n.label(),
                                   in[4].str());
      using U = std::uint16_t;
      if (x16 && dx16) return bn_bwd_kernel<U, U>(blocked, training, eps, "bf16-writer");
      if (x16) return bn_bwd_kernel<float, U>(blocked, training, eps, "bf16-reader");
      return bn_bwd_kernel<U, float>(blocked, training, eps, "bf16-writer");
    }
    if (blocked) return FLOAT_KERNEL(batch_norm_bwd_blocked<T>(training, eps, in, out));
    return FLOAT_KERNEL(batch_norm_bwd<T>(c.node, in, out));
  });
  r.add("layer_norm", [](const Node& n, const Inputs&) {
    double eps = n.attrs.get_float_or("eps", 1e-5);
    return FLOAT_KERNEL(layer_norm_fwd<T>(eps, in, out));
  });
  r.add("layer_norm_grad", [](const Node& n, const Inputs&) {
    double eps = n.attrs.get_float_or("eps", 1e-5);
    return FLOAT_KERNEL(layer_norm_bwd<T>(eps, in, out));
  });
  r.add("add_layer_norm", [](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    const double eps = n.attrs.get_float_or("eps", 1e-5);
    for (std::size_t i = 0; i < in.size(); ++i)
      if (blocked_input(n, i))
        return failed_precondition("{}: add_layer_norm reads the plain layout", n.label());
    if (in[0].dtype == DType::kF32)
      return make_fn(
          [eps](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
            add_layer_norm<float>(eps, x, y);
            return ok_status();
          },
          n.outputs[0].dtype == DType::kBF16 ? "bf16-writer" : "rows");
    if (n.outputs[0].dtype != in[0].dtype)
      return failed_precondition("{}: a {} add_layer_norm writes {}, not {}", n.label(),
                                 dtype_name(in[0].dtype), dtype_name(in[0].dtype),
                                 dtype_name(n.outputs[0].dtype));
    return FLOAT_KERNEL(add_layer_norm<T>(eps, in, out));
  });
}

}  // namespace shoal::runtime::cpu
