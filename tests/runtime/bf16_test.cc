// --precision bf16 (graph::autocast_bf16 and oneDNN's bf16 matmuls): per
// product, the forward and the gradients of its operands in bf16 against
// the same graph in f64, within bf16's tolerance, on odd sizes; where the
// pass puts its casts; that f32 stays untouched where the pass does not
// reach; and the refusal on a CPU without bf16 products.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "runtime/bf16_compare.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"
#include "shoal/tensor/philox.h"

namespace shoal::runtime {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;
using namespace bf16_testing;

TEST(Bf16, MatmulForwardAndGradients) {
  SKIP_WITHOUT_BF16();
  // Each matmul's forward and its two gradient matmuls read bf16: 3 products.
  compare(
      "2d", {{33, 17}, {17, 9}}, [](Builder& b, auto x) { return b.matmul(x[0], x[1]); }, 3);
  compare(
      "transposed a", {{17, 33}, {17, 9}},
      [](Builder& b, auto x) { return b.matmul(x[0], x[1], true, false); }, 3);
  compare(
      "transposed b", {{33, 17}, {9, 17}},
      [](Builder& b, auto x) { return b.matmul(x[0], x[1], false, true); }, 3);
  compare(
      "both transposed", {{17, 33}, {9, 17}},
      [](Builder& b, auto x) { return b.matmul(x[0], x[1], true, true); }, 3);
  compare(
      "batched (attention's scores)", {{3, 5, 7, 11}, {3, 5, 13, 11}},
      [](Builder& b, auto x) { return b.matmul(x[0], x[1], false, true); }, 3);
  // On two threads: the forward's shared dimension cut in two, the batched
  // products cut over their 3 batches (onednn_matmul.cc).
  const int before = omp_get_max_threads();
  omp_set_num_threads(2);
  compare(
      "A^T B cut across threads", {{1031, 7}, {1031, 5}},
      [](Builder& b, auto x) { return b.matmul(x[0], x[1], true, false); }, 3);
  compare(
      "batched, cut across threads", {{3, 5, 7, 11}, {3, 5, 13, 11}},
      [](Builder& b, auto x) { return b.matmul(x[0], x[1], false, true); }, 3);
  omp_set_num_threads(before);
}

TEST(Bf16, AProductWritingBf16ThroughShapeOps) {
  SKIP_WITHOUT_BF16();
  // Attention's heads: linear (with bias) -> reshape -> transpose -> matmul.
  // The linear writes bf16 itself; forward and gradients as before.
  const graph::PrecisionReport r = compare(
      "heads", {{12, 8}, {8, 8}, {8}, {3, 2, 4, 5}},
      [](Builder& b, auto x) {
        Value h = b.transpose(b.reshape(b.linear(x[0], x[1], x[2]), {3, 4, 2, 4}), {0, 2, 1, 3});
        return b.matmul(h, x[3]);
      },
      6);
  EXPECT_GE(r.narrowed, 1) << "the linear still writes f32";
}

TEST(Bf16, AProductWritesBf16ForItsCastAndTheBiasGradientsSum) {
  // The heads' gradient: matmul -> transpose -> reshape, read by the
  // linear's products (through their cast) and by its bias gradient's sum.
  // The matmul writes bf16, the sum reads it into f32 (dst f32), as
  // autocast's bias gradient sums the bf16 gradient; no cast is left.
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {12, 8});
  Value w = b.input("param/w", DType::kF32, {8, 8});
  Value bias = b.input("param/b", DType::kF32, {8});
  Value k = b.input("k", DType::kF32, {3, 2, 4, 5});
  Value h = b.transpose(b.reshape(b.linear(x, w, bias), {3, 4, 2, 4}), {0, 2, 1, 3});
  Value loss = b.reduce_sum(b.matmul(h, k), {});
  auto grads = graph::autodiff(g, loss, {x, w, bias});
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  for (Value v : *grads) g.mark_output(v);
  auto rep = graph::autocast_bf16(g);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  int bf16_sums = 0;
  for (const auto& n : g.nodes()) {
    if (!n.alive) continue;
    if (n.op == "reduce_sum" && g.type(n.inputs[0]).dtype == DType::kBF16) {
      EXPECT_EQ(n.outputs[0].dtype, DType::kF32) << n.label();
      const graph::Node& p = g.node(n.inputs[0].node);
      EXPECT_TRUE(p.op == "reshape" || p.op == "transpose") << p.label();
      ++bf16_sums;
    }
    if (n.op == "cast") {
      const graph::Node& p = g.node(n.inputs[0].node);
      EXPECT_FALSE(p.op == "reshape" || p.op == "transpose") << n.label() << " casts " << p.label();
    }
  }
  EXPECT_EQ(bf16_sums, 1) << "the bias gradient's sum reads the bf16 the product wrote";
  EXPECT_TRUE(graph::verify(g).ok());
}

