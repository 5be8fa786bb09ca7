// Pieces the oneDNN kernels share (onednn.cc, conv_point.cc): the engine
// and stream, argument lists built once, and the kernel base with a user
// scratchpad and the ReLU post-op.
#pragma once

#include <dnnl.hpp>
#include <memory>
#include <string_view>
#include <vector>

#include "runtime/cpu/kernels_internal.h"

namespace shoal::runtime::cpu::dnnl_detail {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

inline dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
inline dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

// Execution arguments as the C API takes them, built once per kernel: the
// C++ execute() converts its map to a fresh vector on every call.
class ExecArgs {
 public:
  ExecArgs() = default;
  ExecArgs(std::initializer_list<std::pair<int, const memory*>> args) {
    for (const auto& [k, m] : args) add(k, *m);
  }
  void add(int k, const memory& m) { v_.push_back(dnnl_exec_arg_t{k, m.get()}); }
  void execute(const dnnl::primitive& p) const {
    dnnl_status_t st =
        dnnl_primitive_execute(p.get(), stream().get(), static_cast<int>(v_.size()), v_.data());
    if (st != dnnl_success) throw dnnl::error(st, "dnnl_primitive_execute");
  }

 private:
  std::vector<dnnl_exec_arg_t> v_;
};

inline memory::dims dims_of(const Shape& s) { return memory::dims(s.begin(), s.end()); }

// oneDNN's name for a Shoal element type of the products (f32, bf16).
inline dt dnnl_type(DType t) { return t == DType::kBF16 ? dt::bf16 : dt::f32; }

// A user scratchpad (each kernel owns its buffer), and ReLU as a post-op.
inline dnnl::primitive_attr user_scratch_attr(bool relu) {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (relu) {
    dnnl::post_ops po;
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    a.set_post_ops(po);
  }
  return a;
}

class DnnlKernel : public Kernel {
 public:
  // "onednn", or "onednn:ref" where oneDNN chose its scalar reference loop.
  const char* impl() const override { return impl_; }

 protected:
  void init_scratch(const dnnl::primitive_desc_base& pd) {
    if (std::string_view(pd.impl_info_str()).starts_with("ref")) mark_reference();
    auto md = pd.scratchpad_desc();
    scratch_buf_ = Storage::allocate(md.get_size());
    scratch_ = memory(md, engine(), scratch_buf_->data());
  }
  static dnnl::primitive_attr attr(bool relu) { return user_scratch_attr(relu); }
  void mark_reference() { impl_ = "onednn:ref"; }
  // A kernel computing in bf16: "onednn:bf16" (unless oneDNN fell back to its reference loop).
  void mark_bf16() {
    if (std::string_view(impl_) == "onednn") impl_ = "onednn:bf16";
  }
  std::shared_ptr<Storage> scratch_buf_;
  memory scratch_;

 private:
  const char* impl_ = "onednn";
};

// A primitive that reads one tensor and writes one (pooling, softmax): the
// subclass builds it and its scratchpad (init_scratch), then bind()s it with
// the two memory descriptors; run() points them at the step's tensors.
class SrcDstKernel : public DnnlKernel {
 public:
  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    x_.set_data_handle(in[0].raw_data());
    y_.set_data_handle(out[0].raw_data());
    args_.execute(prim_);
    stream().wait();
    return ok_status();
  }

 protected:
  void bind(dnnl::primitive p, const memory::desc& x, const memory::desc& y) {
    prim_ = std::move(p);
    x_ = memory(x, engine(), DNNL_MEMORY_NONE);
    y_ = memory(y, engine(), DNNL_MEMORY_NONE);
    args_ = {{DNNL_ARG_SRC, &x_}, {DNNL_ARG_DST, &y_}, {DNNL_ARG_SCRATCHPAD, &scratch_}};
  }

 private:
  dnnl::primitive prim_;
  memory x_, y_;
  ExecArgs args_;
};

// y = op(A) op(B) (+ bias) (relu) on oneDNN (onednn_matmul.cc): a the first
// operand's shape, y the result's; ta, tb read A, B transposed; linear: x
// [N, in] times w [out, in]^T. src the operands' type, dst the result's.
// Throws dnnl::error where oneDNN builds nothing.
std::unique_ptr<Kernel> make_matmul(const Shape& a, const Shape& y, bool ta, bool tb, bool bias,
                                    bool relu, bool linear, dt src = dt::f32, dt dst = dt::f32,
                                    dt bias_t = dt::f32);
// A convolution pass on oneDNN (onednn_conv.cc): mode 0 forward (x, w[, b])
// -> y, 1 input gradient (dy, w) -> dx, 2 weight gradient (x, dy) -> dw;
// x, w, y the x-, weight- and y-shaped operands' shapes; xt, yt the types
// the x- and y-shaped operands arrive or leave in (bf16 where --precision
// bf16 cast them). Throws dnnl::error where oneDNN builds nothing.
std::unique_ptr<Kernel> make_conv(int mode, const Node& n, const Shape& x, const Shape& w,
                                  const Shape& y, bool bias, bool relu, dt xt = dt::f32,
                                  dt yt = dt::f32);
// A oneDNN kernel for convolutions whose input and output maps are 1x1 (the
// last stage of a ResNet on small images), as matmuls with the one kernel
// tap that reads the input; null when the node is not such a convolution.
// mode and shapes as make_conv's: 0 forward, 1 input gradient, 2 weight gradient.
std::unique_ptr<Kernel> make_point_conv(int mode, const Node& n, const Shape& x, const Shape& w,
                                        const Shape& y, bool bias, bool relu);
// A depthwise convolution over maps of at most 8x8 as direct loops
// (conv_depthwise.cc), or null. x_blocked/y_blocked: the layouts of the
// x-shaped and y-shaped operands (nChw16c when true).
std::unique_ptr<Kernel> make_small_depthwise(int mode, const Node& n, const Shape& x,
                                             const Shape& w, const Shape& y, bool x_blocked,
                                             bool y_blocked, bool bias, bool relu);

// The input gradient of a convolution whose stride is its kernel (no
// padding or dilation, one group, plain layouts) of fewer than 16 input or
// output channels, as direct loops (conv_patch.cc), or null.
std::unique_ptr<Kernel> make_patch_grad_input(const Node& n, const Shape& x, const Shape& w,
                                              const Shape& y, bool x_blocked, bool y_blocked);

// GELU over `count` elements (grad: the node (x, dy) -> dx), and softmax or
// log-softmax over `axis` of `shape`, on oneDNN (onednn_eltwise.cc).
// An eltwise algorithm's forward (x -> y) or, with grad, backward ((x, dy) -> dx).
std::unique_ptr<Kernel> make_eltwise(dnnl::algorithm alg, std::int64_t count, bool grad);
std::unique_ptr<Kernel> make_softmax(const Shape& shape, int axis, bool log);

}  // namespace shoal::runtime::cpu::dnnl_detail
