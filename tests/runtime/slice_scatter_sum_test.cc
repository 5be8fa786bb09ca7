// fuse_slice_scatters and the slice_scatter_sum kernel: a step whose
// gradient sums overlapping strided slices (an imported 3-D convolution's
// depth taps) and a forward that places pieces with gaps between them (a
// 3-D transposed convolution) give the same values fused as unfused, on
// sizes no vector width divides; adds the fusion cannot take are left.
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

graph::Attrs scatter(std::int64_t axis, std::int64_t start, std::int64_t end, std::int64_t step,
                     Shape full) {
  return {{"axis", axis}, {"start", start}, {"end", end}, {"step", step}, {"shape", full}};
}

// x [3, 9, 5]: three strided slices along axis 1 that overlap (taps of a
// stride-2 window), each through tanh times its own weights; the loss's
// gradient of x sums the three slices' scatters, and the gradient of
// `gates` four pieces of its last axis. A third output places
// three [3, 2, 5] pieces into [3, 11, 5]: rows 0 and 2, 4 and 5, 7 and 9
// (rows 1, 3, 6, 8 and 10 covered by none).
Graph step(DType dt) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", dt, {3, 9, 5});
  Value loss;
  for (std::int64_t k = 0; k < 3; ++k) {
    Value w = b.input("w" + std::to_string(k), dt, {3, 4, 5});
    Value t = b.mul(b.tanh(b.slice(x, 1, k, k + 7, 2)), w);
    Value s = b.reduce_sum(t, {});
    loss = k == 0 ? s : b.add(loss, s);
  }
  // A GRU's gates: pieces of the last axis (one element a row), contiguous
  // and one strided across them.
  Value gates = b.input("gates", dt, {3, 5, 12});
  const std::int64_t pieces[4][3] = {{0, 4, 1}, {4, 8, 1}, {8, 12, 1}, {1, 12, 3}};
  for (const auto& p : pieces) {
    Value t = b.slice(gates, 2, p[0], p[1], p[2]);
    Value w = b.input("v" + std::to_string(p[0]) + std::to_string(p[2]), dt, b.shape(t));
    loss = b.add(loss, b.reduce_sum(b.mul(b.tanh(t), w), {}));
  }
  auto grads = graph::autodiff(g, loss, {x, gates});
  EXPECT_TRUE(grads.ok()) << grads.status().to_string();
  g.mark_output((*grads)[0]);
  g.mark_output((*grads)[1]);
  Value placed;
  const std::int64_t at[3][3] = {{0, 3, 2}, {4, 6, 1}, {7, 10, 2}};  // start, end, step
  for (std::int64_t k = 0; k < 3; ++k) {
    Value piece = b.input("p" + std::to_string(k), dt, {3, 2, 5});
    Value s = b.op("slice_scatter", {piece}, scatter(1, at[k][0], at[k][1], at[k][2], {3, 11, 5}));
    placed = k == 0 ? s : b.add(placed, s);
  }
  g.mark_output(placed);
  return g;
}

std::vector<Tensor> run(const Graph& g, bool fuse, std::map<std::string, std::string>* impls) {
  return testing::compiled_step(g, fuse, 11, [&](Executable& exe) { *impls = exe.kernel_impls(); });
}

TEST(SliceScatterSum, FusedStepMatchesUnfused) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    const Graph g = step(dt);
    std::map<std::string, std::string> fused_impls, plain_impls;
    const auto fused = run(g, true, &fused_impls);
    const auto plain = run(g, false, &plain_impls);
    ASSERT_EQ(fused.size(), 3u);
    ASSERT_EQ(plain.size(), 3u);
    EXPECT_TRUE(fused_impls.count("slice_scatter_sum")) << dtype_name(dt);
    EXPECT_FALSE(fused_impls.count("slice_scatter")) << "every scatter joined a sum";
    EXPECT_TRUE(plain_impls.count("slice_scatter"));
    for (std::size_t o = 0; o < 3; ++o) {
      ASSERT_EQ(fused[o].shape(), plain[o].shape());
      // The same adds in the same order: equal, not merely close.
      for (std::int64_t i = 0; i < plain[o].numel(); ++i)
        ASSERT_EQ(fused[o].get(i), plain[o].get(i))
            << dtype_name(dt) << " output " << o << " element " << i;
    }
    // Rows no piece covers are zeros.
    for (std::int64_t row : {1, 3, 6, 8, 10})
      for (std::int64_t n = 0; n < 3; ++n)
        for (std::int64_t c = 0; c < 5; ++c)
          EXPECT_EQ(fused[2].get((n * 11 + row) * 5 + c), 0.0) << row;
  }
}

// A scatter something else reads too, scatters along different axes, and
// a bf16 sum stay as they were.
TEST(SliceScatterSum, LeavesAddsItCannotFuse) {
  Graph g;
  Builder b(g);
  Value p = b.input("p", DType::kF32, {2, 3, 4});
  Value a = b.op("slice_scatter", {p}, scatter(0, 0, 2, 1, {4, 3, 4}));
  Value c = b.op("slice_scatter", {p}, scatter(0, 2, 4, 1, {4, 3, 4}));
  g.mark_output(b.add(a, c));
  g.mark_output(b.tanh(a));  // a has a second reader
  Value q = b.input("q", DType::kF32, {4, 3, 2});
  Value d = b.op("slice_scatter", {q}, scatter(2, 0, 2, 1, {4, 3, 4}));
  g.mark_output(b.add(c, d));  // c: a second reader; d: another axis
  Graph h = g;
  EXPECT_EQ(fuse_slice_scatters(h), 0);
  EXPECT_EQ(h.num_nodes(), g.num_nodes());
  for (int id = 0; id < g.num_nodes(); ++id) EXPECT_EQ(h.node(id).op, g.node(id).op);
}

TEST(SliceScatterSum, PiecesOfTheWrongShapeAreRefusedByName) {
  Graph g;
  Builder b(g);
  Value p = b.input("p", DType::kF32, {2, 3});
  Value q = b.input("q", DType::kF32, {1, 3});
  auto r = g.add("slice_scatter_sum", {p, q},
                 {{"axis", std::int64_t{0}},
                  {"shape", Shape{5, 3}},
                  {"starts", std::vector<std::int64_t>{0, 1}},
                  {"ends", std::vector<std::int64_t>{2, 5}},
                  {"steps", std::vector<std::int64_t>{1, 2}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("input 1 must be f32[2, 3], not f32[1, 3]"),
            std::string::npos)
      << r.status().message();
  r = g.add("slice_scatter_sum", {p},
            {{"axis", std::int64_t{0}},
             {"shape", Shape{5, 3}},
             {"starts", std::vector<std::int64_t>{0, 1}},
             {"ends", std::vector<std::int64_t>{2}},
             {"steps", std::vector<std::int64_t>{1}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("one entry per input (1), not 2, 1, 1"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace shoal::runtime
