// The input gradient of a convolution whose stride is its kernel (no
// padding, no dilation, one group, plain NCHW): each output pixel reads its
// own KHxKW patch, so
//   dx[n, c, p KH + a, q KW + b] = sum_o w[o, c, a, b] dy[n, o, p, q]
// (0 where no patch reaches). An imported 3-D transposed convolution of
// stride 2 and kernel 2 runs as such a pass, to 6 channels from 8: oneDNN's
// backward-data kernel took 2.1 ms for its 22 MFLOP (padding both channel
// counts to its 16-channel blocks), these loops 1.1. Taken only where a
// count is below 16. (The same loops for the forward and the weight
// gradient lost to oneDNN's: 1.4 against 0.5 ms, 1.3 against 1.0.)
#include <algorithm>
#include <vector>

#include "runtime/cpu/onednn_internal.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace shoal::runtime::cpu::dnnl_detail {

namespace {

// Runs along whole rows of dx, j = q KW + b, in vector lanes: the weights
// as rows that repeat w[o, c, a, 0..KW) (pattern), dy as rows that repeat
// each value KW times (widen), so no row is split by b.
class PatchGradInputKernel final : public Kernel {
 public:
  PatchGradInputKernel(const Shape& x, const Shape& w, const Shape& y)
      : n_(x[0]),
        c_(x[1]),
        h_(x[2]),
        w_(x[3]),
        o_(w[0]),
        kh_(w[2]),
        kw_(w[3]),
        p_(y[2]),
        q_(y[3]),
        used_(y[3] * w[3]) {}

  // (dy, w) -> dx
  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    pattern(in[1].data<float>());
    grad_input(in[0].data<float>(), out[0].data<float>());
    return ok_status();
  }

  const char* impl() const override { return "patch"; }

 private:
  // pat_[(o C + c) KH + a][j] = w[o, c, a, j % KW].
  void pattern(const float* w) {
    pat_.resize(static_cast<std::size_t>(o_ * c_ * kh_ * used_));
    for (std::int64_t t = 0; t < o_ * c_ * kh_; ++t)
      for (std::int64_t j = 0; j < used_; ++j) pat_[t * used_ + j] = w[t * kw_ + j % kw_];
  }
  const float* pat(std::int64_t o, std::int64_t c, std::int64_t a) const {
    return pat_.data() + ((o * c_ + c) * kh_ + a) * used_;
  }
  // wide[o][j] = dy[n, o, p, j / KW] for every o.
  void widen(const float* dy, std::int64_t n, std::int64_t p, float* wide) const {
    for (std::int64_t o = 0; o < o_; ++o) {
      const float* g = dy + ((n * o_ + o) * p_ + p) * q_;
      float* d = wide + o * used_;
      for (std::int64_t q = 0; q < q_; ++q)
        for (std::int64_t b = 0; b < kw_; ++b) d[q * kw_ + b] = g[q];
    }
  }

  // out[j] = sum_k a[k][j] b[k][j] over the used width, 64 lanes at a time
  // in registers.
  void dot_rows(const float* const* a, const float* const* b, std::int64_t k, float* out) const {
    const std::int64_t u = used_;
#if defined(__AVX512F__)
    for (std::int64_t j0 = 0; j0 < u; j0 += 64) {
      __mmask16 m[4];
      for (int i = 0; i < 4; ++i) {
        const std::int64_t left = std::clamp<std::int64_t>(u - j0 - 16 * i, 0, 16);
        m[i] = static_cast<__mmask16>((1u << left) - 1);
      }
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
      for (std::int64_t t = 0; t < k; ++t)
        for (int i = 0; i < 4; ++i)
          acc[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[i], a[t] + j0 + 16 * i),
                                   _mm512_maskz_loadu_ps(m[i], b[t] + j0 + 16 * i), acc[i]);
      for (int i = 0; i < 4; ++i) _mm512_mask_storeu_ps(out + j0 + 16 * i, m[i], acc[i]);
    }
#else
    std::fill(out, out + u, 0.0f);
    for (std::int64_t t = 0; t < k; ++t)
      for (std::int64_t j = 0; j < u; ++j) out[j] += a[t][j] * b[t][j];
#endif
  }

  void grad_input(const float* dy, float* dx) const {
    const std::int64_t rows = n_ * p_, u = used_;
#pragma omp parallel
    {
      std::vector<float> wide(static_cast<std::size_t>(o_ * u));
      std::vector<const float*> gs(static_cast<std::size_t>(o_)), ws(gs.size());
      for (std::int64_t o = 0; o < o_; ++o) gs[static_cast<std::size_t>(o)] = wide.data() + o * u;
#pragma omp for schedule(static)
      for (std::int64_t np = 0; np < rows; ++np) {
        const std::int64_t n = np / p_, p = np % p_;
        widen(dy, n, p, wide.data());
        for (std::int64_t c = 0; c < c_; ++c)
          for (std::int64_t a = 0; a < kh_; ++a) {
            float* r = dx + ((n * c_ + c) * h_ + p * kh_ + a) * w_;
            for (std::int64_t o = 0; o < o_; ++o) ws[static_cast<std::size_t>(o)] = pat(o, c, a);
            dot_rows(ws.data(), gs.data(), o_, r);
            std::fill(r + u, r + w_, 0.0f);  // columns no patch covers
          }
      }
      // Rows no patch covers.
#pragma omp for schedule(static)
      for (std::int64_t nc = 0; nc < n_ * c_; ++nc)
        std::fill(dx + (nc * h_ + p_ * kh_) * w_, dx + (nc + 1) * h_ * w_, 0.0f);
    }
  }

  std::int64_t n_, c_, h_, w_, o_, kh_, kw_, p_, q_, used_;
  std::vector<float> pat_;  // the weights as repeating rows
};

}  // namespace

std::unique_ptr<Kernel> make_patch_grad_input(const Node& n, const Shape& x, const Shape& w,
                                              const Shape& y, bool x_blocked, bool y_blocked) {
  if (x.size() != 4 || w.size() != 4 || y.size() != 4 || x_blocked || y_blocked) return nullptr;
  if (n.attrs.get_int_or("groups", 1) != 1 || w[1] != x[1] || y[1] != w[0]) return nullptr;
  const auto st = n.attrs.get_ints_or("stride", {1, 1});
  const auto pd = n.attrs.get_ints_or("padding", {0, 0});
  const auto dl = n.attrs.get_ints_or("dilation", {1, 1});
  if (st.size() != 2 || pd.size() != 2 || dl.size() != 2) return nullptr;
  if (st[0] != w[2] || st[1] != w[3] || pd[0] != 0 || pd[1] != 0 || dl[0] != 1 || dl[1] != 1)
    return nullptr;
  if (y[2] * w[2] > x[2] || y[3] * w[3] > x[3]) return nullptr;
  if (w[0] >= 16 && w[1] >= 16) return nullptr;  // oneDNN's blocks fit: its kernels
  // A 1x1 convolution is a matmul to oneDNN: 0.25 ms where these loops took
  // 1.0 (mnasnet's 24 to 8 channels over 16x16 maps).
  if (w[2] * w[3] == 1) return nullptr;
  return std::make_unique<PatchGradInputKernel>(x, w, y);
}

}  // namespace shoal::runtime::cpu::dnnl_detail
