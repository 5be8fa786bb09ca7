// add_layer_norm: a pre-norm transformer's residual add and the layer norm
// that reads the sum, in one pass over the rows (runtime::
// fuse_residual_norms makes the node). Each row of a + b is written to the
// sum's output and normalized while it is in L1; the normalized row is
// stored f32 or, under --precision bf16, bf16. The f64 path (gradient
// checks) adds, then runs the reference layer norm on the sum.
#include <algorithm>
#include <cmath>
#include <span>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/layer_norm_rows.h"

namespace shoal::runtime::cpu {
namespace {

// in: a, b, gamma, beta -> y = layer_norm(a + b), s = a + b.
void add_layer_norm_f32(double eps, std::span<const Tensor> in, std::span<Tensor> out) {
  const std::int64_t d = in[0].shape().back(), rows = in[0].numel() / std::max<std::int64_t>(d, 1);
  const SumRows src{in[0].data<float>(), in[1].data<float>(), out[1].data<float>()};
  const float *g = in[2].data<float>(), *b = in[3].data<float>();
  Tensor& y = out[0];
  if (y.dtype() == DType::kBF16)
    layer_norm_rows(eps, rows, d, src, g, b, StoreBF16{static_cast<std::uint16_t*>(y.raw_data())});
  else
    layer_norm_rows(eps, rows, d, src, g, b, StoreF32{y.data<float>()});
}

template <typename T>
void add_layer_norm_ref(double eps, std::span<const Tensor> in, std::span<Tensor> out) {
  const std::int64_t d = in[0].shape().back(), rows = in[0].numel() / std::max<std::int64_t>(d, 1);
  const T *a = in[0].data<T>(), *b = in[1].data<T>(), *g = in[2].data<T>(), *beta = in[3].data<T>();
  T* s = out[1].data<T>();
  T* y = out[0].data<T>();
  for (std::int64_t i = 0; i < rows * d; ++i) s[i] = a[i] + b[i];
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* p = s + r * d;
    double m = 0, v = 0;
    for (std::int64_t i = 0; i < d; ++i) m += p[i];
    m /= static_cast<double>(d);
    for (std::int64_t i = 0; i < d; ++i) v += (p[i] - m) * (p[i] - m);
    const double rstd = 1.0 / std::sqrt(v / static_cast<double>(d) + eps);
    for (std::int64_t i = 0; i < d; ++i)
      y[r * d + i] = static_cast<T>((p[i] - m) * rstd * g[i] + beta[i]);
  }
}

}  // namespace

void register_residual_norm(KernelRegistry& r) {
  r.add("add_layer_norm", [](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
    const double eps = n.attrs.get_float_or("eps", 1e-5);
    for (std::size_t i = 0; i < in.size(); ++i)
      if (blocked_input(n, i))
        return failed_precondition("{}: add_layer_norm reads the plain layout", n.label());
    if (in[0].dtype == DType::kF32)
      return make_fn(
          [eps](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
            add_layer_norm_f32(eps, x, y);
            return ok_status();
          },
          n.outputs[0].dtype == DType::kBF16 ? "bf16-writer" : "rows");
    if (n.outputs[0].dtype != in[0].dtype)
      return failed_precondition("{}: a {} add_layer_norm writes {}, not {}", n.label(),
                                 dtype_name(in[0].dtype), dtype_name(in[0].dtype),
                                 dtype_name(n.outputs[0].dtype));
    return FLOAT_KERNEL(add_layer_norm_ref<T>(eps, in, out));
  });
}

}  // namespace shoal::runtime::cpu
