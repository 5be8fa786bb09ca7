// Elementwise kernels: unary maps, broadcasting binary ops, where, cast and
// dropout. Inner loops are written so GCC vectorizes them (omp simd); large
// tensors split across OpenMP threads.
#include <immintrin.h>

#include <cmath>

#include "runtime/cpu/kernels_internal.h"
#include "shoal/tensor/philox.h"

namespace shoal::runtime::cpu {
namespace {

template <typename T, typename F>
void map_unary(const T* x, T* y, std::int64_t n, F f) {
  simd_loop(n, [&](std::int64_t i) { y[i] = f(x[i]); });
}

template <typename F>
void add_unary(KernelRegistry& r, const std::string& op, F f) {
  r.add(op, [f](const Node&, const Inputs&) {
    return make_fn([f](const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) {
      return dispatch_float(in[0].dtype(), [&](auto tag) {
        using T = decltype(tag);
        map_unary(in[0].data<T>(), out[0].data<T>(), in[0].numel(), [&](T v) { return f(v); });
        return ok_status();
      });
    });
  });
}

// out[i] = f(a[ia], b[ib]) over the broadcast output; the innermost
// dimension is a contiguous loop with stride 0 or 1 on each side.
template <typename T, typename F>
void map_binary(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const Shape& os = out.shape();
  std::int64_t n = out.numel();
  if (n == 0) return;
  if (a.shape() == os && b.shape() == os) {
    simd_loop(n, [&](std::int64_t i) { po[i] = f(pa[i], pb[i]); });
    return;
  }
  if (b.numel() == 1 && a.shape() == os) {
    const T s = pb[0];
    simd_loop(n, [&](std::int64_t i) { po[i] = f(pa[i], s); });
    return;
  }
  if (a.numel() == 1 && b.shape() == os) {
    const T s = pa[0];
    simd_loop(n, [&](std::int64_t i) { po[i] = f(s, pb[i]); });
    return;
  }
  Shape sa = broadcast_strides(a.shape(), os), sb = broadcast_strides(b.shape(), os);
  int r = static_cast<int>(os.size());
  std::int64_t inner = os[r - 1], outer = n / inner;
  std::int64_t ia_step = sa[r - 1], ib_step = sb[r - 1];
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t rem = o, oa = 0, ob = 0;
    for (int d = r - 2; d >= 0; --d) {
      std::int64_t idx = rem % os[d];
      rem /= os[d];
      oa += idx * sa[d];
      ob += idx * sb[d];
    }
    T* dst = po + o * inner;
    const T* xa = pa + oa;
    const T* xb = pb + ob;
    if (ia_step == 1 && ib_step == 1) {
#pragma omp simd
      for (std::int64_t i = 0; i < inner; ++i) dst[i] = f(xa[i], xb[i]);
    } else if (ia_step == 1) {
      T s = xb[0];
#pragma omp simd
      for (std::int64_t i = 0; i < inner; ++i) dst[i] = f(xa[i], s);
    } else if (ib_step == 1) {
      T s = xa[0];
#pragma omp simd
      for (std::int64_t i = 0; i < inner; ++i) dst[i] = f(s, xb[i]);
    } else {
      T v = f(xa[0], xb[0]);
      for (std::int64_t i = 0; i < inner; ++i) dst[i] = v;
    }
  }
}

template <typename F>
void add_binary(KernelRegistry& r, const std::string& op, F f) {
  r.add(op, [f](const Node&, const Inputs&) {
    return make_fn([f](const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) {
      return dispatch_float(in[0].dtype(), [&](auto tag) {
        using T = decltype(tag);
        map_binary<T>(in[0], in[1], out[0], [&](T a, T b) { return f(a, b); });
        return ok_status();
      });
    });
  });
}

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

namespace {

// f32 -> bf16, rounding to nearest even. With AVX-512 BF16, 16 at a time
// (VCVTNEPS2BF16, which reads f32 subnormals as zero); else in C++ the
// compiler vectorizes.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512bf16"))) void to_bf16_avx512(const float* x, std::uint16_t* y,
                                                                  std::int64_t n) {
  for (std::int64_t i = 0; i < n / 16; ++i) {
    const __m512 v = _mm512_loadu_ps(x + i * 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * 16),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
  for (std::int64_t i = n / 16 * 16; i < n; ++i) y[i] = float_to_bf16(x[i]).bits;
}
#endif

}  // namespace

void to_bf16_serial(const float* x, std::uint16_t* y, std::int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx512_bf16 = bf16_isas().find("avx512_bf16") != std::string::npos;
  if (avx512_bf16) return to_bf16_avx512(x, y, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]).bits;
}

void to_bf16(const float* x, std::uint16_t* y, std::int64_t n) {
  constexpr std::int64_t kChunk = 1 << 14;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c)
    to_bf16_serial(x + c * kChunk, y + c * kChunk, std::min(kChunk, n - c * kChunk));
}

