// GELU and softmax as oneDNN's vectorized eltwise and softmax primitives
// (the kernels' factories are in onednn_internal.h; registered with the
// others in onednn.cc).
#include <dnnl.hpp>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/onednn_internal.h"

namespace shoal::runtime::cpu::dnnl_detail {
namespace {

// GELU (exact, erf form) and its gradient, tanh, sigmoid and exp as oneDNN's
// JIT eltwise primitives: the reference kernels call libm's scalar erf, tanh
// or exp per element (erf 12 ns each: 43% of a GPT step at 1 thread; tanh
// 43% of a tanh LeNet's), oneDNN evaluates them in vector registers. Any
// layout every operand shares (the factories in onednn.cc check): the
// element count is all that matters. Forward: src -> dst. Gradient node
// (x, dy) -> dx.
class EltwiseKernel final : public DnnlKernel {
 public:
  EltwiseKernel(dnnl::algorithm alg, std::int64_t n, bool grad) : grad_(grad) {
    memory::desc md({n}, dt::f32, tag::x);
    dnnl::eltwise_forward::desc fd(dnnl::prop_kind::forward_training, alg, md, 0.f, 0.f);
    dnnl::eltwise_forward::primitive_desc fpd(fd, attr(false), engine());
    x_ = memory(md, engine(), DNNL_MEMORY_NONE);
    y_ = memory(md, engine(), DNNL_MEMORY_NONE);
    if (!grad) {
      prim_ = dnnl::eltwise_forward(fpd);
      init_scratch(fpd);
      args_ = {{DNNL_ARG_SRC, &x_}, {DNNL_ARG_DST, &y_}, {DNNL_ARG_SCRATCHPAD, &scratch_}};
      return;
    }
    dnnl::eltwise_backward::desc bd(alg, md, md, 0.f, 0.f);
    dnnl::eltwise_backward::primitive_desc bpd(bd, attr(false), engine(), fpd);
    prim_ = dnnl::eltwise_backward(bpd);
    init_scratch(bpd);
    dy_ = memory(md, engine(), DNNL_MEMORY_NONE);
    args_ = {{DNNL_ARG_SRC, &x_},
             {DNNL_ARG_DIFF_DST, &dy_},
             {DNNL_ARG_DIFF_SRC, &y_},
             {DNNL_ARG_SCRATCHPAD, &scratch_}};
  }
  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    x_.set_data_handle(in[0].raw_data());
    if (grad_) dy_.set_data_handle(in[1].raw_data());
    y_.set_data_handle(out[0].raw_data());
    args_.execute(prim_);
    stream().wait();
    return ok_status();
  }

 private:
  bool grad_;
  dnnl::primitive prim_;
  memory x_, dy_, y_;
  ExecArgs args_;
};

// Softmax and log-softmax over one axis as oneDNN's primitive (vectorized
// exp; the reference kernel's scalar exp was 12% of a GPT step). Plain
// layouts; the shape is kept so the axis means what it does in the graph.
class SoftmaxKernel final : public SrcDstKernel {
 public:
  SoftmaxKernel(const Shape& shape, int axis, bool log) {
    memory::desc md(dims_of(shape), dt::f32, plain(shape));
    const auto alg = log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate;
    dnnl::softmax_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, md, md, axis);
    dnnl::softmax_v2_forward::primitive_desc pd(d, attr(false), engine());
    init_scratch(pd);
    bind(dnnl::softmax_v2_forward(pd), md, md);
  }

 private:
  static memory::dims plain(const Shape& s) {  // row-major strides
    memory::dims st(s.size(), 1);
    for (std::size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
    return st;
  }
};

}  // namespace

std::unique_ptr<Kernel> make_eltwise(dnnl::algorithm alg, std::int64_t count, bool grad) {
  return std::make_unique<EltwiseKernel>(alg, count, grad);
}

std::unique_ptr<Kernel> make_softmax(const Shape& shape, int axis, bool log) {
  return std::make_unique<SoftmaxKernel>(shape, axis, log);
}

}  // namespace shoal::runtime::cpu::dnnl_detail
