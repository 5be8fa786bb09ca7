// Reference NN kernels for any float dtype: matmul/linear on BLAS, direct
// convolution and pooling loops, batch and layer norm. f32 matmul, linear,
// conv and pooling are overridden by oneDNN (onednn.cc); these stay the
// f64 path (gradient checks) and the oracle the oneDNN kernels are tested
// against.
#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "runtime/cpu/kernels_internal.h"

namespace shoal::runtime::cpu {
namespace {

void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(n));
}
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const double* a,
          std::int64_t lda, const double* b, std::int64_t ldb, double beta, double* c) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(n));
}

template <typename T>
void matmul_ref(const Tensor& a, const Tensor& b, Tensor& y, bool ta, bool tb) {
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  const Shape& ys = y.shape();
  std::size_t ra = as.size(), rb = bs.size(), ry = ys.size();
  std::int64_t m = ys[ry - 2], n = ys[ry - 1], k = ta ? as[ra - 2] : as[ra - 1];
  Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2), yb(ys.begin(), ys.end() - 2);
  Shape sa = broadcast_strides(ab, yb), sb = broadcast_strides(bb, yb);
  std::int64_t batches = num_elements(yb);
  std::int64_t lda = as[ra - 1], ldb = bs[rb - 1];
  for (std::int64_t t = 0; t < batches; ++t) {
    std::int64_t rem = t, ia = 0, ib = 0;
    for (int d = static_cast<int>(yb.size()) - 1; d >= 0; --d) {
      std::int64_t idx = rem % yb[d];
      rem /= yb[d];
      ia += idx * sa[d];
      ib += idx * sb[d];
    }
    T* c = y.data<T>() + t * m * n;
    if (k == 0) {
      std::fill(c, c + m * n, T(0));
      continue;
    }
    if (m == 0 || n == 0) continue;
    gemm(ta, tb, m, n, k, a.data<T>() + ia * as[ra - 2] * as[ra - 1], lda,
         b.data<T>() + ib * bs[rb - 2] * bs[rb - 1], ldb, T(0), c);
  }
}

template <typename T>
void linear_ref(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y, bool relu) {
  std::int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  T* py = y.data<T>();
  if (in == 0)
    std::fill(py, py + n * out, T(0));
  else if (n > 0 && out > 0)
    gemm(false, true, n, out, in, x.data<T>(), in, w.data<T>(), in, T(0), py);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < out; ++j) {
      T v = py[i * out + j] + (bias ? bias->data<T>()[j] : T(0));
      py[i * out + j] = relu && v < 0 ? T(0) : v;
    }
}

struct ConvGeom {
  std::int64_t n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups;
  static ConvGeom make(const Node& node, const Shape& x, const Shape& wt, const Shape& y) {
    auto st = node.attrs.get_ints_or("stride", {1, 1});
    auto pd = node.attrs.get_ints_or("padding", {0, 0});
    auto dl = node.attrs.get_ints_or("dilation", {1, 1});
    return ConvGeom{
        x[0], x[1],  x[2],  x[3],  wt[0], wt[2], wt[3], y[2],
        y[3], st[0], st[1], pd[0], pd[1], dl[0], dl[1], node.attrs.get_int_or("groups", 1)};
  }
};

// mode 0: y = conv(x, w); mode 1: dx from dy (y holds dy); mode 2: dw.
template <typename T>
void conv_ref(const ConvGeom& g, T* x, T* w, T* y, int mode) {
  std::int64_t cpg = g.c / g.groups, opg = g.o / g.groups;
#pragma omp parallel for collapse(2) if (mode != 2) schedule(static)
  for (std::int64_t ni = 0; ni < g.n; ++ni)
    for (std::int64_t oc = 0; oc < g.o; ++oc) {
      std::int64_t grp = oc / opg;
      for (std::int64_t oy = 0; oy < g.oh; ++oy)
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          T* yp = y + ((ni * g.o + oc) * g.oh + oy) * g.ow + ox;
          T acc = 0;
          for (std::int64_t ic = 0; ic < cpg; ++ic) {
            std::int64_t cc = grp * cpg + ic;
            for (std::int64_t ky = 0; ky < g.kh; ++ky) {
              std::int64_t iy = oy * g.sh - g.ph + ky * g.dh;
              if (iy < 0 || iy >= g.h) continue;
              for (std::int64_t kx = 0; kx < g.kw; ++kx) {
                std::int64_t ix = ox * g.sw - g.pw + kx * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                T* xp = x + ((ni * g.c + cc) * g.h + iy) * g.w + ix;
                T* wp = w + ((oc * cpg + ic) * g.kh + ky) * g.kw + kx;
                if (mode == 0)
                  acc += *xp * *wp;
                else if (mode == 1) {
#pragma omp atomic
                  *xp += *yp * *wp;
                } else {
                  *wp += *yp * *xp;
                }
              }
            }
          }
          if (mode == 0) *yp = acc;
        }
    }
}

