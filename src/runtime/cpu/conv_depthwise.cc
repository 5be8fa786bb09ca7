// Depthwise convolutions (one input and one output channel per group) over
// small maps, direct. Where oneDNN's JIT depthwise kernel declines a pass
// (mnasnet's and MobileNet's 5x5 stages over 2x2 maps at 32x32 images, most
// often the weight gradient) it falls back to im2col and one GEMM per
// channel: 2.6-7.9 ms for 64 images of 288 channels, where the direct loops
// here do the ~0.5 MFLOP in microseconds. make_conv (onednn_conv.cc) takes them
// only for such passes (SHOAL_DEPTHWISE=direct: for every small-map
// depthwise pass); where oneDNN has its JIT kernel it is 3x faster than
// these loops (mobilenet_v2's 3x3 over 8x8). Maps of at most 8x8 in and out.
// Plain NCHW or the blocked nChw16c layout, as the layout pass annotated
// each operand.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "runtime/cpu/onednn_internal.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace shoal::runtime::cpu::dnnl_detail {

namespace {

constexpr std::int64_t kMaxMap = 64;  // elements of an input or output map

// Offsets of [n, c, h, w] in plain or channel-blocked (16 lanes) storage.
struct Plane {
  std::int64_t c, h, w;
  bool blocked;
  std::int64_t at(std::int64_t n, std::int64_t ch, std::int64_t y, std::int64_t x) const {
    if (!blocked) return ((n * c + ch) * h + y) * w + x;
    constexpr std::int64_t L = kBlockChannels;
    return (((n * (c / L) + ch / L) * h + y) * w + x) * L + ch % L;
  }
};

class DepthwiseSmallKernel final : public Kernel {
 public:
  DepthwiseSmallKernel(int mode, const Node& n, const Shape& x, const Shape& w, const Shape& y,
                       bool x_blocked, bool y_blocked, bool bias, bool relu)
      : mode_(mode),
        bias_(bias),
        relu_(relu),
        batch_(x[0]),
        kh_(w[2]),
        kw_(w[3]),
        x_{x[1], x[2], x[3], x_blocked},
        y_{y[1], y[2], y[3], y_blocked} {
    auto st = n.attrs.get_ints_or("stride", {1, 1});
    auto pd = n.attrs.get_ints_or("padding", {0, 0});
    auto dl = n.attrs.get_ints_or("dilation", {1, 1});
    for (int i = 0; i < 2; ++i) st_[i] = st[i], pd_[i] = pd[i], dl_[i] = dl[i];
    if (mode_ == 2) plan_grad_weight();
  }

  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    if (mode_ == 0)
      forward(in[0].data<float>(), in[1].data<float>(), bias_ ? in[2].data<float>() : nullptr,
              out[0].data<float>());
    if (mode_ == 1) grad_input(in[0].data<float>(), in[1].data<float>(), out[0].data<float>());
    if (mode_ == 2) grad_weight(in[0].data<float>(), in[1].data<float>(), out[0].data<float>());
    return ok_status();
  }

  const char* impl() const override { return "depthwise-small"; }

 private:
  // Calls f(input y, input x, output y, output x, tap) for every tap of
  // channel-independent geometry that reads inside the input.
  template <typename F>
  void taps(F&& f) const {
    for (std::int64_t oy = 0; oy < y_.h; ++oy)
      for (std::int64_t ox = 0; ox < y_.w; ++ox)
        for (std::int64_t ky = 0; ky < kh_; ++ky) {
          const std::int64_t iy = oy * st_[0] - pd_[0] + ky * dl_[0];
          if (iy < 0 || iy >= x_.h) continue;
          for (std::int64_t kx = 0; kx < kw_; ++kx) {
            const std::int64_t ix = ox * st_[1] - pd_[1] + kx * dl_[1];
            if (ix >= 0 && ix < x_.w) f(iy, ix, oy, ox, ky * kw_ + kx);
          }
        }
  }

