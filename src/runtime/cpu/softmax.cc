// The softmax family: softmax (with attention's scale and causal mask),
// log_softmax and softmax's gradient. Rows along the last axis (every
// softmax of the transformers) run a vectorized exp and write each row
// once; other axes run the strided loop. oneDNN's softmax primitive
// overrides plain f32 softmax (onednn.cc); the scaled and masked ones and
// the gradient stay here.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/vec_bf16.h"
#include "runtime/cpu/vec_math.h"

namespace shoal::runtime::cpu {
namespace {

using namespace vec;  // NOLINT: this directory's own vector helpers

// The softmax family's rows with any operand f32 or bf16 (vec_bf16.h;
// --precision bf16: the scores a product wrote bf16, the probabilities
// stored bf16 for the product that reads them and for the gradient),
// computed in f32. A row's exponentials wait in `e` (len floats, L1) for
// the normalization; an f32 row passes its own output as `e`.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers
template <typename X, typename Y>
void softmax_row_any(const X* x, Y* y, float* e, std::int64_t seen, std::int64_t len, float scale) {
  if (seen == 0) {
    for (std::int64_t j = 0; j < len; ++j) put(y + j, 0.0f);
    return;
  }
#if defined(SHOAL_VEC_BF16)
  const __m512 low = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vmx = low;
  for (std::int64_t j = 0; j < seen; j += 16) {
    const __mmask16 m = first(seen - j);
    vmx = _mm512_max_ps(vmx, _mm512_mask_mov_ps(low, m, load16(x + j, m)));
  }
  const float mx = lanes_max(vmx);
  const __m512 vs = _mm512_set1_ps(scale), vb = _mm512_set1_ps(-scale * mx);
  __m512 vsum = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < seen; j += 16) {
    const __mmask16 m = first(seen - j);
    const __m512 v = _mm512_maskz_mov_ps(m, exp16(_mm512_fmadd_ps(load16(x + j, m), vs, vb)));
    _mm512_mask_storeu_ps(e + j, m, v);
    vsum = _mm512_add_ps(vsum, v);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / lanes_sum(vsum));
  for (std::int64_t j = 0; j < len; j += 16) {
    // Lanes past `seen` (the mask's) come out 0.
    const __mmask16 live = first(std::max<std::int64_t>(seen - j, 0));
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, e + j), inv);
    store16(y + j, v, first(len - j));
  }
#else
  float mx = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < seen; ++j) mx = std::max(mx, widen(x[j]));
  float sum = 0;
  for (std::int64_t j = 0; j < seen; ++j) sum += e[j] = exp_f32(scale * (widen(x[j]) - mx));
  for (std::int64_t j = 0; j < len; ++j) put(y + j, j < seen ? e[j] / sum : 0.0f);
#endif
}

// dx = scale * y * (dy - sum(dy * y)) along one row of n.
template <typename A, typename B, typename Y>
void softmax_grad_row_any(const A* y, const B* dy, Y* dx, std::int64_t n, float scale) {
#if defined(SHOAL_VEC_BF16)
  __m512 vdot = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = first(n - j);
    vdot = _mm512_fmadd_ps(load16(y + j, m), load16(dy + j, m), vdot);
  }
  const __m512 dot = _mm512_set1_ps(lanes_sum(vdot)), vs = _mm512_set1_ps(scale);
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = first(n - j);
    const __m512 g = _mm512_sub_ps(load16(dy + j, m), dot);
    store16(dx + j, _mm512_mul_ps(_mm512_mul_ps(vs, load16(y + j, m)), g), m);
  }
#else
  float dot = 0;
  for (std::int64_t j = 0; j < n; ++j) dot += widen(y[j]) * widen(dy[j]);
  for (std::int64_t j = 0; j < n; ++j) put(dx + j, scale * widen(y[j]) * (widen(dy[j]) - dot));
#endif
}
#pragma GCC diagnostic pop

// (outer, len, inner) view of a tensor around `axis`.
struct AxisView {
  std::int64_t outer = 1, len = 1, inner = 1;
};
AxisView axis_view(const Shape& s, std::int64_t axis) {
  AxisView v;
  if (axis < 0) axis += static_cast<std::int64_t>(s.size());
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(s.size()); ++i) {
    if (i < axis)
      v.outer *= s[i];
    else if (i == axis)
      v.len = s[i];
    else
      v.inner *= s[i];
  }
  return v;
}