// Pooling window geometry, read from the node's attributes at compile time.
struct PoolGeom {
  std::array<std::int64_t, 2> k{}, st{}, pd{};
  static PoolGeom make(const Node& node) {
    auto k = node.attrs.get_ints_or("kernel", {1, 1});
    auto st = node.attrs.get_ints_or("stride", k);
    auto pd = node.attrs.get_ints_or("padding", {0, 0});
    return PoolGeom{{k[0], k[1]}, {st[0], st[1]}, {pd[0], pd[1]}};
  }
};

template <typename T>
void pool_ref(const PoolGeom& geo, const Tensor& x, const Tensor* dy, Tensor& out, bool is_max,
              bool backward) {
  const auto& k = geo.k;
  const auto& st = geo.st;
  const auto& pd = geo.pd;
  const Shape& xs = x.shape();
  std::int64_t nc = xs[0] * xs[1], h = xs[2], w = xs[3];
  std::int64_t oh = (h + 2 * pd[0] - k[0]) / st[0] + 1, ow = (w + 2 * pd[1] - k[1]) / st[1] + 1;
  const T* px = x.data<T>();
  T* po = out.data<T>();
  if (backward && is_max && st == k && pd[0] == 0 && pd[1] == 0) {
    // Non-overlapping windows (the usual 2x2/2): each input cell gets at
    // most one gradient, so a plane is zeroed and scattered by one thread.
    const T* pdy = dy->data<T>();
#pragma omp parallel for schedule(static)
    for (std::int64_t p = 0; p < nc; ++p) {
      T* plane = po + p * h * w;
      const T* xin = px + p * h * w;
      if (k[0] == 2 && k[1] == 2) {
        // Branch-free 2x2: every covered cell is written once (g or 0), so
        // no separate zeroing pass; uncovered edge cells are zeroed after.
        const T* gy = pdy + p * oh * ow;
        for (std::int64_t oy = 0; oy < oh; ++oy) {
          const T* r0 = xin + 2 * oy * w;
          const T* r1 = r0 + w;
          T* q0 = plane + 2 * oy * w;
          T* q1 = q0 + w;
#pragma omp simd
          for (std::int64_t ox = 0; ox < ow; ++ox) {
            std::int64_t i = 2 * ox;
            T a = r0[i], b = r0[i + 1], c2 = r1[i], d = r1[i + 1];
            // First maximum in window order (a, b, c, d), as the forward.
            T mab = b > a ? b : a, mcd = d > c2 ? d : c2;
            bool right = mcd > mab;
            T g = gy[oy * ow + ox], z = T(0);
            q0[i] = (!right && !(b > a)) ? g : z;
            q0[i + 1] = (!right && (b > a)) ? g : z;
            q1[i] = (right && !(d > c2)) ? g : z;
            q1[i + 1] = (right && (d > c2)) ? g : z;
          }
          for (std::int64_t c0 = 2 * ow; c0 < w; ++c0) q0[c0] = q1[c0] = T(0);
        }
        std::fill(plane + 2 * oh * w, plane + h * w, T(0));
        continue;
      }
      std::fill(plane, plane + h * w, T(0));
      for (std::int64_t oy = 0; oy < oh; ++oy)
        for (std::int64_t ox = 0; ox < ow; ++ox) {
          std::int64_t best = (oy * k[0]) * w + ox * k[1];
          for (std::int64_t ky = 0; ky < k[0]; ++ky)
            for (std::int64_t kx = 0; kx < k[1]; ++kx) {
              std::int64_t off = (oy * k[0] + ky) * w + ox * k[1] + kx;
              if (xin[off] > xin[best]) best = off;
            }
          plane[best] = pdy[(p * oh + oy) * ow + ox];
        }
    }
    return;
  }
  if (backward) std::fill(po, po + out.numel(), T(0));
  T inv = T(1) / static_cast<T>(k[0] * k[1]);
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < nc; ++p)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        std::int64_t best = -1;
        T acc = is_max ? -std::numeric_limits<T>::infinity() : T(0);
        T g = backward ? dy->data<T>()[(p * oh + oy) * ow + ox] : T(0);
        for (std::int64_t ky = 0; ky < k[0]; ++ky) {
          std::int64_t iy = oy * st[0] - pd[0] + ky;
          if (iy < 0 || iy >= h) continue;
          for (std::int64_t kx = 0; kx < k[1]; ++kx) {
            std::int64_t ix = ox * st[1] - pd[1] + kx;
            if (ix < 0 || ix >= w) continue;
            std::int64_t off = (p * h + iy) * w + ix;
            if (is_max) {
              if (px[off] > acc || best < 0) {
                acc = px[off];
                best = off;
              }
            } else if (backward) {
              po[off] += g * inv;
            } else {
              acc += px[off];
            }
          }
        }
        if (backward && is_max && best >= 0) po[best] += g;
        if (!backward) po[(p * oh + oy) * ow + ox] = is_max ? acc : acc * inv;
      }
}

