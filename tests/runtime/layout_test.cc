// Blocked activation layouts (assign_blocked_layouts): a residual block's
// forward and all gradients must match the same graph compiled with plain
// layouts only, without fusing batch norm and ReLU, and the f64 reference; conversions appear only
// where a blocked value meets an op that reads plain data or leaves the graph.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/tensor/philox.h"

namespace shoal::runtime {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

struct Built {
  Graph g;
  std::vector<std::pair<std::string, Shape>> inputs;
};

// conv(16->32) -> BN -> relu -> depthwise conv -> tanh -> conv(32->32) -> BN, plus a 1x1 stride-1
// shortcut conv, add, relu, a scalar scale, then global average pool and
// a linear head; gradients of every parameter and of x. The block output
// is also a graph output (converted back to plain) and feeds two max pools
// and a global average pool (a plain-only op).
Built residual_block(DType dt, std::int64_t c_in) {
  Built r;
  Builder b(r.g);
  auto in = [&](const std::string& n, Shape s) {
    r.inputs.emplace_back(n, s);
    return b.input(n, dt, s);
  };
  Value x = in("x", {3, c_in, 9, 7});
  Value labels = b.input("labels", DType::kI32, {3});
  Value w1 = in("w1", {32, c_in, 3, 3}), w2 = in("w2", {32, 32, 3, 3}),
        ws = in("ws", {32, c_in, 1, 1});
  Value g1 = in("g1", {32}), b1 = in("b1", {32}), g2 = in("g2", {32}), b2 = in("b2", {32});
  Value wd = in("wd", {32, 1, 3, 3});  // depthwise
  Value fw = in("fw", {5, 32}), fb = in("fb", {5});
  Value rm = b.constant(Tensor::zeros({32}, dt)), rv = b.constant(Tensor::full({32}, dt, 1));
  Value h = b.relu(b.batch_norm(b.conv2d(x, w1, {}, {1, 1}, {1, 1}), g1, b1, rm, rv, true)[0]);
  // A depthwise conv and a tanh between them: grouped convolutions and
  // oneDNN's eltwise run on the blocked layout too.
  h = b.tanh(b.conv2d(h, wd, {}, {1, 1}, {1, 1}, {1, 1}, 32));
  h = b.batch_norm(b.conv2d(h, w2, {}, {1, 1}, {1, 1}), g2, b2, rm, rv, true)[0];
  Value out = b.mul(b.relu(b.add(h, b.conv2d(x, ws))), b.scalar(0.5, dt));
  // Pools in the blocked layout: non-overlapping, and overlapping with
  // padding (gradients of overlapping windows add up).
  Value pooled = b.max_pool2d(out, {2, 2}, {2, 2});
  Value pooled3 = b.max_pool2d(out, {3, 3}, {2, 2}, {1, 1});
  Value loss = b.add(b.cross_entropy(b.linear(b.global_avg_pool(out), fw, fb), labels),
                     b.mul(b.add(b.reduce_mean(pooled, {0, 1, 2, 3}),
                                 b.reduce_mean(b.mul(pooled3, pooled3), {0, 1, 2, 3})),
                           b.scalar(0.1, dt)));
  std::vector<Value> params = {x, w1, wd, w2, ws, g1, b1, g2, b2, fw, fb};
  auto grads = graph::autodiff(r.g, loss, params);
  EXPECT_TRUE(grads.ok()) << grads.status().to_string();
  r.g.mark_output(loss);
  r.g.mark_output(out);
  for (Value v : *grads) r.g.mark_output(v);
  return r;
}

// fused: how many batch norms took the ReLU after them (fuse_activations;
// fuse = false: none).
std::vector<Tensor> run(DType dt, bool blocked, std::int64_t c_in, int* conversions = nullptr,
                        std::map<std::string, std::string>* impls = nullptr, bool fuse = true,
                        int* fused = nullptr) {
  Built r = residual_block(dt, c_in);
  CompileOptions o;
  o.blocked_layouts = blocked;
  o.fuse = fuse;
  auto exe = (*make_backend("cpu"))->compile(r.g, o);
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  if (!exe.ok()) return {};
  if (conversions) {
    *conversions = 0;
    for (const auto& n : (*exe)->graph().nodes()) *conversions += n.alive && n.op == "layout";
  }
  if (fused) {
    *fused = 0;
    for (const auto& n : (*exe)->graph().nodes())
      *fused += n.alive && n.op == "batch_norm" && n.attrs.has("activation");
  }
  if (impls) *impls = (*exe)->kernel_impls();
  PhiloxRng rng(7, 1);
  std::map<std::string, Tensor> feeds;
  for (const auto& [name, s] : r.inputs) {
    Tensor t = Tensor::empty(s, DType::kF64);
    rng.fill_normal(t, 0, 0.5);
    feeds[name] = t.cast(dt);
  }
  Tensor labels = Tensor::empty({3}, DType::kI32);
  for (int i = 0; i < 3; ++i) labels.set(i, (i * 2) % 5);
  feeds["labels"] = labels;
  Executor ex(**exe);
  auto out = ex.run(feeds);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : std::vector<Tensor>{};
}

void expect_close(const std::vector<Tensor>& a, const std::vector<Tensor>& r, double rel,
                  const std::string& what) {
  ASSERT_EQ(a.size(), r.size()) << what;
  for (std::size_t k = 0; k < r.size(); ++k) {
    ASSERT_EQ(a[k].shape(), r[k].shape()) << what << " output " << k;
    double scale = 1e-30;
    for (std::int64_t i = 0; i < r[k].numel(); ++i) scale = std::max(scale, std::abs(r[k].get(i)));
    for (std::int64_t i = 0; i < r[k].numel(); ++i)
      ASSERT_NEAR(a[k].get(i), r[k].get(i), rel * scale + 1e-6)
          << what << " output " << k << " element " << i;
  }
}

TEST(BlockedLayout, ResidualBlockMatchesPlainAndReference) {
  for (std::int64_t c_in : {16, 3}) {  // 3: the first conv reads a plain input
    SCOPED_TRACE("c_in " + std::to_string(c_in));
    int conversions = -1;
    std::map<std::string, std::string> impls;
    auto blocked = run(DType::kF32, true, c_in, &conversions, &impls);
    auto plain = run(DType::kF32, false, c_in);
    auto ref = run(DType::kF64, false, c_in);
    expect_close(blocked, plain, 2e-5, "blocked vs plain f32");
    expect_close(blocked, ref, 1e-4, "blocked f32 vs f64 reference");
    // The first batch norm takes the ReLU after it; compiled without
    // fusion the numbers agree.
    int fused = 0;
    auto plain_fused = run(DType::kF32, false, c_in, nullptr, nullptr, true, &fused);
    EXPECT_EQ(fused, 1);
    for (bool b : {true, false})
      expect_close(b ? blocked : plain_fused, run(DType::kF32, b, c_in, nullptr, nullptr, false),
                   2e-5, b ? "blocked, fused vs unfused" : "plain, fused vs unfused");
    // Conversions only at the edges: the block output (a graph output, max
    // pool, global pool) and the gradients coming back from both pools.
    EXPECT_GT(conversions, 0);
    EXPECT_LE(conversions, 8);
    EXPECT_EQ(impls["layout"], "onednn");
    // Where oneDNN has no JIT pooling for the blocked layout (AVX2) the SIMD
    // kernel of our own runs, never oneDNN's scalar reference loop.
    for (const auto& [op, impl] : impls)
      EXPECT_EQ(impl.find("onednn:ref"), std::string::npos) << op;
  }
}

// Without oneDNN's kernels (SHOAL_ONEDNN=0) the blocked graph still runs:
// the reference convolutions behind conversions, the reference max pool and
// batch norm on the blocked layout.
TEST(BlockedLayout, ReferenceKernelsRunBlockedGraphs) {
  ASSERT_EQ(setenv("SHOAL_ONEDNN", "0", 1), 0);
  std::map<std::string, std::string> impls;
  auto blocked = run(DType::kF32, true, 16, nullptr, &impls);
  unsetenv("SHOAL_ONEDNN");
  EXPECT_EQ(impls["conv2d"], "ref");
  EXPECT_EQ(impls["max_pool2d"], "ref");
  auto ref = run(DType::kF64, false, 16);
  expect_close(blocked, ref, 1e-4, "reference kernels on blocked layouts vs f64");
}

TEST(BlockedLayout, PlainGraphsAreUntouched) {
  // Channel counts that are not a multiple of 16 never block.
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {2, 3, 8, 8});
  Value w = b.input("w", DType::kF32, {12, 3, 3, 3});
  g.mark_output(b.relu(b.conv2d(x, w)));
  int n = 0;
  auto res = assign_blocked_layouts(g);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(*res, 0);
  for (const auto& node : g.nodes()) n += node.attrs.has("_blocked_out");
  EXPECT_EQ(n, 0);
}

}  // namespace
}  // namespace shoal::runtime
