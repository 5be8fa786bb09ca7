// Kernels on oneDNN: the layout conversion, max/avg pooling, and the
// factories that put them (and the matmuls of onednn_matmul.cc, the
// convolutions of onednn_conv.cc) in front of the reference kernels; GELU
// and softmax are in onednn_eltwise.cc.
// Primitives, reorders, scratch buffers and memory objects are created
// once per node at compile time; a run only swaps data handles. oneDNN
// throws: every call stays inside these files, and a primitive oneDNN
// cannot build falls back to the reference kernel.
#include <dnnl.hpp>
#include <unordered_map>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/onednn_internal.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"

namespace shoal::runtime::cpu {
namespace {

using namespace dnnl_detail;  // NOLINT: this file's own shared pieces

// The `layout` op: plain NCHW <-> blocked nChw16c (attr blocked: 1 = to
// blocked), one oneDNN reorder.
class LayoutKernel final : public DnnlKernel {
 public:
  LayoutKernel(const Shape& s, bool to_blocked, dt t = dt::f32) {
    memory::desc plain(dims_of(s), t, tag::nchw), blk(dims_of(s), t, tag::nChw16c);
    src_ = memory(to_blocked ? plain : blk, engine(), DNNL_MEMORY_NONE);
    dst_ = memory(to_blocked ? blk : plain, engine(), DNNL_MEMORY_NONE);
    prim_ = dnnl::reorder(src_, dst_);
    args_ = {{DNNL_ARG_FROM, &src_}, {DNNL_ARG_TO, &dst_}};
  }
  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    src_.set_data_handle(in[0].raw_data());
    dst_.set_data_handle(out[0].raw_data());
    args_.execute(prim_);
    stream().wait();
    return ok_status();
  }

 private:
  dnnl::reorder prim_;
  memory src_, dst_;
  ExecArgs args_;
};

// Runs a kernel that reads and writes plain layouts on a node whose
// operands the layout pass made blocked: blocked inputs are converted into
// plain scratch tensors first, blocked outputs computed into plain scratch
// and converted after. All buffers are made here, none in run().
class PlainAdapter final : public Kernel {
 public:
  PlainAdapter(const Node& n, const Inputs& in, std::unique_ptr<Kernel> inner)
      : inner_(std::move(inner)) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!blocked_input(n, i)) continue;
      conv_in_.push_back({i, std::make_unique<LayoutKernel>(in[i].shape, false),
                          Tensor::empty(in[i].shape, in[i].dtype)});
    }
    for (std::size_t j = 0; j < n.outputs.size(); ++j) {
      if (!blocked_output(n, j)) continue;
      conv_out_.push_back({j, std::make_unique<LayoutKernel>(n.outputs[j].shape, true),
                           Tensor::empty(n.outputs[j].shape, n.outputs[j].dtype)});
    }
    in_.resize(in.size());
    out_.resize(n.outputs.size());
  }
  Status run(const KernelContext& c, std::span<const Tensor> in, std::span<Tensor> out) override {
    std::copy(in.begin(), in.end(), in_.begin());
    std::copy(out.begin(), out.end(), out_.begin());
    for (Conv& cv : conv_in_) {
      SHOAL_RETURN_IF_ERROR(cv.k->run(c, in.subspan(cv.index, 1), std::span<Tensor>(&cv.plain, 1)));
      in_[cv.index] = cv.plain;
    }
    for (Conv& cv : conv_out_) out_[cv.index] = cv.plain;
    SHOAL_RETURN_IF_ERROR(inner_->run(c, in_, out_));
    for (Conv& cv : conv_out_) {
      const Tensor src = cv.plain;
      SHOAL_RETURN_IF_ERROR(
          cv.k->run(c, std::span<const Tensor>(&src, 1), out.subspan(cv.index, 1)));
    }
    return ok_status();
  }
  const char* impl() const override { return inner_->impl(); }

 private:
  struct Conv {
    std::size_t index;
    std::unique_ptr<LayoutKernel> k;
    Tensor plain;
  };
  std::unique_ptr<Kernel> inner_;
  std::vector<Conv> conv_in_, conv_out_;
  std::vector<Tensor> in_, out_;
};

