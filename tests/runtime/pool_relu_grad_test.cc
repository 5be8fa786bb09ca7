// fuse_pool_relu_grads and max_pool2d_grad's relu attr: a CNN's conv,
// ReLU, max pool step gives the same values with the ReLU's gradient folded
// into the pool's as without, in the blocked layout (16 channels) and the
// plain one (5), over disjoint 2x2/2 windows, 3x3/3 ones and overlapping
// padded 3x3/2 ones, on maps no window divides, in f32 and f64.
#include <gtest/gtest.h>

#include "compiled_step.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"

namespace shoal::runtime {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

struct Pool {
  std::int64_t k, st, pd;
};

// loss = sum(max_pool(relu(conv(x, w))) * r); outputs d/dx and d/dw.
Graph step(DType dt, std::int64_t channels, Pool p) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", dt, {3, 4, 11, 9});
  Value w = b.input("w", dt, {channels, 4, 3, 3});
  Value y = b.relu(b.conv2d(x, w, {}, {1, 1}, {1, 1}));
  Value pooled = b.max_pool2d(y, {p.k, p.k}, {p.st, p.st}, {p.pd, p.pd});
  Value r = b.input("r", dt, b.shape(pooled));
  Value loss = b.reduce_sum(b.mul(pooled, r), {});
  auto grads = graph::autodiff(g, loss, {x, w});
  EXPECT_TRUE(grads.ok()) << grads.status().to_string();
  for (Value v : *grads) g.mark_output(v);
  return g;
}

std::vector<Tensor> run(const Graph& g, bool fuse, int* relu_grads) {
  return testing::compiled_step(g, fuse, 17, [&](Executable& exe) {
    *relu_grads = 0;
    for (const auto& n : exe.graph().nodes()) *relu_grads += n.alive && n.op == "relu_grad";
  });
}

TEST(PoolReluGrad, FusedStepMatchesUnfused) {
  for (DType dt : {DType::kF32, DType::kF64})
    for (std::int64_t channels : {16, 5})
      for (Pool p : {Pool{2, 2, 0}, Pool{3, 3, 0}, Pool{3, 2, 1}}) {
        const std::string at = std::string(dtype_name(dt)) + ", " + std::to_string(channels) +
                               " channels, " + std::to_string(p.k) + "x" + std::to_string(p.k) +
                               "/" + std::to_string(p.st) + " pad " + std::to_string(p.pd);
        const Graph g = step(dt, channels, p);
        int fused_left = -1, plain_left = -1;
        const auto fused = run(g, true, &fused_left);
        const auto plain = run(g, false, &plain_left);
        EXPECT_EQ(fused_left, 0) << at << ": the ReLU's gradient joined the pool's";
        EXPECT_EQ(plain_left, 1) << at;
        ASSERT_EQ(fused.size(), 2u) << at;
        ASSERT_EQ(plain.size(), 2u) << at;
        for (std::size_t o = 0; o < 2; ++o) {
          const double tol = dt == DType::kF32 ? 1e-5 : 1e-12;
          for (std::int64_t i = 0; i < plain[o].numel(); ++i)
            ASSERT_NEAR(fused[o].get(i), plain[o].get(i), tol * (1 + std::abs(plain[o].get(i))))
                << at << " output " << o << " element " << i;
        }
      }
}

// A pool gradient something else reads too, or one over another tensor
// than the ReLU's output, keeps its relu_grad.
TEST(PoolReluGrad, LeavesWhatItCannotFuse) {
  Graph g;
  Builder b(g);
  Value y = b.input("y", DType::kF32, {2, 3, 4, 4});
  Value z = b.input("z", DType::kF32, {2, 3, 4, 4});
  Value dy = b.input("dy", DType::kF32, {2, 3, 2, 2});
  const graph::Attrs pool{{"kernel", std::vector<std::int64_t>{2, 2}},
                          {"stride", std::vector<std::int64_t>{2, 2}}};
  Value shared = b.op("max_pool2d_grad", {y, dy}, pool);
  g.mark_output(b.op("relu_grad", {shared, y}));
  g.mark_output(shared);  // a second reader
  Value other = b.op("max_pool2d_grad", {z, dy}, pool);
  g.mark_output(b.op("relu_grad", {other, y}));  // pooled z, ReLU of y
  EXPECT_EQ(fuse_pool_relu_grads(g), 0);
  for (const auto& n : g.nodes()) EXPECT_FALSE(n.attrs.has("relu")) << n.label();
}

}  // namespace
}  // namespace shoal::runtime