// Max pooling and its gradient over the blocked layout (16 channels as SIMD
// lanes); the first maximum of a window in scan order wins, as in pool_ref.
template <typename T>
void max_pool_blocked(const PoolGeom& geo, const Tensor& x, const Tensor* dy, Tensor& out,
                      bool backward) {
  constexpr std::int64_t L = kBlockChannels;
  const auto& k = geo.k;
  const auto& st = geo.st;
  const auto& pd = geo.pd;
  const Shape& xs = x.shape();
  const std::int64_t planes = xs[0] * (xs[1] / L), h = xs[2], w = xs[3];
  const std::int64_t oh = (h + 2 * pd[0] - k[0]) / st[0] + 1,
                     ow = (w + 2 * pd[1] - k[1]) / st[1] + 1;
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) {
    const T* px = x.data<T>() + p * h * w * L;
    T* q = out.data<T>() + p * (backward ? h * w : oh * ow) * L;
    const T* g = backward ? dy->data<T>() + p * oh * ow * L : nullptr;
    if (backward) std::fill(q, q + h * w * L, T(0));
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        T acc[L];
        std::int64_t best[L];
        for (std::int64_t l = 0; l < L; ++l) {
          acc[l] = -std::numeric_limits<T>::infinity();
          best[l] = -1;
        }
        for (std::int64_t ky = 0; ky < k[0]; ++ky) {
          const std::int64_t iy = oy * st[0] - pd[0] + ky;
          if (iy < 0 || iy >= h) continue;
          for (std::int64_t kx = 0; kx < k[1]; ++kx) {
            const std::int64_t ix = ox * st[1] - pd[1] + kx;
            if (ix < 0 || ix >= w) continue;
            const std::int64_t off = iy * w + ix;
            const T* v = px + off * L;
#pragma omp simd
            for (std::int64_t l = 0; l < L; ++l) {
              const bool take = v[l] > acc[l] || best[l] < 0;
              acc[l] = take ? v[l] : acc[l];
              best[l] = take ? off : best[l];
            }
          }
        }
        const std::int64_t o = (oy * ow + ox) * L;
        if (!backward) {
          for (std::int64_t l = 0; l < L; ++l) q[o + l] = acc[l];
        } else {
          for (std::int64_t l = 0; l < L; ++l)
            if (best[l] >= 0) q[best[l] * L + l] += g[o + l];
        }
      }
  }
}

// Batch norm over the blocked layout [N, C/16, H*W, 16] (see
// kernels_internal.h): the 16 channels of a block are SIMD lanes. Per-row
// partial sums (one row = one image's H*W for 16 channels) are taken in T
// in parallel over (image, block), then summed over images in a fixed order
// in double, so the result does not depend on the thread count.
constexpr std::int64_t kB = kBlockChannels;

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

