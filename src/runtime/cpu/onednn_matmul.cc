// matmul and linear on oneDNN: y = op(A) op(B) (+ bias) (relu), batched
// when both operands share one batch shape; f32, or bf16 operands under
// --precision bf16.
//
// On more than one thread, two shapes are cut into one piece per thread,
// each a one-thread oneDNN matmul run inside one parallel region:
//  - a weight gradient, A^T B with a long shared dimension (the batch's
//    rows) and a small result: oneDNN 2.6's brgemm matmul splits only the
//    result's blocks, so the base GPT's [2048, 128]^T [2048, 128] ran 1.16x
//    faster on two threads than on one in bf16. Here each thread multiplies
//    its share of the rows and the partial sums are added.
//  - a batched matmul (attention's heads), split over its first batch
//    dimension: [32, 4, 64, 32] x [32, 4, 32, 64] in bf16 took as long on
//    two threads as on one.
// docs/runtime.md has the measurements.
#include <omp.h>

#include <algorithm>
#include <dnnl.hpp>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/onednn_internal.h"

namespace shoal::runtime::cpu::dnnl_detail {
namespace {

// A split of the shared dimension pays when it is this many times the
// result's larger side (and at least kMinSplitRows long).
constexpr memory::dim kSplitRatio = 4;
constexpr memory::dim kMinSplitRows = 512;

inline dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

// What one matmul computes, independent of how it is cut.
struct Geometry {
  memory::dims batch;  // the result's leading dimensions
  memory::dim m = 0, n = 0, k = 0;
  bool ta = false, tb = false, linear = false, bias = false, relu = false;
  dt src = dt::f32, dst = dt::f32, bias_t = dt::f32;

  // A [.., rows, cols] operand's descriptor, `trans` read transposed; the
  // strides are those of the whole tensor (batch[0] = b0 rows of it).
  memory::desc md(memory::dim b0, memory::dim rows, memory::dim cols, bool trans, dt type,
                  memory::dim ld) const {
    memory::dims d = batch, s(batch.size() + 2);
    if (!d.empty()) d[0] = b0;
    d.push_back(rows);
    d.push_back(cols);
    const memory::dim mat = rows * cols;
    for (std::size_t i = batch.size(); i-- > 0;)
      s[i] = i + 1 < batch.size() ? s[i + 1] * batch[i + 1] : mat;
    s[d.size() - 2] = trans ? 1 : ld;
    s[d.size() - 1] = trans ? ld : 1;
    return memory::desc(d, type, s);
  }
  memory::dim batch_rest() const {  // elements of one step of batch[0], per matrix
    memory::dim r = 1;
    for (std::size_t i = 1; i < batch.size(); ++i) r *= batch[i];
    return r;
  }
};

// One oneDNN matmul over a slice: batch[0] entries [b0, b0 + bn), or the
// shared dimension's rows [k0, k0 + kn); a_off.. are element offsets.
struct Piece {
  dnnl::matmul prim;
  memory a, b, y, bias;
  std::shared_ptr<Storage> scratch_buf;
  memory scratch;
  std::vector<dnnl_exec_arg_t> args;
  std::int64_t a_off = 0, b_off = 0, y_off = 0;
  Tensor partial;  // a split of the shared dimension: this piece's sum (but the first's)
  bool has_partial = false;
  std::string impl;  // oneDNN's implementation's name

  // bn: the slice's entries of batch[0] (ignored without a batch); kn its rows of k.
  Piece(const Geometry& g, memory::dim bn, memory::dim kn) {
    // ta: A is stored [k, m]; tb or linear: B is stored [n, k].
    const memory::desc a_md = g.md(bn, g.m, kn, g.ta, g.src, g.ta ? g.m : g.k),
                       b_md =
                           g.md(bn, kn, g.n, g.tb || g.linear, g.src, g.tb || g.linear ? g.k : g.n),
                       y_md = g.md(bn, g.m, g.n, false, g.dst, g.n);
    memory::desc bias_md;
    if (g.bias) {
      memory::dims bd(g.batch.size() + 2, 1);
      bd.back() = g.n;
      bias_md = memory::desc(bd, g.bias_t, tag::ab);
    }
    dnnl::matmul::desc d = g.bias ? dnnl::matmul::desc(a_md, b_md, bias_md, y_md)
                                  : dnnl::matmul::desc(a_md, b_md, y_md);
    dnnl::matmul::primitive_desc pd(d, user_scratch_attr(g.relu), engine());
    prim = dnnl::matmul(pd);
    impl = pd.impl_info_str();
    scratch_buf = Storage::allocate(pd.scratchpad_desc().get_size());
    scratch = memory(pd.scratchpad_desc(), engine(), scratch_buf->data());
    a = memory(a_md, engine(), DNNL_MEMORY_NONE);
    b = memory(b_md, engine(), DNNL_MEMORY_NONE);
    y = memory(y_md, engine(), DNNL_MEMORY_NONE);
    args = {{DNNL_ARG_SRC, a.get()},
            {DNNL_ARG_WEIGHTS, b.get()},
            {DNNL_ARG_DST, y.get()},
            {DNNL_ARG_SCRATCHPAD, scratch.get()}};
    if (g.bias) {
      bias = memory(bias_md, engine(), DNNL_MEMORY_NONE);
      args.push_back({DNNL_ARG_BIAS, bias.get()});
    }
  }

