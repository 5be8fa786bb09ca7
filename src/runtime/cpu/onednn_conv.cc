// oneDNN's convolutions: conv2d forward with bias/ReLU post-ops and its
// data and weight gradients, in f32 (Winograd where it applies), or with
// bf16 operands under --precision bf16 (the activations arrive cast, the
// weights are converted while reordered), and the choice among them and
// the 1x1-map and small depthwise kernels (make_conv). Primitives,
// reorders and scratch are made once per node at compile time.
#include <array>
#include <cstdlib>
#include <dnnl.hpp>
#include <optional>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/onednn_internal.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"

namespace shoal::runtime::cpu::dnnl_detail {
namespace {

// An operand in the primitive's preferred layout. When it differs from the
// plain layout a scratch buffer and a reorder are kept.
struct Operand {
  memory user;   // plain, points into the arena at run time
  memory inner;  // what the primitive reads/writes
  std::shared_ptr<Storage> buf;
  std::optional<dnnl::reorder> to_inner, to_user;
  // reorder::execute(stream, src, dst) builds a map per call; ours is built once.
  ExecArgs reorder_args;

  void init(const memory::desc& plain, const memory::desc& want, bool is_output) {
    user = memory(plain, engine(), DNNL_MEMORY_NONE);
    if (want == plain) {
      inner = user;
      return;
    }
    buf = Storage::allocate(want.get_size());
    inner = memory(want, engine(), buf->data());
    if (is_output) {
      to_user = dnnl::reorder(inner, user);
      reorder_args = {{DNNL_ARG_FROM, &inner}, {DNNL_ARG_TO, &user}};
    } else {
      to_inner = dnnl::reorder(user, inner);
      reorder_args = {{DNNL_ARG_FROM, &user}, {DNNL_ARG_TO, &inner}};
    }
  }
  void bind(const void* p) { user.set_data_handle(const_cast<void*>(p)); }
  void pre() {
    if (to_inner) reorder_args.execute(*to_inner);
  }
  void post() {
    if (to_user) reorder_args.execute(*to_user);
  }
};

struct ConvParams {
  memory::dims strides, dilates, pad_l, pad_r;
  static ConvParams make(const Node& n, const Shape& x, const Shape& w, const Shape& y) {
    auto st = n.attrs.get_ints_or("stride", {1, 1});
    auto pd = n.attrs.get_ints_or("padding", {0, 0});
    auto dl = n.attrs.get_ints_or("dilation", {1, 1});
    ConvParams p;
    p.strides = {st[0], st[1]};
    p.dilates = {dl[0] - 1, dl[1] - 1};
    p.pad_l = {pd[0], pd[1]};
    for (int i = 0; i < 2; ++i)
      p.pad_r.push_back((y[2 + i] - 1) * st[i] + (w[2 + i] - 1) * dl[i] + 1 - x[2 + i] - pd[i]);
    return p;
  }
};

memory::desc weights_plain(const Shape& w, std::int64_t groups) {
  if (groups == 1) return memory::desc(dims_of(w), dt::f32, tag::oihw);
  return memory::desc({groups, w[0] / groups, w[1], w[2], w[3]}, dt::f32, tag::goihw);
}
memory::desc weights_any(const Shape& w, std::int64_t groups, dt t = dt::f32) {
  if (groups == 1) return memory::desc(dims_of(w), t, tag::any);
  return memory::desc({groups, w[0] / groups, w[1], w[2], w[3]}, t, tag::any);
}

// `c`: the type the convolution reads its operands in (f32, or bf16 under
// --precision bf16: the reorders into the primitive's layout convert on
// the way); `dst` the result's (f32, or bf16 for a batch norm to read).
dnnl::convolution_forward::primitive_desc conv_fwd_pd(const ConvParams& p, const Shape& x,
                                                      const Shape& w, const Shape& y,
                                                      std::int64_t groups, bool bias,
                                                      const dnnl::primitive_attr& a,
                                                      dnnl::algorithm alg, dt c = dt::f32,
                                                      dt dst = dt::f32) {
  memory::desc xa(dims_of(x), c, tag::any), ya(dims_of(y), dst, tag::any);
  memory::desc wa = weights_any(w, groups, c);
  if (bias) {
    memory::desc ba({w[0]}, dt::f32, tag::x);
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, alg, xa, wa, ba, ya,
                                      p.strides, p.dilates, p.pad_l, p.pad_r);
    return {d, a, engine()};
  }
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, alg, xa, wa, ya, p.strides,
                                    p.dilates, p.pad_l, p.pad_r);
  return {d, a, engine()};
}