// Softmax's geometry: rows of `len` along the axis, the scale, and under a
// causal mask the matrix's row count (row r of a matrix sees its first
// r % rows + 1 + len - rows entries).
struct SoftmaxSpec {
  AxisView v;
  double scale = 1;
  std::int64_t causal_rows = 0;  // 0: no mask
  bool log = false;

  static SoftmaxSpec of(const Node& n, const Shape& s, bool log) {
    SoftmaxSpec p;
    p.v = axis_view(s, n.attrs.get_int_or("axis", -1));
    p.scale = n.attrs.get_float_or("scale", 1.0);
    if (n.attrs.get_int_or("causal", 0) != 0) p.causal_rows = s[s.size() - 2];
    p.log = log;
    return p;
  }
  // Entries of row r that are not masked.
  std::int64_t seen(std::int64_t r) const {
    if (causal_rows == 0) return v.len;
    return std::clamp<std::int64_t>(r % causal_rows + 1 + v.len - causal_rows, 0, v.len);
  }
};

// One contiguous row (inner == 1): max, then exp and sum in one pass, then
// 1/sum; masked entries 0. The loops run the whole row with the mask as a
// select, so they stay vector loops without scalar tails (a causal row's
// length differs by one from the next).
template <typename T>
void softmax_row(const T* x, T* y, std::int64_t seen, std::int64_t len, T scale, bool log) {
#if defined(SHOAL_VEC_BF16)
  if constexpr (std::is_same_v<T, float>) {
    if (!log) return softmax_row_any(x, y, y, seen, len, scale);
  }
#endif
  constexpr T kLow = -std::numeric_limits<T>::infinity();
  if (seen == 0 && !log) {  // a row the mask hides whole: no mass anywhere
    std::fill(y, y + len, T(0));
    return;
  }
  T mx = kLow;
#pragma omp simd reduction(max : mx)
  for (std::int64_t j = 0; j < len; ++j) mx = std::max(mx, j < seen ? x[j] : kLow);
  T sum = 0;
  if (log) {
    for (std::int64_t j = 0; j < seen; ++j) sum += std::exp(scale * (x[j] - mx));
    const T lse = scale * mx + std::log(sum);
    for (std::int64_t j = 0; j < len; ++j) y[j] = j < seen ? scale * x[j] - lse : kLow;
    return;
  }
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < len; ++j) {
    const T e = j < seen ? exp_any(scale * (x[j] - mx)) : T(0);
    y[j] = e;
    sum += e;
  }
  const T inv = T(1) / sum;
#pragma omp simd
  for (std::int64_t j = 0; j < len; ++j) y[j] *= inv;
}

template <typename T>
void softmax_strided(const T* x, T* y, const SoftmaxSpec& p, std::int64_t rr) {
  const AxisView& v = p.v;
  const std::int64_t o = rr / v.inner, in = rr % v.inner;
  const T* xr = x + o * v.len * v.inner + in;
  T* yr = y + o * v.len * v.inner + in;
  const T scale = static_cast<T>(p.scale);
  T mx = -std::numeric_limits<T>::infinity();
  for (std::int64_t i = 0; i < v.len; ++i) mx = std::max(mx, xr[i * v.inner]);
  T sum = 0;
  for (std::int64_t i = 0; i < v.len; ++i) sum += std::exp(scale * (xr[i * v.inner] - mx));
  if (p.log) {
    const T lse = scale * mx + std::log(sum);
    for (std::int64_t i = 0; i < v.len; ++i) yr[i * v.inner] = scale * xr[i * v.inner] - lse;
  } else {
    const T inv = T(1) / sum;
    for (std::int64_t i = 0; i < v.len; ++i)
      yr[i * v.inner] = std::exp(scale * (xr[i * v.inner] - mx)) * inv;
  }
}

template <typename T>
void softmax_all(const T* x, T* y, const SoftmaxSpec& p) {
  const AxisView& v = p.v;
  const std::int64_t rows = v.outer * v.inner;
#pragma omp parallel for if (rows * v.len > kParallelGrain) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    if (v.inner == 1)
      softmax_row(x + r * v.len, y + r * v.len, p.seen(r), v.len, static_cast<T>(p.scale), p.log);
    else
      softmax_strided(x, y, p, r);
  }
}