TEST(Bf16, AGeluReadOnlyByItsCastWritesBf16) {
  SKIP_WITHOUT_BF16();
  // The MLP: linear -> GELU -> linear. The GELU's output is read only by
  // the second linear's cast (its gradient reads the GELU's input), so the
  // GELU writes bf16 itself; so does the GELU's gradient, read by the
  // first linear's products (through their cast) and by its bias
  // gradient's sum, which adds the bf16 in f32. The first linear and the
  // product that takes the gradient back to the GELU write bf16 too: only
  // the GELU and its gradient read them, and those read bf16 (as
  // autocast's do). Forward and gradients as before.
  const Fn mlp = [](Builder& b, auto x) {
    return b.linear(b.gelu(b.linear(x[0], x[1], x[2])), x[3], Value{});
  };
  const std::vector<Shape> shapes = {{37, 8}, {24, 8}, {24}, {5, 24}};
  const graph::PrecisionReport r = compare("mlp", shapes, mlp, 6);
  EXPECT_EQ(r.narrowed, 2) << "the GELU or its gradient still writes f32";
  EXPECT_EQ(r.read_bf16, 2) << "a product the GELU reads still writes f32";
  const auto b16 = run(shapes, mlp, DType::kF32, true);
  EXPECT_EQ(b16.impls.at("gelu"), "bf16-writer");
  EXPECT_EQ(b16.impls.at("gelu_grad"), "bf16-writer");
}

// Where anything but a sum reads the GELU's gradient besides the cast, it
// stays f32: here the first layer's pre-activation gradient is also an
// output of the graph.
TEST(Bf16, AGeluGradientReadByMoreThanSumsStaysF32) {
  SKIP_WITHOUT_BF16();
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {6, 4});
  Value w = b.input("param/w", DType::kF32, {5, 4});
  Value dy = b.input("dy", DType::kF32, {6, 5});
  Value h = b.linear(x, w);
  Value dh = b.op("gelu_grad", {h, dy});
  g.mark_output(b.matmul(dh, w));        // read through a cast
  g.mark_output(b.reduce_sum(dh, {0}));  // a sum
  g.mark_output(dh);                     // and the graph's output
  auto rep = graph::autocast_bf16(g);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(g.type(dh).dtype, DType::kF32);
  for (const auto& n : g.nodes()) {
    if (n.alive && n.op == "reduce_sum") {
      EXPECT_FALSE(n.attrs.has("dst")) << n.label();
    }
  }
}

