// Convolutions over 1x1 maps as matmuls. When the input and the output are
// both 1x1, exactly one kernel tap (th, tw) reads the input and every other
// tap reads padding, so
//   forward        y[n, o]         = sum_i x[n, i] w[o, i, th, tw] (+ b[o]) (ReLU)
//   input grad     dx[n, i]        = sum_o dy[n, o] w[o, i, th, tw]
//   weight grad    dw[o, i, th, tw] = sum_n dy[n, o] x[n, i], other taps 0
// as oneDNN matmuls on a dense copy of the tap's weights (a strided view
// sends oneDNN to its reference matmul: 50x slower). resnet18 on 32x32 images ends in such a stage:
// its 3x3 convolutions there did 9x the work and oneDNN's direct and
// Winograd convolutions handle the shape poorly (docs/runtime.md). A 1x1
// map has the same bytes in the plain and the channel-blocked layout, so
// the layout annotations need no reorder here.
#include <cstring>

#include "runtime/cpu/onednn_internal.h"

namespace shoal::runtime::cpu::dnnl_detail {

namespace {

// The tap that alone reads a 1x1 input into a 1x1 output along one axis, or -1.
std::int64_t only_tap(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t pad,
                      std::int64_t dil) {
  if (in != 1 || out != 1 || pad % dil != 0 || pad / dil >= k) return -1;
  return pad / dil;
}

class PointConvKernel final : public DnnlKernel {
 public:
  PointConvKernel(int mode, const Shape& x, const Shape& w, std::int64_t tap, bool bias, bool relu)
      : mode_(mode), bias_(bias), tap_(tap), w_numel_(num_elements(w)) {
    const memory::dim n = x[0], ci = w[1], co = w[0], k = w[2] * w[3];
    auto md = [](memory::dim r, memory::dim c, memory::dim rs, memory::dim cs) {
      return memory::desc({r, c}, dt::f32, memory::dims{rs, cs});
    };
    memory::desc a, b, c, bias_md;
    // The tap's weights, dense [co, ci]: gathered before the forward and
    // input-gradient matmuls, scattered after the weight-gradient one.
    tap_buf_ = Storage::allocate(static_cast<std::size_t>(co * ci) * sizeof(float));
    co_ = co;
    ci_ = ci;
    k_ = k;
    if (mode == 0) {  // x [n, ci] . w_tap^T
      a = md(n, ci, ci, 1);
      b = md(ci, co, 1, ci);
      c = md(n, co, co, 1);
      if (bias) bias_md = md(1, co, co, 1);
    } else if (mode == 1) {  // dy [n, co] . w_tap
      a = md(n, co, co, 1);
      b = md(co, ci, ci, 1);
      c = md(n, ci, ci, 1);
    } else {  // dy^T [co, n] . x [n, ci]
      a = md(co, n, 1, co);
      b = md(n, ci, ci, 1);
      c = md(co, ci, ci, 1);
    }
    dnnl::matmul::desc d =
        mode == 0 && bias ? dnnl::matmul::desc(a, b, bias_md, c) : dnnl::matmul::desc(a, b, c);
    dnnl::matmul::primitive_desc pd(d, attr(mode == 0 && relu), engine());
    prim_ = dnnl::matmul(pd);
    init_scratch(pd);
    a_ = memory(a, engine(), DNNL_MEMORY_NONE);
    b_ = memory(b, engine(), DNNL_MEMORY_NONE);
    c_ = memory(c, engine(), DNNL_MEMORY_NONE);
    args_ = {{DNNL_ARG_SRC, &a_},
             {DNNL_ARG_WEIGHTS, &b_},
             {DNNL_ARG_DST, &c_},
             {DNNL_ARG_SCRATCHPAD, &scratch_}};
    if (mode == 0 && bias) {
      bias_mem_ = memory(bias_md, engine(), DNNL_MEMORY_NONE);
      args_.add(DNNL_ARG_BIAS, bias_mem_);
    }
  }

  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    auto* dense = static_cast<float*>(tap_buf_->data());
    const std::int64_t co = co_, ci = ci_, k = k_, tap = tap_;
    if (mode_ == 0 || mode_ == 1) {
      const float* w = in[1].data<float>();
#pragma omp parallel for schedule(static)
      for (std::int64_t o = 0; o < co; ++o)
        for (std::int64_t i = 0; i < ci; ++i) dense[o * ci + i] = w[(o * ci + i) * k + tap];
      a_.set_data_handle(in[0].raw_data());
      b_.set_data_handle(dense);
      c_.set_data_handle(out[0].raw_data());
      if (mode_ == 0 && bias_) bias_mem_.set_data_handle(in[2].raw_data());
      args_.execute(prim_);
      stream().wait();
      return ok_status();
    }
    a_.set_data_handle(in[1].raw_data());  // dy
    b_.set_data_handle(in[0].raw_data());  // x
    c_.set_data_handle(dense);
    args_.execute(prim_);
    stream().wait();
    float* dw = out[0].data<float>();
    std::memset(dw, 0, static_cast<std::size_t>(w_numel_) * sizeof(float));
#pragma omp parallel for schedule(static)
    for (std::int64_t o = 0; o < co; ++o)
      for (std::int64_t i = 0; i < ci; ++i) dw[(o * ci + i) * k + tap] = dense[o * ci + i];
    return ok_status();
  }

