// Helpers shared by the CPU kernel files: a function-backed Kernel, float
// dtype dispatch, and broadcast index arithmetic. Internal to runtime.
#pragma once

#include <omp.h>

#include <algorithm>
#include <functional>

#include "shoal/runtime/kernel.h"
#include "shoal/runtime/parallel.h"

namespace shoal::runtime::cpu {

using graph::Node;
using graph::TensorType;
using Inputs = std::vector<TensorType>;
using KernelFn =
    std::function<Status(const KernelContext&, std::span<const Tensor>, std::span<Tensor>)>;

class FnKernel final : public Kernel {
 public:
  FnKernel(KernelFn fn, const char* impl) : fn_(std::move(fn)), impl_(impl) {}
  Status run(const KernelContext& c, std::span<const Tensor> in, std::span<Tensor> out) override {
    return fn_(c, in, out);
  }
  const char* impl() const override { return impl_; }

 private:
  KernelFn fn_;
  const char* impl_;
};

inline Result<std::unique_ptr<Kernel>> make_fn(KernelFn fn, const char* impl = "ref") {
  return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(std::move(fn), impl));
}

// Calls f(T{}) for T in {float, double}; other dtypes are an internal error
// (shape inference has already refused them).
template <typename F>
Status dispatch_float(DType t, F&& f) {
  if (t == DType::kF32) return f(float{});
  if (t == DType::kF64) return f(double{});
  return internal_error("kernel called with dtype {}", dtype_name(t));
}

// A kernel factory's result for a float op: runs the statement(s) with T
// the output's dtype (float or double), `in`, `out` and the context `c` in
// scope, then returns ok. (A macro: the statements name T.)
#define FLOAT_KERNEL(...)                                                                  \
  make_fn([=](const KernelContext& c, std::span<const Tensor> in, std::span<Tensor> out) { \
    (void)c;                                                                               \
    return dispatch_float(out[0].dtype(), [&](auto tag) {                                  \
      using T = decltype(tag);                                                             \
      __VA_ARGS__;                                                                         \
      return ok_status();                                                                  \
    });                                                                                    \
  })

// Strides of `in` broadcast against the output shape `out` (0 where the
// input dimension is 1 or missing).
inline Shape broadcast_strides(const Shape& in, const Shape& out) {
  Shape st(out.size(), 0);
  Shape cs = contiguous_strides(in);
  std::size_t lead = out.size() - in.size();
  for (std::size_t i = 0; i < in.size(); ++i) st[lead + i] = in[i] == 1 ? 0 : cs[i];
  return st;
}

// A strided copy whose geometry is fixed at compile time, so a run does
// not allocate: dst[dst_off + sum(i*dst_st)] = src[src_off + sum(i*src_st)]
// for every index i of `shape` (strides in elements). Not thread-safe.
struct StridedCopy {
  Shape shape, src_st, dst_st;
  std::int64_t src_off = 0, dst_off = 0;
  std::size_t elem = 4;
  mutable std::vector<std::int64_t> idx;
  void run(const void* src, void* dst) const;

 private:
  void dense_rows(const char* s, char* d) const;
};

// Channels per block of the blocked activation layout (oneDNN's nChw16c):
// element (n, c, h, w) of an [N, C, H, W] tensor sits at
// ((n * C/16 + c/16) * H * W + h * W + w) * 16 + c % 16.
inline constexpr std::int64_t kBlockChannels = 16;

// Whether a node is built and run on one thread (op_threads.cc): under the
// passive OpenMP wait, with more than one thread, when it is small_node.
bool runs_serial(const graph::Graph& g, const Node& n);
// Under 16 MFLOP (matmul, convolution) or, for other ops, 64k elements in
// its largest operand: less work than waking a sleeping thread costs.
bool small_node(const graph::Graph& g, const Node& n);

// Limits OpenMP (and oneDNN, which asks OpenMP) to one thread for its
// lifetime when `serial`; restores the count after.
class SerialScope {
 public:
  explicit SerialScope(bool serial);
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int restore_;
};

