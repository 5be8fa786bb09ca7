// GELU, softmax and log-softmax in f32 run on oneDNN's primitives, GELU's
// gradient on gelu.cc's vector kernel (the GPT's MLPs and attention); they
// must agree with the f64 reference kernels (libm's erf and exp) over the
// whole range, on sizes no vector width divides and on every axis, and the
// f32 graph must really use them (a fallback would hide a broken override).
#include <gtest/gtest.h>

#include <cmath>

#include "shoal/graph/builder.h"
#include "shoal/runtime/backend.h"

namespace shoal::runtime {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

struct Out {
  Tensor y, dx;
  std::map<std::string, std::string> impls;
};

Out run(DType dt, std::int64_t n) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", dt, {n});
  Value dy = b.input("dy", dt, {n});
  g.mark_output(b.gelu(x));
  g.mark_output(b.op("gelu_grad", {x, dy}));
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  Tensor xs = Tensor::empty({n}, dt), dys = Tensor::empty({n}, dt);
  for (std::int64_t i = 0; i < n; ++i) {
    xs.set(i, -8.0 + 16.0 * static_cast<double>(i) / static_cast<double>(n - 1));
    dys.set(i, 0.5 + std::sin(static_cast<double>(i)));
  }
  EXPECT_TRUE((*exe)->bind("x", xs).ok());
  EXPECT_TRUE((*exe)->bind("dy", dys).ok());
  EXPECT_TRUE((*exe)->run().ok());
  return {(*exe)->output(0).clone(), (*exe)->output(1).clone(), (*exe)->kernel_impls()};
}

TEST(GeluKernel, F32MatchesTheF64Reference) {
  const std::int64_t n = 1037;
  Out f = run(DType::kF32, n), d = run(DType::kF64, n);
  for (const char* op : {"gelu", "gelu_grad"}) {
    bool found = false;
    for (const auto& [node, impl] : f.impls)
      if (node.find(op) != std::string::npos &&
          (node.find("grad") != std::string::npos) == (std::string(op) == "gelu_grad")) {
        // The gradient is gelu.cc's one pass (faster than oneDNN's).
        EXPECT_EQ(impl, std::string(op) == "gelu" ? "onednn" : "vector") << node;
        found = true;
      }
    EXPECT_TRUE(found) << op;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(f.y.get(i), d.y.get(i), 2e-6 * std::max(1.0, std::abs(d.y.get(i)))) << i;
    EXPECT_NEAR(f.dx.get(i), d.dx.get(i), 2e-6 * std::max(1.0, std::abs(d.dx.get(i)))) << i;
  }
}

// tanh, sigmoid and exp in f32 are oneDNN's eltwise (libm's scalar tanh was
// 43% of a tanh LeNet's step); against the f64 reference over [-12, 12]
// (exp over [-80, 80]) on a size no vector width divides.
TEST(EltwiseKernel, TanhSigmoidAndExpMatchTheF64Reference) {
  const std::int64_t n = 1037;
  for (const std::string op : {"tanh", "sigmoid", "exp"}) {
    SCOPED_TRACE(op);
    const double span = op == "exp" ? 80.0 : 12.0;
    auto eval = [&](DType dt, std::string* impl) {
      Graph g;
      Builder b(g);
      Value x = b.input("x", dt, {n});
      g.mark_output(b.op(op, {x}));
      auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
      EXPECT_TRUE(exe.ok()) << exe.status().to_string();
      Tensor xs = Tensor::empty({n}, dt);
      for (std::int64_t i = 0; i < n; ++i)
        xs.set(i, -span + 2 * span * static_cast<double>(i) / static_cast<double>(n - 1));
      EXPECT_TRUE((*exe)->bind("x", xs).ok());
      EXPECT_TRUE((*exe)->run().ok());
      for (const auto& [node, k] : (*exe)->kernel_impls())
        if (node.find(op) != std::string::npos) *impl = k;
      return (*exe)->output(0).clone();
    };
    std::string impl32, impl64;
    Tensor f = eval(DType::kF32, &impl32), d = eval(DType::kF64, &impl64);
    EXPECT_EQ(impl32, "onednn");
    for (std::int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(f.get(i), d.get(i), 4e-6 * std::max(1.0, std::abs(d.get(i)))) << i;
  }
}

// softmax or log_softmax of x [3, 37, 5] over `axis`: output and impl.
std::pair<Tensor, std::string> softmax(DType dt, const std::string& op, std::int64_t axis) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", dt, {3, 37, 5});
  g.mark_output(b.op(op, {x}, {{"axis", axis}}));
  auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  Tensor xs = Tensor::empty({3, 37, 5}, dt);
  for (std::int64_t i = 0; i < xs.numel(); ++i) xs.set(i, 20 * std::sin(0.37 * i));
  EXPECT_TRUE((*exe)->bind("x", xs).ok());
  EXPECT_TRUE((*exe)->run().ok());
  std::string impl;
  for (const auto& [node, k] : (*exe)->kernel_impls())
    if (node.find(op) != std::string::npos) impl = k;
  return {(*exe)->output(0).clone(), impl};
}

TEST(SoftmaxKernel, OneDnnF32MatchesTheF64ReferenceOnEveryAxis) {
  for (std::string op : {"softmax", "log_softmax"})
    for (std::int64_t axis : {0, 1, 2, -1}) {
      SCOPED_TRACE(op + " axis " + std::to_string(axis));
      auto [f, impl] = softmax(DType::kF32, op, axis);
      auto [d, ref] = softmax(DType::kF64, op, axis);
      // oneDNN serves every axis; on AVX2 the axes other than the last are
      // its reference loop ("onednn:ref"), on AVX-512 machines JIT code.
      EXPECT_TRUE(impl.starts_with("onednn")) << impl;
      // Inputs reach +-20: f32's log-sum-exp carries 20 * 2^-24 ~ 1.2e-6 per rounding.
      for (std::int64_t i = 0; i < f.numel(); ++i)
        ASSERT_NEAR(f.get(i), d.get(i), 1e-5 * std::max(1.0, std::abs(d.get(i)))) << i;
    }
}

}  // namespace
}  // namespace shoal::runtime