  const char* impl() const override { return "onednn"; }

 private:
  int mode_;
  bool bias_;
  std::int64_t tap_, w_numel_, co_ = 0, ci_ = 0, k_ = 1;
  std::shared_ptr<Storage> tap_buf_;
  dnnl::matmul prim_;
  memory a_, b_, c_, bias_mem_;
  ExecArgs args_;
};

// The depthwise case (one input and one output channel per group) is a
// per-channel scale by the tap's weight: mobilenet_v3_small ends in 5x5
// depthwise convolutions over 1x1 maps, 1 useful tap in 25, which oneDNN's
// convolutions took 10.7 ms per step over (0.9 MFLOP of work).
//   forward      y[n, c] = x[n, c] w[c, tap] (+ b[c]) (ReLU)
//   input grad   dx[n, c] = dy[n, c] w[c, tap]
//   weight grad  dw[c, tap] = sum_n dy[n, c] x[n, c], other taps 0
class DepthwisePointKernel final : public Kernel {
 public:
  DepthwisePointKernel(int mode, const Shape& x, const Shape& w, std::int64_t tap, bool bias,
                       bool relu)
      : mode_(mode), bias_(bias), relu_(relu), n_(x[0]), c_(w[0]), k_(w[2] * w[3]), tap_(tap) {}

  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    const std::int64_t n = n_, c = c_, k = k_, tap = tap_;
    if (mode_ == 2) {  // (x, dy) -> dw
      const float* x = in[0].data<float>();
      const float* dy = in[1].data<float>();
      float* dw = out[0].data<float>();
      std::memset(dw, 0, static_cast<std::size_t>(c * k) * sizeof(float));
      for (std::int64_t b = 0; b < n; ++b)
#pragma omp simd
        for (std::int64_t ch = 0; ch < c; ++ch) dw[ch * k + tap] += dy[b * c + ch] * x[b * c + ch];
      return ok_status();
    }
    const float* src = in[0].data<float>();  // x, or dy for the input gradient
    const float* w = in[1].data<float>();
    const float* b = mode_ == 0 && bias_ ? in[2].data<float>() : nullptr;
    float* y = out[0].data<float>();
    for (std::int64_t r = 0; r < n; ++r)
#pragma omp simd
      for (std::int64_t ch = 0; ch < c; ++ch) {
        float v = src[r * c + ch] * w[ch * k + tap] + (b ? b[ch] : 0.0f);
        y[r * c + ch] = relu_ && v < 0 ? 0.0f : v;
      }
    return ok_status();
  }

  const char* impl() const override { return "depthwise-point"; }

 private:
  int mode_;
  bool bias_, relu_;
  std::int64_t n_, c_, k_, tap_;
};

}  // namespace

std::unique_ptr<Kernel> make_point_conv(int mode, const Node& n, const Shape& x, const Shape& w,
                                        const Shape& y, bool bias, bool relu) {
  const std::int64_t groups = n.attrs.get_int_or("groups", 1);
  if (x.size() != 4 || w.size() != 4 || y.size() != 4) return nullptr;
  const bool depthwise = groups > 1 && groups == x[1] && groups == w[0] && w[1] == 1;
  if (groups != 1 && !depthwise) return nullptr;
  auto pd = n.attrs.get_ints_or("padding", {0, 0});
  auto dl = n.attrs.get_ints_or("dilation", {1, 1});
  if (pd.size() != 2 || dl.size() != 2) return nullptr;
  std::int64_t th = only_tap(x[2], y[2], w[2], pd[0], dl[0]),
               tw = only_tap(x[3], y[3], w[3], pd[1], dl[1]);
  if (th < 0 || tw < 0) return nullptr;
  if (depthwise)
    return std::make_unique<DepthwisePointKernel>(mode, x, w, th * w[3] + tw, bias, relu);
  return std::make_unique<PointConvKernel>(mode, x, w, th * w[3] + tw, bias, relu);
}

}  // namespace shoal::runtime::cpu::dnnl_detail