void register_elementwise(KernelRegistry& r) {
  add_unary(r, "neg", [](auto x) { return -x; });
  add_unary(r, "exp", [](auto x) { return std::exp(x); });
  add_unary(r, "log", [](auto x) { return std::log(x); });
  add_unary(r, "sqrt", [](auto x) { return std::sqrt(x); });
  add_unary(r, "rsqrt", [](auto x) { return decltype(x)(1) / std::sqrt(x); });
  add_unary(r, "abs", [](auto x) { return std::abs(x); });
  add_unary(r, "relu", [](auto x) { return x > 0 ? x : decltype(x)(0); });
  // Branch-free (the ternary compiled to a branch per element: ReLU
  // inputs are positive at random, so ~4.8 ns/element in mispredictions; the
  // compare-and-convert vectorizes). Same values, NaN -> 0 as before.
  add_unary(r, "step", [](auto x) { return static_cast<decltype(x)>(x > decltype(x)(0)); });
  add_unary(r, "sign", [](auto x) {
    using T = decltype(x);
    return x > 0 ? T(1) : (x < 0 ? T(-1) : T(0));
  });
  add_unary(r, "tanh", [](auto x) { return std::tanh(x); });
  add_unary(r, "erf", [](auto x) { return std::erf(x); });
  add_unary(r, "sigmoid", [](auto x) {
    using T = decltype(x);
    return x >= 0 ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x));
  });
  add_unary(r, "gelu", [](auto x) {  // exact: x * Phi(x)
    using T = decltype(x);
    return T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2)));
  });
  add_binary(r, "gelu_grad", [](auto x, auto dy) {
    using T = decltype(x);
    T cdf = T(0.5) * (T(1) + std::erf(x * T(kInvSqrt2)));
    T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
    return dy * (cdf + x * pdf);
  });
  // dy * step(y), as the two ops it replaces computed it (same bits, NaN y -> 0 * dy).
  add_binary(r, "relu_grad",
             [](auto dy, auto y) { return dy * static_cast<decltype(y)>(y > decltype(y)(0)); });
  add_binary(r, "add", [](auto a, auto b) { return a + b; });
  add_binary(r, "sub", [](auto a, auto b) { return a - b; });
  add_binary(r, "mul", [](auto a, auto b) { return a * b; });
  add_binary(r, "div", [](auto a, auto b) { return a / b; });
  add_binary(r, "pow", [](auto a, auto b) { return std::pow(a, b); });
  add_binary(r, "equal", [](auto a, auto b) { return a == b ? decltype(a)(1) : decltype(a)(0); });

  r.add("where", [](const Node& n, const Inputs& in) {
    // Strides fixed at compile time; the condition may be any dtype (nonzero is true).
    const Shape& os = n.outputs[0].shape;
    Shape sc = broadcast_strides(in[0].shape, os), sa = broadcast_strides(in[1].shape, os),
          sb = broadcast_strides(in[2].shape, os);
    return make_fn(
        [os, sc, sa, sb](const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) {
          return dispatch_float(out[0].dtype(), [&](auto tag) {
            using T = decltype(tag);
            dispatch_dtype(in[0].dtype(), [&](auto ctag) {
              using C = decltype(ctag);
              const C* pc = static_cast<const C*>(in[0].raw_data());
              const T* pa = in[1].data<T>();
              const T* pb = in[2].data<T>();
              T* po = out[0].data<T>();
              std::int64_t n = out[0].numel();
              for (std::int64_t i = 0; i < n; ++i) {
                std::int64_t rem = i, oc = 0, oa = 0, ob = 0;
                for (int d = static_cast<int>(os.size()) - 1; d >= 0; --d) {
                  std::int64_t idx = rem % os[d];
                  rem /= os[d];
                  oc += idx * sc[d];
                  oa += idx * sa[d];
                  ob += idx * sb[d];
                }
                po[i] = to_double(pc[oc]) != 0.0 ? pa[oa] : pb[ob];
              }
            });
            return ok_status();
          });
        });
  });

  // f32 <-> bf16 (--precision bf16 casts every product's operands each
  // step) in parallel chunks the compiler vectorizes; other pairs convert
  // element by element.
  r.add("cast", [](const Node&, const Inputs&) {
    return make_fn([](const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) {
      const DType from = in[0].dtype(), to = out[0].dtype();
      const std::int64_t n = in[0].numel();
      if (from == DType::kF32 && to == DType::kBF16 && in[0].is_contiguous()) {
        to_bf16(in[0].data<float>(), static_cast<std::uint16_t*>(out[0].raw_data()), n);
        return ok_status();
      }
      if (from == DType::kBF16 && to == DType::kF32 && in[0].is_contiguous()) {
        const auto* x = static_cast<const std::uint16_t*>(in[0].raw_data());
        float* y = out[0].data<float>();
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
        for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(BF16{x[i]});
        return ok_status();
      }
      return out[0].copy_from(in[0]);
    });
  });

  // Keep element i with probability 1-p and scale by 1/(1-p). The mask bit
  // of element i is word i%4 of Philox block (step * blocks + i/4) in
  // stream (seed, stream): a pure function, so backward recomputes it.
  r.add("dropout", [](const Node& n, const Inputs&) {
    double p = n.attrs.get_float_or("p", 0.5);
    auto seed = static_cast<std::uint64_t>(n.attrs.get_int_or("seed", 0));
    auto stream = static_cast<std::uint64_t>(n.attrs.get_int_or("stream", 0));
    return make_fn([p, seed, stream](const KernelContext& c, std::span<const Tensor> in,
                                     std::span<Tensor> out) {
      return dispatch_float(in[0].dtype(), [&](auto tag) {
        using T = decltype(tag);
        std::int64_t n = in[0].numel();
        const T* x = in[0].data<T>();
        T* y = out[0].data<T>();
        PhiloxRng rng(seed, stream);
        auto blocks = static_cast<std::uint64_t>((n + 3) / 4);
        auto threshold = static_cast<std::uint32_t>(std::min(p * 4294967296.0, 4294967295.0));
        T scale = p > 0 ? T(1.0 / (1.0 - p)) : T(1);
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
        for (std::int64_t b = 0; b < static_cast<std::int64_t>(blocks); ++b) {
          auto w = rng.block(c.step * blocks + static_cast<std::uint64_t>(b));
          for (int j = 0; j < 4; ++j) {
            std::int64_t i = b * 4 + j;
            if (i < n) y[i] = (p > 0 && w[j] < threshold) ? T(0) : x[i] * scale;
          }
        }
        return ok_status();
      });
    });
  });
}

}  // namespace shoal::runtime::cpu