template <typename T>
void batch_norm_fwd_blocked(bool training, double eps, std::span<const Tensor> in,
                            std::span<Tensor> out) {
  const Shape& xs = in[0].shape();
  const std::int64_t n = xs[0], c = xs[1], cb = c / kB, sp = xs[2] * xs[3];
  const T* x = in[0].data<T>();
  T* y = out[0].data<T>();
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
        const T* k0 = x + b * sp * kB;  // image 0, first pixel: the shift
        const T* p = x + (i * cb + b) * sp * kB;
        T a[kB] = {}, q[kB] = {};
        for (std::int64_t s = 0; s < sp; ++s) {
#pragma omp simd
          for (std::int64_t l = 0; l < kB; ++l) {
            T d = p[s * kB + l] - k0[l];
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
    const double k0 = x[(ch / kB) * sp * kB + ch % kB];
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
      const T* p = x + (i * cb + b) * sp * kB;
      T* q = y + (i * cb + b) * sp * kB;
      for (std::int64_t s = 0; s < sp; ++s) {
#pragma omp simd
        for (std::int64_t l = 0; l < kB; ++l) q[s * kB + l] = p[s * kB + l] * sc[l] + sh[l];
      }
    }
}

// in: x, gamma, mean, var, dy -> dx, dgamma, dbeta; x, dy and dx blocked.
template <typename T>
void batch_norm_bwd_blocked(bool training, double eps, std::span<const Tensor> in,
                            std::span<Tensor> out) {
  const Shape& xs = in[0].shape();
  const std::int64_t n = xs[0], c = xs[1], cb = c / kB, sp = xs[2] * xs[3];
  const double cnt = static_cast<double>(std::max<std::int64_t>(n * sp, 1));
  const T* x = in[0].data<T>();
  const T* dy = in[4].data<T>();
  T* dx = out[0].data<T>();
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
      const T* p = x + (i * cb + b) * sp * kB;
      const T* g = dy + (i * cb + b) * sp * kB;
      for (std::int64_t s = 0; s < sp; ++s) {
#pragma omp simd
        for (std::int64_t l = 0; l < kB; ++l) {
          a[l] += g[s * kB + l];
          q[l] += g[s * kB + l] * (p[s * kB + l] - mt[l]);
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
      const T* p = x + (i * cb + b) * sp * kB;
      const T* g = dy + (i * cb + b) * sp * kB;
      T* q = dx + (i * cb + b) * sp * kB;
      for (std::int64_t s = 0; s < sp; ++s) {
#pragma omp simd
        for (std::int64_t l = 0; l < kB; ++l)
          q[s * kB + l] = A[l] * g[s * kB + l] + B[l] * p[s * kB + l] + C[l];
      }
    }
}

template <typename T>
void batch_norm_fwd(const Node& node, std::span<const Tensor> in, std::span<Tensor> out) {
  bool training = node.attrs.get_int_or("training", 1) != 0;
  double eps = node.attrs.get_float_or("eps", 1e-5);
  const Shape& xs = in[0].shape();
  std::int64_t n = xs[0], c = xs[1], sp = num_elements(xs) / std::max<std::int64_t>(n * c, 1);
  const T* x = in[0].data<T>();
  T* y = out[0].data<T>();
  T* mean = out[1].data<T>();
  T* var = out[2].data<T>();
  const double cnt = static_cast<double>(std::max<std::int64_t>(n * sp, 1));
#pragma omp parallel for schedule(static)
  for (std::int64_t ch = 0; ch < c; ++ch) {
    // One pass, shifted by the channel's first value: vectorized partial
    // sums per row in T, rows summed in double.
    const T k0 = n * sp > 0 ? x[ch * sp] : T(0);
    double s1 = 0, s2 = 0;
    if (training) {
      for (std::int64_t i = 0; i < n; ++i) {
        const T* p = x + (i * c + ch) * sp;
        T a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
        for (std::int64_t s = 0; s < sp; ++s) {
          T d = p[s] - k0;
          a += d;
          b += d * d;
        }
        s1 += a;
        s2 += b;
      }
    }
    auto [scale, shift] = bn_channel<T>(training, eps, in, ch, k0, s1, s2, cnt, mean, var);
    for (std::int64_t i = 0; i < n; ++i) {
      const T* p = x + (i * c + ch) * sp;
      T* q = y + (i * c + ch) * sp;
#pragma omp simd
      for (std::int64_t s = 0; s < sp; ++s) q[s] = p[s] * scale + shift;
    }
  }
}

// in: x, gamma, mean, var, dy -> dx, dgamma, dbeta.
template <typename T>
void batch_norm_bwd(const Node& node, std::span<const Tensor> in, std::span<Tensor> out) {
  bool training = node.attrs.get_int_or("training", 1) != 0;
  double eps = node.attrs.get_float_or("eps", 1e-5);
  const Shape& xs = in[0].shape();
  std::int64_t n = xs[0], c = xs[1], sp = num_elements(xs) / std::max<std::int64_t>(n * c, 1);
  double cnt = static_cast<double>(std::max<std::int64_t>(n * sp, 1));
  const T* x = in[0].data<T>();
  const T* dy = in[4].data<T>();
  T* dx = out[0].data<T>();
#pragma omp parallel for schedule(static)
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double m = in[2].data<T>()[ch],
           rstd = 1.0 / std::sqrt(static_cast<double>(in[3].data<T>()[ch]) + eps);
    const T mt = static_cast<T>(m);
    double sdy = 0, sdyx = 0;  // sum(dy), sum(dy * (x - m)); rows in T, vectorized
    for (std::int64_t i = 0; i < n; ++i) {
      const T* p = x + (i * c + ch) * sp;
      const T* g = dy + (i * c + ch) * sp;
      T a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
      for (std::int64_t s = 0; s < sp; ++s) {
        a += g[s];
        b += g[s] * (p[s] - mt);
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
      const T* p = x + (i * c + ch) * sp;
      const T* g = dy + (i * c + ch) * sp;
      T* q = dx + (i * c + ch) * sp;
#pragma omp simd
      for (std::int64_t s = 0; s < sp; ++s) q[s] = A * g[s] + B * p[s] + C;
    }
  }
}

template <typename T>
void layer_norm_fwd(double eps, std::span<const Tensor> in, std::span<Tensor> out) {
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

// in: x, gamma, dy -> dx, dgamma, dbeta.
template <typename T>
void layer_norm_bwd(double eps, std::span<const Tensor> in, std::span<Tensor> out) {
  std::int64_t d = in[0].shape().back(), rows = in[0].numel() / std::max<std::int64_t>(d, 1);
  const T* x = in[0].data<T>();
  const T* g = in[1].data<T>();
  const T* dy = in[2].data<T>();
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
          rstd * (dxh - s1 / static_cast<double>(d) - xh * s2 / static_cast<double>(d)));
    }
  }
  for (std::int64_t i = 0; i < d; ++i) {
    out[1].data<T>()[i] = static_cast<T>(dg[i]);
    out[2].data<T>()[i] = static_cast<T>(db[i]);
  }
}

