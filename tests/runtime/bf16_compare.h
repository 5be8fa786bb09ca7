// The bf16 tests' shared step: a graph fn of inputs of `shapes` and its
// gradients, run in f64, f32 and under autocast_bf16, and compared within
// bf16's tolerance (bf16_test.cc, bf16_conv_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"
#include "shoal/tensor/philox.h"

namespace shoal::runtime::bf16_testing {

using graph::Builder;
using graph::Graph;
using graph::Value;
using Fn = std::function<Value(Builder&, const std::vector<Value>&)>;

#define SKIP_WITHOUT_BF16()                                                   \
  do {                                                                        \
    if (Status st = bf16_support(); !st.ok()) GTEST_SKIP() << st.to_string(); \
  } while (0)

// fn's output y, and d(sum(y * r))/d(input) for every input, r fixed noise.
struct Run {
  std::vector<Tensor> out;
  graph::PrecisionReport report;
  std::map<std::string, std::string> impls;
};

inline Run run(const std::vector<Shape>& shapes, const Fn& fn, DType dt, bool bf16) {
  PhiloxRng rng(7, 1);
  Graph g;
  Builder b(g);
  std::vector<Value> xs;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    xs.push_back(b.input("in" + std::to_string(i), dt, shapes[i]));
  Value y = fn(b, xs);
  Tensor r = Tensor::empty(b.shape(y), DType::kF64);
  rng.fill_normal(r, 0, 1);
  Value loss = b.reduce_sum(b.mul(y, b.constant(r.cast(dt))), {});
  auto grads = graph::autodiff(g, loss, xs);
  EXPECT_TRUE(grads.ok()) << grads.status().to_string();
  g.mark_output(y);
  for (Value v : *grads) g.mark_output(v);
  Run out;
  if (bf16) {
    auto rep = graph::autocast_bf16(g);
    EXPECT_TRUE(rep.ok()) << rep.status().to_string();
    out.report = *rep;
  }
  EXPECT_TRUE(graph::verify(g).ok());
  auto exe = (*make_backend("cpu"))->compile(g, {});
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  if (!exe.ok()) return out;
  out.impls = (*exe)->kernel_impls();
  Executor ex(**exe);
  std::map<std::string, Tensor> feeds;
  PhiloxRng data(99, 3);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    Tensor t = Tensor::empty(shapes[i], DType::kF64);
    data.fill_normal(t, 0, 1);
    feeds["in" + std::to_string(i)] = t.cast(dt);
  }
  auto res = ex.run(feeds);
  EXPECT_TRUE(res.ok()) << res.status().to_string();
  if (res.ok()) out.out = *res;
  return out;
}

// bf16 keeps 8 significant bits: each operand is off by up to 2^-9 of
// itself, so a product of K terms of unit noise is off by about
// 2^-8 * sqrt(K) against a result of size sqrt(K). 2% of the largest
// element covers it with margin; an f32 result that never met bf16
// is 1000x closer, which the last check uses to tell them apart.
// A chain of two products (tol) doubles it.
inline graph::PrecisionReport compare(const std::string& what, const std::vector<Shape>& shapes,
                                      const Fn& fn, int products, double tol = 2e-2) {
  SCOPED_TRACE(what);
  const Run ref = run(shapes, fn, DType::kF64, false);
  const Run f32 = run(shapes, fn, DType::kF32, false);
  const Run b16 = run(shapes, fn, DType::kF32, true);
  EXPECT_EQ(b16.report.products, products) << "products the pass turned to bf16";
  EXPECT_EQ(ref.out.size(), b16.out.size());
  if (ref.out.size() != b16.out.size()) return b16.report;
  double worst_bf16 = 0, worst_f32 = 0;
  for (std::size_t k = 0; k < ref.out.size(); ++k) {
    const Tensor& r = ref.out[k];
    double scale = 1e-30;
    for (std::int64_t i = 0; i < r.numel(); ++i) scale = std::max(scale, std::abs(r.get(i)));
    for (std::int64_t i = 0; i < r.numel(); ++i) {
      const double e = std::abs(b16.out[k].get(i) - r.get(i)) / scale;
      EXPECT_LE(e, tol) << what << " output " << k << " element " << i;
      if (e > tol) return b16.report;
      worst_bf16 = std::max(worst_bf16, e);
      worst_f32 = std::max(worst_f32, std::abs(f32.out[k].get(i) - r.get(i)) / scale);
    }
    EXPECT_EQ(b16.out[k].dtype(), DType::kF32) << "output " << k << " leaves as f32";
  }
  // It really ran in bf16 (the pass did not leave the products in f32).
  EXPECT_GT(worst_bf16, 20 * worst_f32) << "bf16 error " << worst_bf16 << ", f32 " << worst_f32;
  return b16.report;
}

}  // namespace shoal::runtime::bf16_testing