TEST(Bf16, ALayerNormReadOnlyByItsCastWritesBf16) {
  SKIP_WITHOUT_BF16();
  // A block's input: layer norm -> linear. The norm's output is read only
  // by the linear's cast (its gradient reads x), so it writes bf16 itself;
  // rows of 37 (no vector width divides) and of 600 (past one chunk).
  for (std::int64_t d : {37, 600}) {
    const Fn block = [](Builder& b, auto x) {
      return b.linear(b.layer_norm(x[0], x[1], x[2]), x[3], Value{});
    };
    const std::vector<Shape> shapes = {{13, d}, {d}, {d}, {5, d}};
    const graph::PrecisionReport r = compare(fmt::format("norm of {}", d), shapes, block, 3);
    EXPECT_EQ(r.narrowed, 1) << "the layer norm still writes f32";
    EXPECT_EQ(run(shapes, block, DType::kF32, true).impls.at("layer_norm"), "bf16-writer");
  }
}

TEST(Bf16, AttentionScoresGradientWritesBf16) {
  SKIP_WITHOUT_BF16();
  // softmax(q k^T * scale, causal) v: the scores' gradient is read only by
  // the casts of the two products that take it back to q and k, so the
  // softmax gradient writes bf16 itself; the probabilities, read by the
  // product's cast and by the gradient (which reads bf16), are stored bf16
  // too. The scores' product and the one that makes the probabilities'
  // gradient are read only by the softmax and its gradient: they write
  // bf16 (as autocast's do).
  const Fn attention = [](Builder& b, auto x) {
    Value s = b.attention_softmax(b.matmul(x[0], x[1], false, true), 0.3, true);
    return b.matmul(s, x[2]);
  };
  const std::vector<Shape> shapes = {{2, 3, 11, 5}, {2, 3, 11, 5}, {2, 3, 11, 7}};
  const graph::PrecisionReport r = compare("attention", shapes, attention, 6);
  EXPECT_EQ(r.narrowed, 2) << "the probabilities or the scores' gradient still write f32";
  EXPECT_EQ(r.read_bf16, 2) << "a product the softmax reads still writes f32";
  const auto b16 = run(shapes, attention, DType::kF32, true);
  EXPECT_EQ(b16.impls.at("softmax"), "bf16-writer");
  EXPECT_EQ(b16.impls.at("softmax_grad"), "bf16-writer");
}

// The bf16 GELU kernel itself, over the whole range (the negative tail
// computed without cancellation) on a size no block divides: within
// bf16's rounding of the f64 GELU.
TEST(Bf16, GeluKernelIsWithinBf16RoundingOfF64) {
  SKIP_WITHOUT_BF16();
  const std::int64_t n = 3 * 1024 + 37;
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {n});
  g.mark_output(b.op("gelu", {x}, {{"dst", std::string("bf16")}}));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  EXPECT_EQ((*exe)->kernel_impls().at("gelu"), "bf16-writer");
  Tensor xs = Tensor::empty({n}, DType::kF32);
  for (std::int64_t i = 0; i < n; ++i) xs.set(i, -12.0 + 20.0 * static_cast<double>(i) / (n - 1));
  ASSERT_TRUE((*exe)->bind("x", xs).ok());
  ASSERT_TRUE((*exe)->run().ok());
  const Tensor& y = (*exe)->output(0);
  ASSERT_EQ(y.dtype(), DType::kBF16);
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = xs.get(i), want = 0.5 * v * std::erfc(-v / std::sqrt(2.0));
    // bf16 rounds to 8 significant bits (half an ulp: 2^-9 of the value);
    // the erfc approximation is within 1.5e-7 absolute (x/2 times that).
    ASSERT_NEAR(y.get(i), want, std::abs(want) / 256 + 0.75e-7 * std::abs(v)) << "x = " << v;
    if (v < -3) {
      ASSERT_LT(y.get(i), 0.0) << "the negative tail keeps its sign: x = " << v;
    }
  }
}