#define FLOAT_KERNEL(...)                                                                  \
  make_fn([=](const KernelContext& c, std::span<const Tensor> in, std::span<Tensor> out) { \
    (void)c;                                                                               \
    return dispatch_float(out[0].dtype(), [&](auto tag) {                                  \
      using T = decltype(tag);                                                             \
      __VA_ARGS__;                                                                         \
      return ok_status();                                                                  \
    });                                                                                    \
  })

}  // namespace

void register_nn(KernelRegistry& r) {
  r.add("matmul", [](const Node& n, const Inputs&) {
    bool ta = n.attrs.get_int_or("transpose_a", 0) != 0,
         tb = n.attrs.get_int_or("transpose_b", 0) != 0;
    return FLOAT_KERNEL(matmul_ref<T>(in[0], in[1], out[0], ta, tb));
  });
  r.add("linear", [](const Node& n, const Inputs&) {
    bool relu = n.attrs.get_string_or("activation", "") == "relu";
    return FLOAT_KERNEL(
        linear_ref<T>(in[0], in[1], in.size() > 2 ? &in[2] : nullptr, out[0], relu));
  });
  r.add("conv2d", [](const Node& n, const Inputs& ins) {
    bool relu = n.attrs.get_string_or("activation", "") == "relu";
    ConvGeom g = ConvGeom::make(n, ins[0].shape, ins[1].shape, n.outputs[0].shape);
    return make_fn(
        [relu, g](const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) {
          return dispatch_float(out[0].dtype(), [&](auto tag) {
            using T = decltype(tag);
            conv_ref<T>(g, in[0].data<T>(), in[1].data<T>(), out[0].data<T>(), 0);
            std::int64_t sp = g.oh * g.ow;
            T* y = out[0].data<T>();
            for (std::int64_t i = 0; i < g.n * g.o; ++i)
              for (std::int64_t s = 0; s < sp; ++s) {
                T v = y[i * sp + s] + (in.size() > 2 ? in[2].data<T>()[i % g.o] : T(0));
                y[i * sp + s] = relu && v < 0 ? T(0) : v;
              }
            return ok_status();
          });
        });
  });
  r.add("conv2d_grad_input", [](const Node& n, const Inputs& ins) {
    ConvGeom g = ConvGeom::make(n, n.outputs[0].shape, ins[1].shape, ins[0].shape);
    return make_fn([g](const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) {
      return dispatch_float(out[0].dtype(), [&](auto tag) {
        using T = decltype(tag);
        std::fill(out[0].data<T>(), out[0].data<T>() + out[0].numel(), T(0));
        conv_ref<T>(g, out[0].data<T>(), in[1].data<T>(), in[0].data<T>(), 1);
        return ok_status();
      });
    });
  });
  r.add("conv2d_grad_weight", [](const Node& n, const Inputs& ins) {
    ConvGeom g = ConvGeom::make(n, ins[0].shape, n.outputs[0].shape, ins[1].shape);
    return make_fn([g](const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) {
      return dispatch_float(out[0].dtype(), [&](auto tag) {
        using T = decltype(tag);
        std::fill(out[0].data<T>(), out[0].data<T>() + out[0].numel(), T(0));
        conv_ref<T>(g, in[0].data<T>(), out[0].data<T>(), in[1].data<T>(), 2);
        return ok_status();
      });
    });
  });
  r.add("max_pool2d", [](const Node& n, const Inputs&) {
    PoolGeom geo = PoolGeom::make(n);
    if (blocked_input(n, 0))
      return FLOAT_KERNEL(max_pool_blocked<T>(geo, in[0], nullptr, out[0], false));
    return FLOAT_KERNEL(pool_ref<T>(geo, in[0], nullptr, out[0], true, false));
  });
  r.add("avg_pool2d", [](const Node& n, const Inputs&) {
    PoolGeom geo = PoolGeom::make(n);
    return FLOAT_KERNEL(pool_ref<T>(geo, in[0], nullptr, out[0], false, false));
  });
  r.add("max_pool2d_grad", [](const Node& n, const Inputs&) {
    PoolGeom geo = PoolGeom::make(n);
    if (blocked_input(n, 0))
      return FLOAT_KERNEL(max_pool_blocked<T>(geo, in[0], &in[1], out[0], true));
    return FLOAT_KERNEL(pool_ref<T>(geo, in[0], &in[1], out[0], true, true));
  });
  r.add("avg_pool2d_grad", [](const Node& n, const Inputs&) {
    PoolGeom geo = PoolGeom::make(n);
    // x is only used for its shape: out has it.
    return FLOAT_KERNEL(pool_ref<T>(geo, out[0], &in[0], out[0], false, true));
  });
  r.add("global_avg_pool", [](const Node&, const Inputs&) {
    return FLOAT_KERNEL({
      std::int64_t nc = in[0].dim(0) * in[0].dim(1), sp = in[0].dim(2) * in[0].dim(3);
      const T* x = in[0].data<T>();
      for (std::int64_t i = 0; i < nc; ++i) {
        T s = 0;
        for (std::int64_t j = 0; j < sp; ++j) s += x[i * sp + j];
        out[0].data<T>()[i] = sp > 0 ? s / static_cast<T>(sp) : T(0);
      }
    });
  });
  // The layout is fixed at compile time (reading attributes in a run would
  // allocate).
  r.add("batch_norm", [](const Node& n, const Inputs&) {
    if (blocked_input(n, 0)) {
      const bool training = n.attrs.get_int_or("training", 1) != 0;
      const double eps = n.attrs.get_float_or("eps", 1e-5);
      return FLOAT_KERNEL(batch_norm_fwd_blocked<T>(training, eps, in, out));
    }
    return FLOAT_KERNEL(batch_norm_fwd<T>(c.node, in, out));
  });
  r.add("batch_norm_grad", [](const Node& n, const Inputs&) {
    if (blocked_input(n, 0)) {
      const bool training = n.attrs.get_int_or("training", 1) != 0;
      const double eps = n.attrs.get_float_or("eps", 1e-5);
      return FLOAT_KERNEL(batch_norm_bwd_blocked<T>(training, eps, in, out));
    }
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
}

}  // namespace shoal::runtime::cpu