// dx = scale * y * (dy - sum(dy * y)) over n entries `st` apart.
template <typename T>
void softmax_grad_row(const T* y, const T* dy, T* dx, std::int64_t n, std::int64_t st, T scale) {
  T dot = 0;
#pragma omp simd reduction(+ : dot)
  for (std::int64_t j = 0; j < n; ++j) dot += dy[j * st] * y[j * st];
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) dx[j * st] = scale * y[j * st] * (dy[j * st] - dot);
}

template <typename T>
void softmax_grad_all(const T* y, const T* dy, T* dx, const AxisView& v, T scale) {
  const std::int64_t rows = v.outer * v.inner;
#pragma omp parallel for if (rows * v.len > kParallelGrain) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t at = (r / v.inner) * v.len * v.inner + r % v.inner;
    if (v.inner == 1)  // unit stride the compiler can see
      softmax_grad_row(y + at, dy + at, dx + at, v.len, 1, scale);
    else
      softmax_grad_row(y + at, dy + at, dx + at, v.len, v.inner, scale);
  }
}

// Softmax (grad false: x) or its gradient (y, dy) along the last axis,
// rows of len, as the node's operand types say.
Result<std::unique_ptr<Kernel>> softmax_bf16_kernel(const Node& n, const Inputs& in, bool grad) {
  const std::int64_t len = in[0].shape.empty() ? 1 : in[0].shape.back();
  const std::int64_t rows = len == 0 ? 0 : num_elements(in[0].shape) / len;
  const SoftmaxSpec p = SoftmaxSpec::of(n, in[0].shape, false);
  const auto scale = static_cast<float>(p.scale);
  const char* impl = bf16_impl(n);
  return make_fn(
      [=](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> out) {
        auto forward = [&](const auto* a, auto* y) {
#pragma omp parallel if (rows * len > kParallelGrain)
          {
            std::vector<float> e((len + 15) / 16 * 16);
#pragma omp for schedule(static)
            for (std::int64_t r = 0; r < rows; ++r)
              softmax_row_any(a + r * len, y + r * len, e.data(), p.seen(r), len, scale);
          }
        };
        auto backward = [&](const auto* a, const auto* b, auto* y) {
#pragma omp parallel for if (rows * len > kParallelGrain) schedule(static)
          for (std::int64_t r = 0; r < rows; ++r)
            softmax_grad_row_any(a + r * len, b + r * len, y + r * len, len, scale);
        };
        typed_in(x[0], [&](const auto* a) {
          typed_out(out[0], [&](auto* y) {
            if (grad)
              typed_in(x[1], [&](const auto* b) { backward(a, b, y); });
            else
              forward(a, y);
          });
        });
        return ok_status();
      },
      impl);
}

}  // namespace

void register_softmax_bf16(KernelRegistry& r) {
  add_writer(
      r, "softmax",
      [](const Node& n, const Inputs& in) { return softmax_bf16_kernel(n, in, false); }, true);
  add_writer(
      r, "softmax_grad",
      [](const Node& n, const Inputs& in) { return softmax_bf16_kernel(n, in, true); }, true);
}

void register_softmax(KernelRegistry& r) {
  for (std::string op : {"softmax", "log_softmax"}) {
    r.add(op, [op](const Node& n, const Inputs& in) {
      const SoftmaxSpec p = SoftmaxSpec::of(n, in[0].shape, op == "log_softmax");
      return FLOAT_KERNEL(softmax_all(in[0].data<T>(), out[0].data<T>(), p));
    });
  }
  r.add("softmax_grad", [](const Node& n, const Inputs& in) {
    const AxisView v = axis_view(in[0].shape, n.attrs.get_int_or("axis", -1));
    const double scale = n.attrs.get_float_or("scale", 1.0);
    return FLOAT_KERNEL(softmax_grad_all(in[0].data<T>(), in[1].data<T>(), out[0].data<T>(), v,
                                         static_cast<T>(scale)));
  });
}

}  // namespace shoal::runtime::cpu