  void forward(const float* x, const float* w, const float* b, float* y) const {
    const std::int64_t k = kh_ * kw_;
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < x_.c; ++c)
      for (std::int64_t n = 0; n < batch_; ++n) {
        for (std::int64_t oy = 0; oy < y_.h; ++oy)
          for (std::int64_t ox = 0; ox < y_.w; ++ox) y[y_.at(n, c, oy, ox)] = b ? b[c] : 0.0f;
        taps([&](std::int64_t iy, std::int64_t ix, std::int64_t oy, std::int64_t ox,
                 std::int64_t t) {
          y[y_.at(n, c, oy, ox)] += x[x_.at(n, c, iy, ix)] * w[c * k + t];
        });
        if (relu_)
          for (std::int64_t oy = 0; oy < y_.h; ++oy)
            for (std::int64_t ox = 0; ox < y_.w; ++ox) {
              float& v = y[y_.at(n, c, oy, ox)];
              v = v < 0 ? 0.0f : v;
            }
      }
  }

  void grad_input(const float* dy, const float* w, float* dx) const {
    const std::int64_t k = kh_ * kw_;
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < x_.c; ++c)
      for (std::int64_t n = 0; n < batch_; ++n) {
        for (std::int64_t iy = 0; iy < x_.h; ++iy)
          for (std::int64_t ix = 0; ix < x_.w; ++ix) dx[x_.at(n, c, iy, ix)] = 0.0f;
        taps([&](std::int64_t iy, std::int64_t ix, std::int64_t oy, std::int64_t ox,
                 std::int64_t t) {
          dx[x_.at(n, c, iy, ix)] += dy[y_.at(n, c, oy, ox)] * w[c * k + t];
        });
      }
  }

  // The weight gradient, kLanes channels at a time: x and dy are copied
  // channel-last ([n, y, x, c], channels padded with zeros to whole lane
  // groups), so each tap's sum over the batch and the map is a run of
  // kLanes-wide FMAs into one accumulator. A per-channel loop adding into
  // dw[c, tap] for each product kept the sum in memory: mnasnet's 5x5 pass
  // over 72 channels of 4x4 maps took 1.8 ms for 0.9 M products.
  // The copies (whose padding channels stay zero) and each tap's offset
  // pairs are made once, here.
  void plan_grad_weight() {
    cp_ = (x_.c + kLanes - 1) / kLanes * kLanes;
    xt_.assign(static_cast<std::size_t>(batch_ * x_.h * x_.w * cp_), 0.0f);
    yt_.assign(static_cast<std::size_t>(batch_ * y_.h * y_.w * cp_), 0.0f);
    pairs_.resize(static_cast<std::size_t>(kh_ * kw_));
    taps([&](std::int64_t iy, std::int64_t ix, std::int64_t oy, std::int64_t ox, std::int64_t t) {
      pairs_[static_cast<std::size_t>(t)].emplace_back((iy * x_.w + ix) * cp_,
                                                       (oy * y_.w + ox) * cp_);
    });
  }

  void grad_weight(const float* x, const float* dy, float* dw) {
    const std::int64_t k = kh_ * kw_, c = x_.c, cp = cp_;
    const std::int64_t xs = x_.h * x_.w, ys = y_.h * y_.w;
    channels_last(x, x_, xt_.data(), cp);
    channels_last(dy, y_, yt_.data(), cp);
    const float* xc = xt_.data();
    const float* yc = yt_.data();
#pragma omp parallel for schedule(static) collapse(2)
    for (std::int64_t c0 = 0; c0 < cp; c0 += kLanes)
      for (std::int64_t t = 0; t < k; ++t) {
        float acc[kLanes];
        tap_sum(xc + c0, yc + c0, xs * cp, ys * cp, pairs_[static_cast<std::size_t>(t)], acc);
        for (std::int64_t l = 0; l < kLanes && c0 + l < c; ++l) dw[(c0 + l) * k + t] = acc[l];
      }
  }

  // acc[l] = sum over the batch and the (x, dy) offset pairs of one tap of
  // dy[yo + l] x[xo + l], the images xn and yn elements apart.
  void tap_sum(const float* x, const float* dy, std::int64_t xn, std::int64_t yn,
               const std::vector<std::pair<std::int64_t, std::int64_t>>& pairs, float* acc) const {
#if defined(__AVX512F__)
    static_assert(kLanes == 16);
    // Two images at a time into two sums: one chain of FMAs waits on each.
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    std::int64_t n = 0;
    for (; n + 1 < batch_; n += 2, x += 2 * xn, dy += 2 * yn)
      for (const auto& [xo, yo] : pairs) {
        a = _mm512_fmadd_ps(_mm512_loadu_ps(dy + yo), _mm512_loadu_ps(x + xo), a);
        b = _mm512_fmadd_ps(_mm512_loadu_ps(dy + yn + yo), _mm512_loadu_ps(x + xn + xo), b);
      }
    if (n < batch_)
      for (const auto& [xo, yo] : pairs)
        a = _mm512_fmadd_ps(_mm512_loadu_ps(dy + yo), _mm512_loadu_ps(x + xo), a);
    _mm512_storeu_ps(acc, _mm512_add_ps(a, b));
#else
    std::fill(acc, acc + kLanes, 0.0f);
    for (std::int64_t n = 0; n < batch_; ++n, x += xn, dy += yn)
      for (const auto& [xo, yo] : pairs)
        for (std::int64_t l = 0; l < kLanes; ++l) acc[l] += dy[yo + l] * x[xo + l];
#endif
  }

  // src (plain or blocked, as `p` says) into dst [n, y, x, cp]; the padding
  // channels stay as they are (zero).
  void channels_last(const float* src, const Plane& p, float* dst, std::int64_t cp) const {
    const std::int64_t hw = p.h * p.w;
#pragma omp parallel for schedule(static)
    for (std::int64_t n = 0; n < batch_; ++n) {
      float* d = dst + n * hw * cp;
      if (p.blocked) {  // [c / 16, hw, 16]: whole blocks of 16 channels
        const float* s = src + n * p.c * hw;
        for (std::int64_t cb = 0; cb < p.c; cb += kBlockChannels)
          for (std::int64_t i = 0; i < hw; ++i)
            std::copy_n(s + cb * hw + i * kBlockChannels, kBlockChannels, d + i * cp + cb);
      } else {  // [c, hw]
        const float* s = src + n * p.c * hw;
        for (std::int64_t i = 0; i < hw; ++i)
          for (std::int64_t ch = 0; ch < p.c; ++ch) d[i * cp + ch] = s[ch * hw + i];
      }
    }
  }

  static constexpr std::int64_t kLanes = 16;
  int mode_;
  bool bias_, relu_;
  std::int64_t batch_, kh_, kw_;
  Plane x_, y_;
  // The weight gradient's channel-last copies (channels padded to cp_) and
  // each tap's (x, dy) offset pairs in them.
  std::int64_t cp_ = 0;
  std::vector<float> xt_, yt_;
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> pairs_;
  std::int64_t st_[2] = {1, 1}, pd_[2] = {0, 0}, dl_[2] = {1, 1};
};

}  // namespace

std::unique_ptr<Kernel> make_small_depthwise(int mode, const Node& n, const Shape& x,
                                             const Shape& w, const Shape& y, bool x_blocked,
                                             bool y_blocked, bool bias, bool relu) {
  const std::int64_t groups = n.attrs.get_int_or("groups", 1);
  if (x.size() != 4 || w.size() != 4 || y.size() != 4) return nullptr;
  if (groups <= 1 || groups != x[1] || groups != w[0] || w[1] != 1 || y[1] != x[1]) return nullptr;
  if (x[2] * x[3] > kMaxMap || y[2] * y[3] > kMaxMap) return nullptr;
  if (n.attrs.get_ints_or("stride", {1, 1}).size() != 2 ||
      n.attrs.get_ints_or("padding", {0, 0}).size() != 2 ||
      n.attrs.get_ints_or("dilation", {1, 1}).size() != 2)
    return nullptr;
  return std::make_unique<DepthwiseSmallKernel>(mode, n, x, w, y, x_blocked, y_blocked, bias, relu);
}

}  // namespace shoal::runtime::cpu::dnnl_detail
