// Reductions, broadcast and losses (the softmax family: softmax.cc).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/vec_math.h"

namespace shoal::runtime::cpu {
namespace {

// An element as the accumulator's type: bf16 sums (a bias gradient under
// --precision bf16) add in f32.
template <typename T>
inline T widen(T v) {
  return v;
}
inline float widen(BF16 h) { return bf16_to_float(h); }

// op over a contiguous row, from acc. Long rows go through kLanes partial
// results (independent chains the compiler keeps in vector registers), so a
// sum is not one chain of dependent adds; they are combined in lane order.
template <typename T, typename In, typename Op>
T reduce_row(const In* src, std::int64_t len, T acc, Op op) {
  constexpr std::int64_t kLanes = 32;
  std::int64_t i = 0;
  if (len >= 2 * kLanes) {
    T lane[kLanes];
    for (std::int64_t l = 0; l < kLanes; ++l) lane[l] = widen(src[l]);
    for (i = kLanes; i + kLanes <= len; i += kLanes) {
#pragma omp simd
      for (std::int64_t l = 0; l < kLanes; ++l) lane[l] = op(lane[l], widen(src[i + l]));
    }
    for (std::int64_t l = 0; l < kLanes; ++l) acc = op(acc, lane[l]);
  }
  for (; i < len; ++i) acc = op(acc, widen(src[i]));
  return acc;
}

// y[map(i)] = op(y[map(i)], x[i]) for every element of contiguous x, where
// ostride[d] is the output stride of input dim d (0 for reduced dims).
template <typename T, typename In, typename Op>
void reduce_into(const In* x, const Shape& xs, const Shape& ostride, T* y, Op op) {
  std::int64_t n = num_elements(xs);
  if (n == 0) return;
  if (xs.empty()) {
    y[0] = op(y[0], widen(x[0]));
    return;
  }
  int r = static_cast<int>(xs.size());
  std::int64_t inner = xs[r - 1], outer = n / inner, ist = ostride[r - 1];
  // Odometer on the stack for common ranks, so a step does not allocate.
  std::array<std::int64_t, 8> small{};
  std::vector<std::int64_t> big;
  std::int64_t* idx = small.data();
  if (r > static_cast<int>(small.size())) {
    big.assign(static_cast<std::size_t>(r), 0);
    idx = big.data();
  }
  std::int64_t off = 0;
  for (std::int64_t o = 0; o < outer; ++o) {
    const In* src = x + o * inner;
    if (ist == 0) {
      y[off] = reduce_row(src, inner, y[off], op);
    } else {
      T* dst = y + off;
#pragma omp simd
      for (std::int64_t i = 0; i < inner; ++i) dst[i] = op(dst[i], widen(src[i]));
    }
    for (int d = r - 2; d >= 0; --d) {
      ++idx[d];
      off += ostride[d];
      if (idx[d] < xs[d]) break;
      off -= ostride[d] * xs[d];
      idx[d] = 0;
    }
  }
}

// Neighbouring dims both reduced or both kept are one dim to the reduction
// (a bias gradient's [N, C, H, W] over N, H, W is [N, C, H x W]), so rows are
// as long as the memory allows.
void merge_dims(Shape& xs, std::vector<bool>& red) {
  Shape ms;
  std::vector<bool> mr;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == 1 && xs.size() > 1) continue;  // a unit dim is either
    if (!ms.empty() && mr.back() == red[i]) {
      ms.back() *= xs[i];
    } else {
      ms.push_back(xs[i]);
      mr.push_back(red[i]);
    }
  }
  if (ms.empty() && !xs.empty()) ms = {1}, mr = {true};
  xs = ms;
  red = mr;
}

// Output strides for reducing xs over `red` dims into a contiguous output of
// the kept dims.
Shape reduce_ostrides(const Shape& xs, const std::vector<bool>& red) {
  Shape st(xs.size(), 0);
  std::int64_t acc = 1;
  for (std::size_t i = xs.size(); i-- > 0;) {
    if (red[i]) continue;
    st[i] = acc;
    acc *= xs[i];
  }
  return st;
}