// One op of `attrs` on `feeds` (their dtypes as given), its f32 output.
Tensor run_one(const std::string& op, const graph::Attrs& attrs, const std::vector<Tensor>& feeds) {
  Graph g;
  Builder b(g);
  std::vector<Value> xs;
  for (std::size_t i = 0; i < feeds.size(); ++i)
    xs.push_back(b.input("in" + std::to_string(i), feeds[i].dtype(), feeds[i].shape()));
  g.mark_output(b.op(op, xs, attrs));
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  if (!exe.ok()) return Tensor{};
  for (std::size_t i = 0; i < feeds.size(); ++i)
    EXPECT_TRUE((*exe)->bind("in" + std::to_string(i), feeds[i]).ok());
  EXPECT_TRUE((*exe)->run().ok());
  if (feeds[0].dtype() == DType::kBF16) {
    EXPECT_EQ((*exe)->kernel_impls().at(op), "bf16-reader");
  }
  return (*exe)->output(0);
}

// The bf16 readers (GELU, the scaled causal softmax and their gradients)
// given bf16 operands, alone or beside f32 ones, compute in f32 what the
// f32 kernels compute from the same (bf16-valued) inputs, on rows of 13
// (no vector width divides them). A softmax reading bf16 off the last axis
// is refused by name.
TEST(Bf16, ReadersWidenBf16IntoF32) {
  SKIP_WITHOUT_BF16();
  struct Case {
    std::string op;
    graph::Attrs attrs;
    int inputs;
  };
  const std::vector<Case> cases = {{"gelu", {}, 1},
                                   {"gelu_grad", {}, 2},
                                   {"softmax", {{"scale", 0.3}, {"causal", std::int64_t{1}}}, 1},
                                   {"softmax_grad", {{"scale", 0.3}}, 2}};
  PhiloxRng rng(5, 2);
  for (const Case& c : cases) {
    std::vector<Tensor> narrow, mixed, wide;
    for (int i = 0; i < c.inputs; ++i) {
      Tensor t = Tensor::empty({3, 2, 13, 13}, DType::kF64);
      rng.fill_normal(t, 0, 2);
      narrow.push_back(t.cast(DType::kBF16));
      wide.push_back(narrow.back().cast(DType::kF32));
      mixed.push_back(i == 0 ? narrow.back() : wide.back());
    }
    const Tensor want = run_one(c.op, c.attrs, wide);
    for (const auto* feeds : {&narrow, &mixed}) {
      if (feeds == &mixed && c.inputs == 1) continue;
      const Tensor got = run_one(c.op, c.attrs, *feeds);
      ASSERT_EQ(got.dtype(), DType::kF32) << c.op;
      ASSERT_EQ(got.numel(), want.numel()) << c.op;
      for (std::int64_t i = 0; i < want.numel(); ++i)
        ASSERT_NEAR(got.get(i), want.get(i), 1e-6 * (1 + std::abs(want.get(i))))
            << c.op << " element " << i;
    }
  }
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kBF16, {4, 6});
  auto r = g.add("softmax", {x}, {{"axis", std::int64_t{0}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("runs along the last axis, not axis 0"), std::string::npos)
      << r.status().message();
}

TEST(Bf16, LinearWithBiasAndRelu) {
  SKIP_WITHOUT_BF16();
  // The forward linear and two gradient matmuls; the bias gradient is a
  // reduction and stays f32.
  compare(
      "linear + bias", {{31, 19}, {7, 19}, {7}},
      [](Builder& b, auto x) { return b.linear(x[0], x[1], x[2]); }, 3);
  compare(
      "linear + bias + relu", {{31, 19}, {7, 19}, {7}},
      [](Builder& b, auto x) { return b.relu(b.linear(x[0], x[1], x[2])); }, 3);
}

TEST(Bf16, CastsAreSharedAndVisibleInTheGraph) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {5, 3});
  Value w = b.input("param/w", DType::kF32, {4, 3});
  Value y = b.linear(x, w);
  Value z = b.matmul(b.transpose(y, {1, 0}), w, true, false);  // w again: one cast serves both
  g.mark_output(z);
  auto rep = graph::autocast_bf16(g);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->products, 2);
  // x and w (shared); y is read only by the matmul, through a transpose:
  // the linear writes it in bf16 itself instead of a cast.
  EXPECT_EQ(rep->casts, 2);
  EXPECT_EQ(rep->narrowed, 1);
  int casts = 0;
  for (const auto& n : g.nodes()) {
    if (!n.alive) continue;
    if (n.op == "cast") {
      ++casts;
      EXPECT_EQ(n.outputs[0].dtype, DType::kBF16);
    }
    if (n.op == "linear" || n.op == "matmul") {
      EXPECT_EQ(g.type(n.inputs[0]).dtype, DType::kBF16) << n.label();
      EXPECT_EQ(n.outputs[0].dtype, n.op == "linear" ? DType::kBF16 : DType::kF32) << n.label();
    }
    if (n.op == "transpose") {
      EXPECT_EQ(n.outputs[0].dtype, DType::kBF16);
    }
  }
  EXPECT_EQ(casts, 2);
  EXPECT_NE(graph::to_json(g).find("\"dst\""), std::string::npos);
  EXPECT_TRUE(graph::verify(g).ok());
  // Run twice it finds nothing more to do.
  auto again = graph::autocast_bf16(g);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->products, 0);
}

