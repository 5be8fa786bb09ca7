// fuse_residual_norms and the add_layer_norm kernel: a pre-norm residual
// net's step (forward and gradients) is the same with the fusion as
// without, on rows and widths that fit no vector width; adds the fusion
// cannot take (a gamma computed from the sum, a broadcast) are left alone;
// the bf16 writer stores what a cast of the f32 result would.
#include <gtest/gtest.h>

#include <cmath>

#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/tensor/philox.h"

namespace shoal::runtime {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

constexpr std::int64_t kRows = 37, kDim = 19;

// Three pre-norm blocks h = h + tanh(linear(layer_norm(h))) over x, a final
// layer norm, loss sum(out * r); outputs: loss, then d/dx and d/dparams.
Graph residual_step(int* params) {
  Graph g;
  Builder b(g);
  PhiloxRng rng(20261207, 3);
  auto rand = [&](Shape s, double sd) {
    Tensor t = Tensor::empty(s, DType::kF32);
    rng.fill_normal(t, 0, sd);
    return t;
  };
  Value x = b.input("x", DType::kF32, {kRows, kDim});
  std::vector<Value> wrt = {x};
  Value h = x;
  for (int l = 0; l <= 3; ++l) {
    Value gamma = b.input("g" + std::to_string(l), DType::kF32, {kDim});
    Value beta = b.input("b" + std::to_string(l), DType::kF32, {kDim});
    wrt.insert(wrt.end(), {gamma, beta});
    Value n = b.layer_norm(h, gamma, beta);
    if (l == 3) {
      h = n;
      break;
    }
    Value w = b.input("w" + std::to_string(l), DType::kF32, {kDim, kDim});
    wrt.push_back(w);
    h = b.add(h, b.tanh(b.linear(n, w)));
  }
  Value loss = b.reduce_sum(b.mul(h, b.constant(rand({kRows, kDim}, 1.0))), {});
  auto grads = graph::autodiff(g, loss, wrt);
  EXPECT_TRUE(grads.ok()) << grads.status().to_string();
  g.mark_output(loss);
  for (Value v : *grads) g.mark_output(v);
  *params = static_cast<int>(wrt.size());
  return g;
}

std::map<std::string, Tensor> feeds(const Graph& g) {
  PhiloxRng rng(20261207, 5);
  std::map<std::string, Tensor> f;
  for (int id : g.input_nodes()) {
    const graph::Node& n = g.node(id);
    Tensor t = Tensor::empty(n.outputs[0].shape, n.outputs[0].dtype);
    rng.fill_normal(t, 0, n.name[0] == 'w' ? 0.3 : 1.0);
    if (n.name[0] == 'g')
      for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, 1.0 + 0.1 * t.get(i));
    f[n.name] = t;
  }
  return f;
}

std::vector<Tensor> run(const Graph& g, bool fuse, std::map<std::string, std::string>* impls) {
  CompileOptions o;
  o.fuse = fuse;
  auto exe = (*make_backend("cpu"))->compile(g, o);
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  if (!exe.ok()) return {};
  *impls = (*exe)->kernel_impls();
  Executor ex(**exe);
  auto out = ex.run(feeds(g));
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : std::vector<Tensor>{};
}

void expect_close(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].shape(), b[k].shape()) << "output " << k;
    double scale = 1e-30;
    for (std::int64_t i = 0; i < b[k].numel(); ++i) scale = std::max(scale, std::abs(b[k].get(i)));
    for (std::int64_t i = 0; i < b[k].numel(); ++i)
      ASSERT_NEAR(a[k].get(i), b[k].get(i), tol * scale) << "output " << k << " element " << i;
  }
}

TEST(ResidualNorm, FusedStepMatchesUnfused) {
  int params = 0;
  Graph g = residual_step(&params);
  // Forward: the layer norms of blocks 1, 2 and the final one read a sum
  // (block 0's reads x). Backward: blocks 0-2's layer norm gradients join
  // the residual stream's (the final one's is the sum's only gradient).
  Graph copy = g;
  EXPECT_EQ(fuse_residual_norms(copy), 6);
  ASSERT_TRUE(graph::verify(copy).ok()) << graph::verify(copy).to_string();
  std::map<std::string, std::string> fused_impls, plain_impls;
  std::vector<Tensor> fused = run(g, true, &fused_impls);
  std::vector<Tensor> plain = run(g, false, &plain_impls);
  EXPECT_EQ(fused_impls.count("add_layer_norm"), 1u);
  EXPECT_EQ(plain_impls.count("add_layer_norm"), 0u);
  ASSERT_EQ(fused.size(), static_cast<std::size_t>(params + 1));
  expect_close(fused, plain, 1e-5);
}

TEST(ResidualNorm, LeavesAddsItCannotFuse) {
  Graph g;
  Builder b(g);
  Value a = b.input("a", DType::kF32, {kRows, kDim});
  Value c = b.input("c", DType::kF32, {kRows, kDim});
  Value row = b.input("row", DType::kF32, {kDim});
  Value beta = b.input("beta", DType::kF32, {kDim});
  Value s = b.add(a, c);
  // gamma computed from the sum: fusing would read it before it exists.
  Value gamma = b.reduce_mean(s, {0});
  g.mark_output(b.layer_norm(s, gamma, beta));
  // A broadcast add: not a residual stream.
  g.mark_output(b.layer_norm(b.add(a, row), beta, beta));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  Graph copy = g;
  EXPECT_EQ(fuse_residual_norms(copy), 0);
  std::map<std::string, std::string> fused_impls, plain_impls;
  std::vector<Tensor> fused = run(g, true, &fused_impls);
  std::vector<Tensor> plain = run(g, false, &plain_impls);
  EXPECT_EQ(fused_impls.count("add_layer_norm"), 0u);
  expect_close(fused, plain, 0);
}

TEST(ResidualNorm, Bf16WriterStoresTheRoundedF32Result) {
  Graph g;
  Builder b(g);
  Value a = b.input("a", DType::kF32, {kRows, kDim});
  Value c = b.input("c", DType::kF32, {kRows, kDim});
  Value gamma = b.input("g", DType::kF32, {kDim});
  Value beta = b.input("beta", DType::kF32, {kDim});
  auto o = b.op_multi("add_layer_norm", {a, c, gamma, beta}, {{"eps", 1e-5}, {"dst", "bf16"}});
  ASSERT_EQ(o.size(), 2u);
  g.mark_output(o[0]);
  g.mark_output(o[1]);
  Value s = b.add(a, c);
  g.mark_output(b.cast(b.layer_norm(s, gamma, beta), DType::kBF16));
  g.mark_output(s);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  std::map<std::string, std::string> impls;
  std::vector<Tensor> out = run(g, false, &impls);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(impls["add_layer_norm"], "bf16-writer");
  ASSERT_EQ(out[0].dtype(), DType::kBF16);
  for (std::int64_t i = 0; i < out[0].numel(); ++i) {
    ASSERT_EQ(out[0].get(i), out[2].get(i)) << "normalized element " << i;
    ASSERT_EQ(out[1].get(i), out[3].get(i)) << "sum element " << i;
  }
}

}  // namespace
}  // namespace shoal::runtime
