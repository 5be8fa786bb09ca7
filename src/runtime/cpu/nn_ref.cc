// Reference NN kernels for any float dtype: matmul/linear on BLAS, direct
// convolution and pooling loops (the norms are in norm_ref.cc). f32
// matmul, linear, conv and pooling are overridden by oneDNN (onednn.cc);
// these stay the f64 path (gradient checks) and the oracle the oneDNN
// kernels are tested against. Max pooling's f32 gradient on the plain
// layout is here, vectorized (oneDNN's needs the forward's workspace).
#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/vec_math.h"

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
  // Max pooling's gradient through the ReLU whose output x is (attr relu,
  // fuse_pool_relu_grads): a window whose maximum is not above 0 passes none.
  bool relu = false;
  static PoolGeom make(const Node& node) {
    auto k = node.attrs.get_ints_or("kernel", {1, 1});
    auto st = node.attrs.get_ints_or("stride", k);
    auto pd = node.attrs.get_ints_or("padding", {0, 0});
    return PoolGeom{
        {k[0], k[1]}, {st[0], st[1]}, {pd[0], pd[1]}, node.attrs.get_int_or("relu", 0) != 0};
  }
  // The gradient a window of maximum m passes to it.
  template <typename T>
  T passed(T g, T m) const {
    return relu && !(m > T(0)) ? T(0) : g;
  }
};

#if defined(__AVX512F__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers
// Max pooling's gradient on the plain layout, f32, any window: each
// window's first maximum in scan order (as pool_ref) found for 16 outputs
// of a row at once, the taps gathered, then the 16 gradients added one by
// one (overlapping windows can share a maximum). The scalar search ran a
// compare-and-select chain per tap, ~10 cycles each.
void max_pool_grad_f32(const PoolGeom& geo, const float* x, const float* dy, float* dx,
                       std::int64_t nc, std::int64_t h, std::int64_t w, std::int64_t oh,
                       std::int64_t ow) {
  const auto& k = geo.k;
  const auto& st = geo.st;
  const auto& pd = geo.pd;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 low = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < nc; ++p) {
    const float* px = x + p * h * w;
    float* q = dx + p * h * w;
    const float* g = dy + p * oh * ow;
    std::fill(q, q + h * w, 0.0f);
    alignas(64) std::int32_t best[16];
    alignas(64) float top[16];
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ox += 16) {
        const __mmask16 lanes = vec::first(ow - ox);
        const __m512i ix0 = _mm512_sub_epi32(
            _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(ox))),
                               _mm512_set1_epi32(static_cast<int>(st[1]))),
            _mm512_set1_epi32(static_cast<int>(pd[1])));
        __m512 acc = low;
        __m512i at = _mm512_set1_epi32(-1);
        for (std::int64_t ky = 0; ky < k[0]; ++ky) {
          const std::int64_t iy = oy * st[0] - pd[0] + ky;
          if (iy < 0 || iy >= h) continue;
          const __m512i row = _mm512_set1_epi32(static_cast<int>(iy * w));
          for (std::int64_t kx = 0; kx < k[1]; ++kx) {
            const __m512i ix = _mm512_add_epi32(ix0, _mm512_set1_epi32(static_cast<int>(kx)));
            const __mmask16 in =
                lanes & _mm512_cmpge_epi32_mask(ix, _mm512_setzero_si512()) &
                _mm512_cmplt_epi32_mask(ix, _mm512_set1_epi32(static_cast<int>(w)));
            const __m512i off = _mm512_add_epi32(row, ix);
            const __m512 v = _mm512_mask_i32gather_ps(low, in, off, px, 4);
            const __mmask16 take = in & (_mm512_cmp_ps_mask(v, acc, _CMP_GT_OQ) |
                                         _mm512_cmplt_epi32_mask(at, _mm512_setzero_si512()));
            acc = _mm512_mask_mov_ps(acc, take, v);
            at = _mm512_mask_mov_epi32(at, take, off);
          }
        }
        _mm512_store_si512(best, at);
        _mm512_store_ps(top, acc);
        for (std::int64_t l = 0; l < std::min<std::int64_t>(16, ow - ox); ++l)
          if (best[l] >= 0) q[best[l]] += geo.passed(g[oy * ow + ox + l], top[l]);
      }
  }
}
#pragma GCC diagnostic pop
#endif

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
            T g = geo.passed(gy[oy * ow + ox], right ? mcd : mab), z = T(0);
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
          plane[best] = geo.passed(pdy[(p * oh + oy) * ow + ox], xin[best]);
        }
    }
    return;
  }
  T inv = T(1) / static_cast<T>(k[0] * k[1]);
  if (backward && !is_max && st == k && pd[0] == 0 && pd[1] == 0) {
    // Non-overlapping windows (LeNet's 2x2/2): each input cell gets one
    // window's share or, past the last window, nothing; written once, row by
    // row, instead of zeroed and accumulated.
    const T* pdy = dy->data<T>();
#pragma omp parallel for schedule(static)
    for (std::int64_t p = 0; p < nc; ++p)
      for (std::int64_t iy = 0; iy < h; ++iy) {
        T* row = po + (p * h + iy) * w;
        const std::int64_t oy = iy / k[0];
        if (oy >= oh) {
          std::fill(row, row + w, T(0));
          continue;
        }
        const T* gy = pdy + (p * oh + oy) * ow;
        if (k[1] == 2) {
#pragma omp simd
          for (std::int64_t ox = 0; ox < ow; ++ox) row[2 * ox] = row[2 * ox + 1] = gy[ox] * inv;
        } else {
          for (std::int64_t ox = 0; ox < ow; ++ox)
            std::fill(row + ox * k[1], row + (ox + 1) * k[1], gy[ox] * inv);
        }
        std::fill(row + ow * k[1], row + w, T(0));
      }
    return;
  }
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (backward && is_max && h * w < (std::int64_t{1} << 31))
      return max_pool_grad_f32(geo, px, dy->data<T>(), po, nc, h, w, oh, ow);
  }