TEST(Bf16, BroadcastBatchesStayF32) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {2, 1, 5, 7});
  Value w = b.input("w", DType::kF32, {3, 7, 2});
  g.mark_output(b.matmul(x, w));
  auto rep = graph::autocast_bf16(g);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->products, 0);
  EXPECT_EQ(rep->kept, 1);
}

TEST(Bf16, MixedOperandsAreRefusedByName) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kBF16, {5, 3});
  Value w = b.input("w", DType::kF32, {3, 4});
  auto r = g.add("matmul", {x, w});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dtype mismatch"), std::string::npos) << r.status().message();
}

TEST(Bf16, ARefusalNamesTheInstructionSets) {
  ASSERT_EQ(::setenv("SHOAL_CPU_BF16", "0", 1), 0);
  Status st = bf16_support();
  ::unsetenv("SHOAL_CPU_BF16");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("avx512_bf16"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("amx_bf16"), std::string::npos) << st.message();
}

TEST(Bf16, FlopsCountProductsOnly) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {5, 3});
  Value w = b.input("w", DType::kF32, {4, 3});
  Value y = b.relu(b.linear(x, w));
  g.mark_output(y);
  EXPECT_DOUBLE_EQ(graph::graph_flops(g), 2.0 * 5 * 4 * 3);
}

// Each convolution pass counts 2 x its y-shaped operand's elements x the
// weights one output reads (Cin/groups x kH x kW): forward, input and weight
// gradient alike, grouped or not.
TEST(Bf16, FlopsCountConvolutionPasses) {
  for (std::int64_t groups : {1, 2}) {
    Graph g;
    Builder b(g);
    Value x = b.input("x", DType::kF32, {2, 4, 7, 7});
    Value w = b.input("w", DType::kF32, {6, 4 / groups, 3, 3});
    Value y = b.conv2d(x, w, {}, {1, 1}, {1, 1}, {1, 1}, groups);  // [2, 6, 7, 7]
    graph::Attrs a{{"stride", std::vector<std::int64_t>{1, 1}},
                   {"padding", std::vector<std::int64_t>{1, 1}},
                   {"dilation", std::vector<std::int64_t>{1, 1}},
                   {"groups", groups}};
    graph::Attrs ai = a, aw = a;
    ai.set("input_shape", Shape{2, 4, 7, 7});
    aw.set("weight_shape", Shape{6, 4 / groups, 3, 3});
    g.mark_output(b.op("conv2d_grad_input", {y, w}, ai));
    g.mark_output(b.op("conv2d_grad_weight", {x, y}, aw));
    const double pass = 2.0 * (2 * 6 * 7 * 7) * (4 / groups * 3 * 3);
    EXPECT_DOUBLE_EQ(graph::graph_flops(g), 3 * pass) << groups << " groups";
  }
}

}  // namespace
}  // namespace shoal::runtime