  void run(std::span<const Tensor> in, Tensor& out, dnnl::stream& s) {
    auto at = [](const Tensor& t, std::int64_t off) {
      return static_cast<char*>(t.raw_data()) +
             off * static_cast<std::int64_t>(dtype_size(t.dtype()));
    };
    a.set_data_handle(at(in[0], a_off));
    b.set_data_handle(at(in[1], b_off));
    y.set_data_handle(has_partial ? partial.raw_data() : at(out, y_off));
    if (in.size() > 2) bias.set_data_handle(in[2].raw_data());
    dnnl_status_t st =
        dnnl_primitive_execute(prim.get(), s.get(), static_cast<int>(args.size()), args.data());
    if (st != dnnl_success) throw dnnl::error(st, "dnnl_primitive_execute");
    s.wait();
  }
};

class MatmulKernel final : public DnnlKernel {
 public:
  MatmulKernel(const Geometry& g, int threads) : g_(g) {
    const bool split_k = threads > 1 && g.batch.empty() && g.ta && !g.tb && !g.linear && !g.bias &&
                         !g.relu && g.dst == dt::f32 && g.k >= kMinSplitRows &&
                         g.k >= kSplitRatio * std::max(g.m, g.n);
    const bool split_b = threads > 1 && !g.batch.empty() && g.batch[0] >= threads;
    pieces_.reserve(static_cast<std::size_t>(threads));
    if (!split_k && !split_b) {
      pieces_.emplace_back(g, g.batch.empty() ? 1 : g.batch[0], g.k);
    } else {
      SerialScope one(true);  // each piece is built for the one thread that runs it
      const memory::dim total = split_k ? g.k : g.batch[0];
      for (int t = 0; t < threads; ++t) {
        const memory::dim lo = total * t / threads, hi = total * (t + 1) / threads;
        // A cut of k has no batch (split_k above).
        Piece& p = pieces_.emplace_back(g, split_k ? 1 : hi - lo, split_k ? hi - lo : g.k);
        if (split_k) {
          p.a_off = lo * g.m;  // A [k, m]
          p.b_off = lo * g.n;  // B [k, n]
          if (t > 0) {
            p.partial = Tensor::empty({g.m, g.n}, DType::kF32);
            p.has_partial = true;
          }
        } else {
          const memory::dim r = g.batch_rest();
          p.a_off = lo * r * g.m * g.k;
          p.b_off = lo * r * g.k * g.n;
          p.y_off = lo * r * g.m * g.n;
        }
      }
      split_k_ = split_k;
    }
    if (pieces_[0].impl.starts_with("ref")) mark_reference();
    if (g.src == dt::bf16) mark_bf16();
    if (pieces_.size() > 1)
      split_impl_ = std::string(DnnlKernel::impl()) + (split_k_ ? ":split-k" : ":split-batch");
  }
  // "onednn:split-k" (the shared dimension cut), "onednn:bf16:split-batch"...
  const char* impl() const override {
    return split_impl_.empty() ? DnnlKernel::impl() : split_impl_.c_str();
  }

  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    if (pieces_.size() == 1) {
      pieces_[0].run(in, out[0], stream());
      return ok_status();
    }
    const int np = static_cast<int>(pieces_.size());
    bool failed = false;
#pragma omp parallel num_threads(np)
    {
      const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      for (int p = tid; p < np; p += nth) {
        try {
          pieces_[static_cast<std::size_t>(p)].run(in, out[0], thread_stream());
        } catch (const dnnl::error&) {
#pragma omp atomic write
          failed = true;
        }
      }
      if (split_k_) {
#pragma omp barrier
        const std::int64_t total = g_.m * g_.n, lo = total * tid / nth,
                           hi = total * (tid + 1) / nth;
        float* y = out[0].data<float>();
        for (int p = 1; p < np; ++p) {
          const float* q = pieces_[static_cast<std::size_t>(p)].partial.data<float>();
#pragma omp simd
          for (std::int64_t i = lo; i < hi; ++i) y[i] += q[i];
        }
      }
    }
    if (failed) return internal_error("a piece of a split matmul failed in oneDNN");
    return ok_status();
  }

 private:
  Geometry g_;
  std::vector<Piece> pieces_;
  bool split_k_ = false;
  std::string split_impl_;
};

}  // namespace

std::unique_ptr<Kernel> make_matmul(const Shape& a, const Shape& y, bool ta, bool tb, bool bias,
                                    bool relu, bool linear, dt src, dt dst, dt bias_t) {
  Geometry g;
  const std::size_t r = y.size();
  g.batch.assign(y.begin(), y.end() - 2);
  g.m = y[r - 2];
  g.n = y[r - 1];
  // Linear: x [N, in] times w [out, in]^T.
  g.k = linear ? a[1] : (ta ? a[a.size() - 2] : a[a.size() - 1]);
  g.ta = ta;
  g.tb = tb;
  g.linear = linear;
  g.bias = bias;
  g.relu = relu;
  g.src = src;
  g.dst = dst;
  g.bias_t = bias_t;
  return std::make_unique<MatmulKernel>(g, omp_get_max_threads());
}

}  // namespace shoal::runtime::cpu::dnnl_detail