#endif
  if (backward) std::fill(po, po + out.numel(), T(0));
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
        if (backward && is_max && best >= 0) po[best] += geo.passed(g, acc);
        if (!backward) po[(p * oh + oy) * ow + ox] = is_max ? acc : acc * inv;
      }
}

// Max pooling's gradient over the blocked layout where the windows do not
// overlap (stride = kernel, no padding: the CNN's 2x2/2): each element of
// dx is one window's tap, so each is written once, dy where it is the
// window's first maximum in scan order and 0 elsewhere, 16 lanes at a time
// with no zero fill and no scatter (the general loop's took 1.15 ms for the
// CNN's first pooling, 64 x 32 x 28 x 28).
template <typename T>
void max_pool_grad_blocked_disjoint(const PoolGeom& geo, const Tensor& x, const Tensor& dy,
                                    Tensor& out) {
  constexpr std::int64_t L = kBlockChannels;
  const std::int64_t kh = geo.k[0], kw = geo.k[1];
  const Shape& xs = x.shape();
  const std::int64_t planes = xs[0] * (xs[1] / L), h = xs[2], w = xs[3];
  const std::int64_t oh = h / kh, ow = w / kw;
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) {
    const T* px = x.data<T>() + p * h * w * L;
    T* q = out.data<T>() + p * h * w * L;
    const T* g = dy.data<T>() + p * oh * ow * L;
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        T acc[L];
        std::int32_t best[L];
        for (std::int64_t t = 0; t < kh * kw; ++t) {
          const T* v = px + ((oy * kh + t / kw) * w + ox * kw + t % kw) * L;
#pragma omp simd
          for (std::int64_t l = 0; l < L; ++l) {
            const bool take = t == 0 || v[l] > acc[l];
            acc[l] = take ? v[l] : acc[l];
            best[l] = take ? static_cast<std::int32_t>(t) : best[l];
          }
        }
        const T* gw = g + (oy * ow + ox) * L;
        T pass[L];
        for (std::int64_t l = 0; l < L; ++l) pass[l] = geo.passed(gw[l], acc[l]);
        for (std::int64_t t = 0; t < kh * kw; ++t) {
          T* d = q + ((oy * kh + t / kw) * w + ox * kw + t % kw) * L;
#pragma omp simd
          for (std::int64_t l = 0; l < L; ++l) d[l] = best[l] == t ? pass[l] : T(0);
        }
      }
    // Rows and columns no window reaches.
    for (std::int64_t y = 0; y < h; ++y)
      for (std::int64_t c = y < oh * kh ? ow * kw : 0; c < w; ++c)
        std::fill(q + (y * w + c) * L, q + (y * w + c + 1) * L, T(0));
  }
}

// Max pooling and its gradient over the blocked layout (16 channels as SIMD
// lanes); the first maximum of a window in scan order wins, as in pool_ref.
template <typename T>
void max_pool_blocked(const PoolGeom& geo, const Tensor& x, const Tensor* dy, Tensor& out,
                      bool backward) {
  if (backward && geo.st == geo.k && geo.pd[0] == 0 && geo.pd[1] == 0)
    return max_pool_grad_blocked_disjoint<T>(geo, x, *dy, out);
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
            if (best[l] >= 0) q[best[l] * L + l] += geo.passed(g[o + l], acc[l]);
        }
      }
  }
}

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
}

}  // namespace shoal::runtime::cpu