// Whether the x-shaped and the y-shaped operand of a convolution pass hold
// the blocked layout (assign_blocked_layouts' annotations). mode 0 forward
// (x, w[, b]) -> y; 1 grad input (dy, w) -> dx; 2 grad weight (x, dy) -> dw.
std::pair<bool, bool> conv_layouts(int mode, const Node& n) {
  const bool x = mode == 1 ? blocked_output(n, 0) : blocked_input(n, 0);
  const bool y = mode == 0   ? blocked_output(n, 0)
                 : mode == 1 ? blocked_input(n, 0)
                             : blocked_input(n, 1);
  return {x, y};
}

// mode 0 forward (x, w[, b]) -> y; 1 grad input (dy, w) -> dx; 2 grad weight (x, dy) -> dw.
class ConvKernel final : public DnnlKernel {
 public:
  // bf16: operands read in bf16 (converted by the reorders into the
  // primitive's layouts where they arrive f32), the result written in f32.
  // xt, yt: the types the x-shaped and y-shaped operands arrive or leave in
  // (bf16 where --precision bf16 cast them; the result is f32).
  ConvKernel(int mode, const Node& n, const Shape& x, const Shape& w, const Shape& y, bool bias,
             bool relu, dnnl::algorithm alg, bool bf16 = false, dt xt = dt::f32, dt yt = dt::f32)
      : mode_(mode), bias_(bias) {
    const dt c = bf16 ? dt::bf16 : dt::f32;
    std::int64_t groups = n.attrs.get_int_or("groups", 1);
    ConvParams p = ConvParams::make(n, x, w, y);
    // Activations arrive and leave in the layout assign_blocked_layouts chose.
    const auto [x_blocked, y_blocked] = conv_layouts(mode, n);
    memory::desc xp(dims_of(x), xt, x_blocked ? tag::nChw16c : tag::nchw),
        yp(dims_of(y), yt, y_blocked ? tag::nChw16c : tag::nchw);
    memory::desc wp = weights_plain(w, groups);
    // A forward whose batch norm reads bf16 (yt bf16) writes it directly.
    const dt dst = mode == 0 && bf16 ? yt : dt::f32;
    auto fwd =
        conv_fwd_pd(p, x, w, y, groups, bias && mode == 0, attr(mode == 0 && relu), alg, c, dst);
    if (mode == 0) {
      prim_ = dnnl::convolution_forward(fwd);
      impl_ = fwd.impl_info_str();
      init_scratch(fwd);
      ops_[0].init(xp, fwd.src_desc(), false);
      ops_[1].init(wp, fwd.weights_desc(), false);
      ops_[2].init(yp, fwd.dst_desc(), true);
      if (bias) bias_mem_ = memory({{w[0]}, dt::f32, tag::x}, engine(), DNNL_MEMORY_NONE);
      args_ = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
    } else if (mode == 1) {
      memory::desc xa(dims_of(x), dt::f32, tag::any), ya(dims_of(y), c, tag::any);
      dnnl::convolution_backward_data::desc d(alg, xa, weights_any(w, groups, c), ya, p.strides,
                                              p.dilates, p.pad_l, p.pad_r);
      dnnl::convolution_backward_data::primitive_desc pd(d, attr(false), engine(), fwd);
      prim_ = dnnl::convolution_backward_data(pd);
      impl_ = pd.impl_info_str();
      init_scratch(pd);
      ops_[0].init(yp, pd.diff_dst_desc(), false);
      ops_[1].init(wp, pd.weights_desc(), false);
      ops_[2].init(xp, pd.diff_src_desc(), true);
      args_ = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
    } else {
      memory::desc xa(dims_of(x), c, tag::any), ya(dims_of(y), c, tag::any);
      dnnl::convolution_backward_weights::desc d(alg, xa, weights_any(w, groups), ya, p.strides,
                                                 p.dilates, p.pad_l, p.pad_r);
      dnnl::convolution_backward_weights::primitive_desc pd(d, attr(false), engine(), fwd);
      prim_ = dnnl::convolution_backward_weights(pd);
      impl_ = pd.impl_info_str();
      init_scratch(pd);
      ops_[0].init(xp, pd.src_desc(), false);
      ops_[1].init(yp, pd.diff_dst_desc(), false);
      ops_[2].init(wp, pd.diff_weights_desc(), true);
      args_ = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS};
    }
    exec_args_ = {{args_[0], &ops_[0].inner},
                  {args_[1], &ops_[1].inner},
                  {args_[2], &ops_[2].inner},
                  {DNNL_ARG_SCRATCHPAD, &scratch_}};
    if (mode_ == 0 && bias_) exec_args_.add(DNNL_ARG_BIAS, bias_mem_);
    if (bf16) mark_bf16();
  }
  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    ops_[0].bind(in[0].raw_data());
    ops_[1].bind(in[1].raw_data());
    ops_[2].bind(out[0].raw_data());
    ops_[0].pre();
    ops_[1].pre();
    if (mode_ == 0 && bias_) bias_mem_.set_data_handle(in[2].raw_data());
    exec_args_.execute(prim_);
    ops_[2].post();
    stream().wait();
    return ok_status();
  }
  // oneDNN's name for the implementation it chose ("jit_dw:avx512_core", ...).
  const std::string& onednn_impl() const { return impl_; }

 private:
  int mode_;
  bool bias_;
  std::string impl_;
  dnnl::primitive prim_;
  Operand ops_[3];
  memory bias_mem_;
  std::array<int, 3> args_ = {0, 0, 0};
  ExecArgs exec_args_;
};