// Whether input/output i of a node holds the blocked layout (annotations of
// assign_blocked_layouts; absent = plain).
inline bool blocked_input(const Node& n, std::size_t i) {
  auto v = n.attrs.get_ints_or("_blocked_in", {});
  return i < v.size() && v[i] != 0;
}
inline bool blocked_output(const Node& n, std::size_t i) {
  auto v = n.attrs.get_ints_or("_blocked_out", {});
  return i < v.size() && v[i] != 0;
}

void register_elementwise(KernelRegistry& r);
void register_reduce(KernelRegistry& r);
void register_softmax(KernelRegistry& r);       // softmax.cc
void register_bf16_writers(KernelRegistry& r);  // bf16_writers.cc, after register_onednn
void register_gelu(KernelRegistry& r);          // gelu.cc, after register_bf16_writers
void register_softmax_bf16(KernelRegistry& r);  // softmax.cc, after register_onednn
// Replaces op's factory with one that builds `bf16` where the node's
// output is bf16 (its inputs plain f32, checked) and the previous factory
// elsewhere (bf16_writers.cc). With `reads`, also where an input is bf16
// (every input plain f32 or bf16): `bf16` reads them (typed_in).
void add_writer(KernelRegistry& r, const char* op, KernelFactory bf16, bool reads = false);
// What kernel_impls says of such a kernel: "bf16-writer" where the node
// writes bf16, "bf16-reader" where it only reads it.
inline const char* bf16_impl(const Node& n) {
  return n.outputs[0].dtype == DType::kBF16 ? "bf16-writer" : "bf16-reader";
}

// f(p) with p the data of t (f32 or bf16) as const float* or as the bf16
// bits, const std::uint16_t*: a kernel templated on its operand types
// (vec_bf16.h's load16/store16, widen/put) instantiated per type.
template <typename F>
void typed_in(const Tensor& t, F f) {
  if (t.dtype() == DType::kBF16)
    f(static_cast<const std::uint16_t*>(t.raw_data()));
  else
    f(t.data<float>());
}
template <typename F>
void typed_out(Tensor& t, F f) {
  if (t.dtype() == DType::kBF16)
    f(static_cast<std::uint16_t*>(t.raw_data()));
  else
    f(t.data<float>());
}

// f32 -> bf16 bits, rounding to nearest even (elementwise.cc): in
// parallel above kParallelGrain, or on the calling thread.
void to_bf16(const float* x, std::uint16_t* y, std::int64_t n);
void to_bf16_serial(const float* x, std::uint16_t* y, std::int64_t n);
// n values stored as bf16 at y, computed in f32 by fill(lo, k, tmp)
// (tmp[i] = value lo + i) in chunks that stay in L1 (layer norm's bf16
// writer; GELU and softmax store through vec_bf16.h's store16).
template <typename Fill>
void chunks_to_bf16(std::uint16_t* y, std::int64_t n, Fill fill) {
  constexpr std::int64_t kChunk = 512;
  alignas(64) float tmp[kChunk];
  for (std::int64_t lo = 0; lo < n; lo += kChunk) {
    const std::int64_t k = std::min(kChunk, n - lo);
    fill(lo, k, tmp);
    to_bf16_serial(tmp, y + lo, k);
  }
}
void register_shape_ops(KernelRegistry& r);
void register_nn(KernelRegistry& r);
void register_norms(KernelRegistry& r);  // norm_ref.cc
void register_onednn(KernelRegistry& r);
void register_layout_op();  // the graph op `layout` (layout.cc)
std::string onednn_version();
// "avx512_bf16 amx_bf16", what of them this CPU has, or "" (cpu/isa.cc).
std::string bf16_isas();
// The CPU's model name from /proc/cpuinfo, or "this CPU" (cpu/isa.cc).
std::string cpu_model();

}  // namespace shoal::runtime::cpu