class PoolKernel final : public SrcDstKernel {
 public:
  PoolKernel(const Node& n, const Shape& x, const Shape& y, bool is_max) {
    auto k = n.attrs.get_ints_or("kernel", {1, 1});
    auto st = n.attrs.get_ints_or("stride", k);
    auto pd = n.attrs.get_ints_or("padding", {0, 0});
    memory::dims pr;
    for (int i = 0; i < 2; ++i) pr.push_back((y[2 + i] - 1) * st[i] + k[i] - x[2 + i] - pd[i]);
    const tag t = blocked_input(n, 0) ? tag::nChw16c : tag::nchw;  // output: the same
    memory::desc xp(dims_of(x), dt::f32, t), yp(dims_of(y), dt::f32, t);
    dnnl::pooling_forward::desc d(
        dnnl::prop_kind::forward_inference,
        is_max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_include_padding, xp,
        yp, {st[0], st[1]}, {k[0], k[1]}, {pd[0], pd[1]}, pr);
    dnnl::pooling_forward::primitive_desc p(d, attr(false), engine());
    // Where oneDNN has no JIT pooling for this layout on this ISA (nChw16c
    // on AVX2: 56 ms per CNN pooling, 67% of a step) it offers its scalar
    // reference loop; the blocked layout has a SIMD kernel of our own.
    if (blocked_input(n, 0) && std::string(p.impl_info_str()).starts_with("ref"))
      throw dnnl::error(dnnl_unimplemented, "only a reference pooling for the blocked layout");
    init_scratch(p);
    bind(dnnl::pooling_forward(p), xp, yp);
  }
};

// Wraps the reference factory: f32 nodes get a oneDNN kernel when oneDNN can
// build one, everything else keeps the reference kernel.
void override_f32(
    KernelRegistry& r, const std::string& op,
    std::function<std::unique_ptr<Kernel>(const Node&, const Inputs&, const TensorType&)> make) {
  const KernelFactory* prev = r.find(op);
  SHOAL_CHECK(prev != nullptr, "no reference kernel for {}", op);
  KernelFactory fallback = *prev;
  r.add(op, [fallback, make](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    // SHOAL_ONEDNN=0: reference kernels only (read when compiling; for
    // comparisons and for testing the fallbacks).
    SHOAL_ASSIGN_OR_RETURN(bool onednn, env::get_bool("SHOAL_ONEDNN", true));
    // bf16 operands (--precision bf16) run on oneDNN or not at all: the
    // reference kernels compute in f32 and f64 only.
    const bool bf16 = in[0].dtype == DType::kBF16;
    if (bf16 && !onednn)
      return failed_precondition("{}: bf16 operands run on oneDNN, and SHOAL_ONEDNN=0 turns it off",
                                 n.label());
    if ((in[0].dtype == DType::kF32 || bf16) && onednn) {
      try {
        // Output type is re-derived by the caller; kernels take it from the node.
        std::unique_ptr<Kernel> k = make(n, in, n.outputs[0]);
        if (k) return k;
      } catch (const dnnl::error& e) {
        if (bf16)
          return failed_precondition("{}: oneDNN has no bf16 kernel for {} ({})", n.label(),
                                     in[0].str(), e.what());
        SHOAL_LOG_DEBUG("{}: oneDNN declined ({}); using the reference kernel", n.label(),
                        e.what());
      }
      if (bf16)
        return failed_precondition("{}: oneDNN has no bf16 kernel for {}", n.label(), in[0].str());
    }
    // The reference convolutions read and write plain layouts only: the
    // blocked operands go through conversions around them.
    if (n.op.starts_with("conv2d") &&
        (blocked_input(n, 0) || blocked_input(n, 1) || blocked_output(n, 0))) {
      SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> k, fallback(n, in));
      try {
        return std::unique_ptr<Kernel>(std::make_unique<PlainAdapter>(n, in, std::move(k)));
      } catch (const dnnl::error& e) {
        return internal_error("{}: cannot convert its blocked operands: {}", n.label(), e.what());
      }
    }
    return fallback(n, in);
  });
}

}  // namespace