// Winograd F(4x4, 3x3) where oneDNN has it for the shape (3x3, stride 1,
// channel counts it can block), direct otherwise: on ResNet-20 it made the
// training step 1.3x faster with the same loss curve (docs/runtime.md).
// SHOAL_CONV_ALGO=direct turns it off.
}  // namespace

std::unique_ptr<Kernel> make_conv(int mode, const Node& n, const Shape& x, const Shape& w,
                                  const Shape& y, bool bias, bool relu, dt xt, dt yt) {
  // --precision bf16 (graph::autocast_bf16 marks the node and casts its
  // activations): direct bf16 where oneDNN has it for the shape, else f32
  // direct with the reorders widening the bf16 operands (the trace and
  // `kernel_impls` tell "onednn:bf16" from "onednn").
  const bool bf16_in = xt == dt::bf16 || yt == dt::bf16;
  if (bf16_in || n.attrs.get_string_or("precision", "f32") == "bf16") {
    try {
      return std::make_unique<ConvKernel>(mode, n, x, w, y, bias, relu,
                                          dnnl::algorithm::convolution_direct, true, xt, yt);
    } catch (const dnnl::error& e) {
      SHOAL_LOG_DEBUG("{}: no bf16 convolution in oneDNN ({}); f32", n.label(), e.what());
    }
    if (bf16_in)
      return std::make_unique<ConvKernel>(mode, n, x, w, y, bias, relu,
                                          dnnl::algorithm::convolution_direct, false, xt, yt);
  }
  static const bool direct_only = [] {
    const char* e = std::getenv("SHOAL_CONV_ALGO");
    return e != nullptr && std::string(e) == "direct";
  }();
  // Winograd computes 4x4 output tiles: on 2x2 and 1x1 maps (resnet18 at
  // 32x32 ends in them) most of each tile is padding. Its training step at
  // 2 threads: 267 img/s with Winograd everywhere, 517 with none, 595 with
  // it on maps of 4x4 and larger (SHOAL_WINOGRAD_MIN, default 4).
  static const std::int64_t min_map = [] {
    auto v = env::get_int("SHOAL_WINOGRAD_MIN", 4);
    return v.ok() ? *v : 4;
  }();
  if (auto k = make_point_conv(mode, n, x, w, y, bias, relu)) return k;
  const auto [x_blocked, y_blocked] = conv_layouts(mode, n);
  if (mode == 1)
    if (auto k = make_patch_grad_input(n, x, w, y, x_blocked, y_blocked)) return k;
  std::unique_ptr<Kernel> small_dw =
      make_small_depthwise(mode, n, x, w, y, x_blocked, y_blocked, bias, relu);
  // Its kernels block 16 channels: a convolution of fewer outputs (an
  // imported 3-D convolution's first layer, 3 stacked channels to 8 on
  // 7x28 maps) pads them to 16 and ran 1.6x slower than direct, and one of
  // fewer inputs 10x (ResNet-20's first layer, 1 to 16 on 28x28: 1.0 ms
  // forward and 1.0 ms weight gradient, 0.1 ms each direct).
  const bool few_channels = w[0] < 16 || w[1] < 16;
  if (!direct_only && !few_channels && w[2] == 3 && w[3] == 3 && y[2] >= min_map &&
      y[3] >= min_map) {
    try {
      return std::make_unique<ConvKernel>(mode, n, x, w, y, bias, relu,
                                          dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
      // not implemented for this shape or ISA: direct below
    }
  }
  // A small-map depthwise pass runs direct only where oneDNN has no JIT
  // depthwise kernel for it (it falls back to im2col + GEMM per channel);
  // where it has one (mobilenet_v2's 3x3 over 8x8) it beats the loops 3x.
  std::unique_ptr<ConvKernel> k;
  try {
    k = std::make_unique<ConvKernel>(mode, n, x, w, y, bias, relu,
                                     dnnl::algorithm::convolution_direct);
  } catch (const dnnl::error&) {
    if (small_dw) return small_dw;
    throw;
  }
  // SHOAL_DEPTHWISE=direct takes the direct loops wherever they apply (tests).
  const char* force = std::getenv("SHOAL_DEPTHWISE");
  if (small_dw &&
      ((force && std::string(force) == "direct") || !k->onednn_impl().starts_with("jit_dw")))
    return small_dw;
  return k;
}

}  // namespace shoal::runtime::cpu::dnnl_detail