// The shape a reduction walks (merge_dims) and its output strides.
std::pair<Shape, Shape> reduce_plan(Shape xs, std::vector<bool> red) {
  merge_dims(xs, red);
  Shape ost = reduce_ostrides(xs, red);
  return {std::move(xs), std::move(ost)};
}

std::vector<bool> reduced_dims(const Node& n, std::size_t rank) {
  auto axes = n.attrs.get_ints_or("axes", {});
  std::vector<bool> red(rank, axes.empty());
  for (auto a : axes)
    red[static_cast<std::size_t>(a < 0 ? a + static_cast<std::int64_t>(rank) : a)] = true;
  return red;
}

void add_reduce(KernelRegistry& r, const std::string& op) {
  r.add(op, [op](const Node& n, const Inputs& in) {
    const std::vector<bool> red = reduced_dims(n, in[0].shape.size());
    // The merged dims for the shape compiled; worked out again (allocating)
    // only for an input of another shape.
    auto plan = [red](const Shape& shape) { return reduce_plan(shape, red); };
    return make_fn([op, plan, shape = in[0].shape, built = plan(in[0].shape)](
                       const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      std::pair<Shape, Shape> other;
      const std::pair<Shape, Shape>* use = &built;
      if (x[0].shape() != shape) use = &(other = plan(x[0].shape()));
      const auto& [xs, ost] = *use;
      if (x[0].dtype() == DType::kBF16) {  // reduce_sum with dst f32 (graph/precision.cc)
        if (op != "reduce_sum" || y[0].dtype() != DType::kF32)
          return invalid_argument("{} of bf16 into {}: only reduce_sum into f32", op,
                                  dtype_name(y[0].dtype()));
        float* py = y[0].data<float>();
        std::fill(py, py + y[0].numel(), 0.0f);
        reduce_into(x[0].data<BF16>(), xs, ost, py, [](float a, float b) { return a + b; });
        return ok_status();
      }
      return dispatch_float(x[0].dtype(), [&](auto tag) {
        using T = decltype(tag);
        T* py = y[0].data<T>();
        std::int64_t m = y[0].numel();
        if (op == "reduce_max") {
          std::fill(py, py + m, -std::numeric_limits<T>::infinity());
          reduce_into(x[0].data<T>(), xs, ost, py, [](T a, T b) { return a > b ? a : b; });
        } else {
          std::fill(py, py + m, T(0));
          reduce_into(x[0].data<T>(), xs, ost, py, [](T a, T b) { return a + b; });
          if (op == "reduce_mean" && m > 0) {
            T inv = T(static_cast<double>(m) /
                      static_cast<double>(std::max<std::int64_t>(x[0].numel(), 1)));
            for (std::int64_t i = 0; i < m; ++i) py[i] *= inv;
          }
        }
        return ok_status();
      });
    });
  });
}

template <typename I>
Result<std::int64_t> read_label(const Tensor& t, std::int64_t i, std::int64_t depth,
                                const Node& n) {
  std::int64_t v = static_cast<std::int64_t>(t.data<I>()[i]);
  if (v < 0 || v >= depth)
    return out_of_range("{}: label/index {} at position {} is outside [0, {})", n.label(), v, i,
                        depth);
  return v;
}

Result<std::int64_t> label_at(const Tensor& t, std::int64_t i, std::int64_t depth, const Node& n) {
  if (t.dtype() == DType::kI32) return read_label<std::int32_t>(t, i, depth, n);
  return read_label<std::int64_t>(t, i, depth, n);
}

}  // namespace