void register_onednn(KernelRegistry& r) {
  override_f32(r, "matmul",
               [](const Node& n, const Inputs& in, const TensorType& y) -> std::unique_ptr<Kernel> {
                 Shape ab(in[0].shape.begin(), in[0].shape.end() - 2),
                     bb(in[1].shape.begin(), in[1].shape.end() - 2);
                 if (ab != bb || num_elements(y.shape) == 0 || in[0].shape.back() == 0)
                   return nullptr;
                 return make_matmul(in[0].shape, y.shape, n.attrs.get_int_or("transpose_a", 0) != 0,
                                    n.attrs.get_int_or("transpose_b", 0) != 0, false, false, false,
                                    dnnl_type(in[0].dtype), dnnl_type(y.dtype));
               });
  override_f32(r, "linear",
               [](const Node& n, const Inputs& in, const TensorType& y) -> std::unique_ptr<Kernel> {
                 if (num_elements(y.shape) == 0 || in[0].shape[1] == 0) return nullptr;
                 return make_matmul(in[0].shape, y.shape, false, true, in.size() == 3,
                                    n.attrs.get_string_or("activation", "") == "relu", true,
                                    dnnl_type(in[0].dtype), dnnl_type(y.dtype),
                                    in.size() == 3 ? dnnl_type(in[2].dtype) : dt::f32);
               });
  override_f32(r, "conv2d",
               [](const Node& n, const Inputs& in, const TensorType& y) -> std::unique_ptr<Kernel> {
                 if (num_elements(y.shape) == 0) return nullptr;
                 return make_conv(0, n, in[0].shape, in[1].shape, y.shape, in.size() == 3,
                                  n.attrs.get_string_or("activation", "") == "relu",
                                  dnnl_type(in[0].dtype), dnnl_type(y.dtype));
               });
  override_f32(r, "conv2d_grad_input",
               [](const Node& n, const Inputs& in, const TensorType& y) -> std::unique_ptr<Kernel> {
                 if (num_elements(in[0].shape) == 0) return nullptr;
                 return make_conv(1, n, y.shape, in[1].shape, in[0].shape, false, false, dt::f32,
                                  dnnl_type(in[0].dtype));
               });
  override_f32(r, "conv2d_grad_weight",
               [](const Node& n, const Inputs& in, const TensorType& y) -> std::unique_ptr<Kernel> {
                 if (num_elements(in[1].shape) == 0) return nullptr;
                 return make_conv(2, n, in[0].shape, y.shape, in[1].shape, false, false,
                                  dnnl_type(in[0].dtype), dnnl_type(in[1].dtype));
               });
  register_layout_op();
  r.add("layout", [](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    try {
      return std::unique_ptr<Kernel>(std::make_unique<LayoutKernel>(
          in[0].shape, n.attrs.get_int_or("blocked", 0) != 0, dnnl_type(in[0].dtype)));
    } catch (const dnnl::error& e) {
      return internal_error("{}: oneDNN cannot reorder {}: {}", n.label(), in[0].str(), e.what());
    }
  });
  for (bool grad : {false, true}) {
    override_f32(
        r, grad ? "gelu_grad" : "gelu",
        [grad](const Node& n, const Inputs& in, const TensorType& y) -> std::unique_ptr<Kernel> {
          const std::int64_t count = num_elements(y.shape);
          // Element i of the output reads element i of the inputs: any layout
          // all operands share (the blocked one has no padding) is the same
          // flat array.
          const bool blocked = blocked_output(n, 0);
          if (count == 0 || blocked_input(n, 0) != blocked) return nullptr;
          if (grad && (in[1].shape != in[0].shape || blocked_input(n, 1) != blocked))
            return nullptr;
          return make_eltwise(dnnl::algorithm::eltwise_gelu_erf, count, grad);
        });
  }
  // Forward only: their gradients are the graph's own mul/sub of y.
  const std::pair<const char*, dnnl::algorithm> vectorized[] = {
      {"tanh", dnnl::algorithm::eltwise_tanh},
      {"sigmoid", dnnl::algorithm::eltwise_logistic},
      {"exp", dnnl::algorithm::eltwise_exp}};
  for (const auto& [op, alg] : vectorized) {
    override_f32(
        r, op, [alg](const Node& n, const Inputs&, const TensorType& y) -> std::unique_ptr<Kernel> {
          const std::int64_t count = num_elements(y.shape);
          if (count == 0 || blocked_input(n, 0) != blocked_output(n, 0)) return nullptr;
          return make_eltwise(alg, count, false);
        });
  }
  for (bool log : {false, true}) {
    override_f32(
        r, log ? "log_softmax" : "softmax",
        [log](const Node& n, const Inputs& in, const TensorType& y) -> std::unique_ptr<Kernel> {
          const auto rank = static_cast<std::int64_t>(y.shape.size());
          std::int64_t axis = n.attrs.get_int_or("axis", -1);
          if (axis < 0) axis += rank;
          // Attention's scaled and masked softmax is softmax.cc's own kernel.
          if (num_elements(y.shape) == 0 || rank == 0 || axis < 0 || axis >= rank ||
              blocked_input(n, 0) || blocked_output(n, 0) || n.attrs.has("scale") ||
              n.attrs.get_int_or("causal", 0) != 0)
            return nullptr;
          return make_softmax(in[0].shape, static_cast<int>(axis), log);
        });
  }
  for (bool is_max : {true, false}) {
    override_f32(
        r, is_max ? "max_pool2d" : "avg_pool2d",
        [is_max](const Node& n, const Inputs& in, const TensorType& y) -> std::unique_ptr<Kernel> {
          if (num_elements(y.shape) == 0) return nullptr;
          return std::make_unique<PoolKernel>(n, in[0].shape, y.shape, is_max);
        });
  }
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("{}.{}.{} ({})", v->major, v->minor, v->patch,
                     v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other");
}

}  // namespace shoal::runtime::cpu