void register_reduce(KernelRegistry& r) {
  add_reduce(r, "reduce_sum");
  add_reduce(r, "reduce_mean");
  add_reduce(r, "reduce_max");

  r.add("sum_to", [](const Node& n, const Inputs& in) {
    // The leading dims and the ones y keeps as 1 are reduced; y's other dims
    // are in x's order, so its layout is reduce_ostrides' over merged dims.
    const Shape& ys = n.outputs[0].shape;
    const std::size_t lead = in[0].shape.size() - ys.size();
    std::vector<bool> red(in[0].shape.size(), true);
    for (std::size_t d = lead; d < red.size(); ++d)
      red[d] = ys[d - lead] == 1 && in[0].shape[d] != 1;
    const auto [xs, ost] = reduce_plan(in[0].shape, red);
    return make_fn([xs, ost](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      return dispatch_float(x[0].dtype(), [&](auto tag) {
        using T = decltype(tag);
        std::fill(y[0].data<T>(), y[0].data<T>() + y[0].numel(), T(0));
        reduce_into(x[0].data<T>(), xs, ost, y[0].data<T>(), [](T a, T b) { return a + b; });
        return ok_status();
      });
    });
  });

  r.add("broadcast", [](const Node& n, const Inputs& in) {
    const Shape& os = n.outputs[0].shape;
    StridedCopy c{os,
                  broadcast_strides(in[0].shape, os),
                  contiguous_strides(os),
                  0,
                  0,
                  dtype_size(in[0].dtype),
                  {}};
    c.idx.reserve(os.size());
    return make_fn([c](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      c.run(x[0].raw_data(), y[0].raw_data());
      return ok_status();
    });
  });

  // Mean of log-sum-exp(row) - row[label]. Labels are checked first (an
  // error names the first bad one); then rows in parallel, f32 rows in
  // vector lanes (vec_math.h: libm's scalar exp in f64 was 1.4 ms of the
  // base GPT's 68 ms bf16 step), f64 rows with libm.
  r.add("cross_entropy", [](const Node&, const Inputs&) {
    return make_fn([](const KernelContext& c, std::span<const Tensor> x, std::span<Tensor> y) {
      return dispatch_float(x[0].dtype(), [&](auto tag) -> Status {
        using T = decltype(tag);
        const std::int64_t n = x[0].dim(0), k = x[0].dim(1);
        for (std::int64_t i = 0; i < n; ++i)
          SHOAL_RETURN_IF_ERROR(label_at(x[1], i, k, c.node).status());
        const T* p = x[0].data<T>();
        double total = 0;
#pragma omp parallel for reduction(+ : total) if (n * k > kParallelGrain) schedule(static)
        for (std::int64_t i = 0; i < n; ++i) {
          const T* row = p + i * k;
          const std::int64_t lab = *label_at(x[1], i, k, c.node);
          if (k == 0) continue;
          double lse;
          if constexpr (std::is_same_v<T, float>) {
            lse = vec::logsumexp(row, k);
          } else {
            const T mx = *std::max_element(row, row + k);
            double s = 0;
            for (std::int64_t j = 0; j < k; ++j) s += std::exp(static_cast<double>(row[j] - mx));
            lse = static_cast<double>(mx) + std::log(s);
          }
          total += lse - static_cast<double>(row[lab]);
        }
        y[0].data<T>()[0] = static_cast<T>(n > 0 ? total / static_cast<double>(n) : 0.0);
        return ok_status();
      });
    });
  });

  r.add("mse", [](const Node&, const Inputs&) {
    return make_fn([](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      return dispatch_float(x[0].dtype(), [&](auto tag) {
        using T = decltype(tag);
        std::int64_t n = x[0].numel();
        const T* a = x[0].data<T>();
        const T* b = x[1].data<T>();
        double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > kParallelGrain)
        for (std::int64_t i = 0; i < n; ++i) {
          double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
          s += d * d;
        }
        y[0].data<T>()[0] = static_cast<T>(n > 0 ? s / static_cast<double>(n) : 0.0);
        return ok_status();
      });
    });
  });

  r.add("one_hot", [](const Node& n, const Inputs&) {
    std::int64_t depth = n.attrs.get_int_or("depth", 0);
    return make_fn(
        [depth](const KernelContext& c, std::span<const Tensor> x, std::span<Tensor> y) -> Status {
          std::int64_t m = x[0].numel();
          Tensor& out = y[0];
          std::memset(out.raw_data(), 0, out.nbytes());
          for (std::int64_t i = 0; i < m; ++i) {
            SHOAL_ASSIGN_OR_RETURN(std::int64_t lab, label_at(x[0], i, depth, c.node));
            out.set(i * depth + lab, 1.0);
          }
          return ok_status();
        });
  });
}

}  // namespace shoal::runtime::cpu
