// --precision bf16 on convolutions: the activations' casts shared by their
// passes, batch norm and ReLU writing bf16 for the convolutions beside
// them, and the passes bf16 made slower left in f32 (graph/precision.cc),
// against f64 within bf16's tolerance where they run.
#include <gtest/gtest.h>

#include "runtime/bf16_compare.h"

namespace shoal::runtime {
namespace {

using namespace bf16_testing;

// Convolutions read bf16 activations cast once: the forward and the
// weight gradient share x's cast, both gradients share dy's; the weights
// stay f32. One convolution (its three passes within one product's
// tolerance), then two: the second reads the first's blocked output (16
// channels; the cast keeps the layout) or plain (24), and the gradient of x
// crosses two bf16 products, up to 3x one product's error.
TEST(Bf16, ConvolutionsShareTheirActivationCasts) {
  SKIP_WITHOUT_BF16();
  const auto one = [](Builder& b, auto x) { return b.conv2d(x[0], x[1], {}, {2, 1}, {1, 0}); };
  const auto two = [](Builder& b, auto x) {
    Value h = b.tanh(b.conv2d(x[0], x[1], {}, {1, 1}, {1, 1}));
    return b.conv2d(h, x[2], {}, {2, 2}, {1, 1});
  };
  for (std::int64_t c : {16, 24}) {
    const std::string at = " over " + std::to_string(c) + " channels";
    graph::PrecisionReport rep = compare("conv" + at, {{3, c, 9, 7}, {17, c, 3, 3}}, one, 0);
    EXPECT_EQ(rep.convolutions, 3);
    EXPECT_EQ(rep.casts, 2);  // x, dy
    rep = compare("conv, tanh, strided conv" + at, {{3, c, 9, 7}, {c, c, 3, 3}, {20, c, 3, 3}}, two,
                  0, 6e-2);
    EXPECT_EQ(rep.convolutions, 6);
    EXPECT_EQ(rep.casts, 4);  // x, the tanh's output, both output gradients
  }
}

// Batch norm's input gradient, read only by the convolution before it (its
// cast), is written in bf16 by the batch norm gradient itself (blocked at
// 16 channels, plain at 24): the cast goes. The convolution's result, read
// only by the batch norm and its gradient (as x), is written in bf16 by
// the convolution and read into f32 by both.
TEST(Bf16, BatchNormGradientWritesBf16ForTheConvolutionBeforeIt) {
  SKIP_WITHOUT_BF16();
  const auto net = [](Builder& b, auto x) {
    Value h = b.conv2d(x[0], x[1], {}, {1, 1}, {1, 1});
    return b.batch_norm(h, x[2], x[3], x[4], x[5], true)[0];
  };
  for (std::int64_t c : {16, 24}) {
    const std::vector<Shape> shapes = {{3, c, 9, 7}, {c, c, 3, 3}, {c}, {c}, {c}, {c}};
    graph::PrecisionReport rep =
        compare("conv, batch norm over " + std::to_string(c) + " channels", shapes, net, 0, 6e-2);
    EXPECT_EQ(rep.convolutions, 3);
    EXPECT_EQ(rep.narrowed, 1) << "batch_norm_grad writes dx in bf16";
    EXPECT_EQ(rep.norms_read_bf16, 1) << "the convolution writes the batch norm's x in bf16";
    EXPECT_EQ(rep.casts, 1);  // x; dx needs none
  }
}

// conv -> batch norm -> ReLU -> conv, ResNet's block: the ReLU's result,
// read by the next convolution (its cast) and by ReLU's gradient, is
// written in bf16 by the batch norm the backend fuses the ReLU into (no
// cast), and ReLU's gradient reads its sign from the bf16; blocked at 16
// channels, plain at 24.
TEST(Bf16, ABatchNormsReluWritesBf16ForTheNextConvolution) {
  SKIP_WITHOUT_BF16();
  const auto net = [](Builder& b, auto x) {
    Value h = b.conv2d(x[0], x[1], {}, {1, 1}, {1, 1});
    h = b.relu(b.batch_norm(h, x[2], x[3], x[4], x[5], true)[0]);
    return b.conv2d(h, x[6], {}, {1, 1}, {1, 1});
  };
  for (std::int64_t c : {16, 24}) {
    const std::vector<Shape> shapes = {{3, c, 9, 7}, {c, c, 3, 3}, {c},          {c},
                                       {c},          {c},          {20, c, 3, 3}};
    const std::string at = " over " + std::to_string(c) + " channels";
    graph::PrecisionReport rep = compare("conv, batch norm, relu, conv" + at, shapes, net, 0, 6e-2);
    EXPECT_EQ(rep.convolutions, 6);
    EXPECT_EQ(rep.norms_read_bf16, 1);
    EXPECT_EQ(rep.casts, 2) << "x and the last convolution's dy; the ReLU writes bf16";
    const struct Run r = run(shapes, net, DType::kF32, true);
    EXPECT_EQ(r.impls.count("relu"), 0u) << "the ReLU is fused into the batch norm" << at;
    EXPECT_EQ(r.impls.at("batch_norm"), "bf16") << "reads x and writes y in bf16" << at;
    EXPECT_EQ(r.impls.at("relu_grad"), "bf16-reader") << at;
  }
}

// A ReLU whose result an add reads as well (a residual block's last) keeps
// writing f32.
TEST(Bf16, AReluThatAnAddReadsStaysF32) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {2, 16, 5, 5});
  Value w = b.input("param/w", DType::kF32, {16, 16, 3, 3});
  Value y = b.relu(b.add(x, b.conv2d(x, w, {}, {1, 1}, {1, 1})));
  Value z = b.add(y, b.conv2d(y, w, {}, {1, 1}, {1, 1}));
  Value loss = b.reduce_sum(z, {});
  auto grads = graph::autodiff(g, loss, {w});
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  g.mark_output((*grads)[0]);
  auto rep = graph::autocast_bf16(g);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(g.type(y).dtype, DType::kF32);
  EXPECT_TRUE(graph::verify(g).ok());
}

// Convolution passes bf16 made slower stay f32 beside a regular one the
// pass runs in bf16: depthwise (oneDNN's bf16 depthwise weight gradient on
// small maps was 18x slower than Shoal's f32 loops), fewer than 16 output
// channels (the bf16 kernels pad to 16) and 1x1 maps in and out (f32 runs
// them as a matmul), all three passes; a weight gradient of at most 4x4
// output pixels (oneDNN's bf16 one did not use a second thread), that pass.
TEST(Bf16, ConvolutionsBf16SlowsStayF32) {
  struct Case {
    std::string what;
    Shape x, w;
    std::int64_t groups;
    bool all;  // all three passes stay f32, else only the weight gradient
  };
  const std::vector<Case> cases = {{"depthwise", {2, 16, 5, 5}, {16, 1, 3, 3}, 16, true},
                                   {"8 outputs", {2, 16, 5, 5}, {8, 16, 3, 3}, 1, true},
                                   {"1x1 maps", {2, 16, 1, 1}, {32, 16, 3, 3}, 1, true},
                                   {"4x4 maps", {2, 16, 4, 4}, {32, 16, 3, 3}, 1, false}};
  for (const Case& c : cases) {
    Graph g;
    Builder b(g);
    Value x = b.input("x", DType::kF32, c.x);
    Value w = b.input("param/w", DType::kF32, c.w);
    Value pw = b.input("param/pw", DType::kF32, {16, c.w[0], 1, 1});
    Value h = b.conv2d(x, w, {}, {1, 1}, {1, 1}, {1, 1}, c.groups);
    Value y = b.conv2d(b.relu(h), pw, {}, {1, 1}, {0, 0});
    Value loss = b.reduce_sum(y, {});
    auto grads = graph::autodiff(g, loss, {x, w, pw});
    ASSERT_TRUE(grads.ok()) << grads.status().to_string();
    for (Value v : *grads) g.mark_output(v);
    auto rep = graph::autocast_bf16(g);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    // The 1x1 convolution after it (16 outputs): all three passes on maps
    // over 4x4, its forward and input gradient on 4x4, none on 1x1.
    const int pw_bf16 = c.x[2] > 4 ? 3 : c.x[2] > 1 ? 2 : 0;
    EXPECT_EQ(rep->convolutions, pw_bf16 + (c.all ? 0 : 2)) << c.what;
    int passes = 0;
    for (const auto& n : g.nodes()) {
      if (!n.alive || !n.op.starts_with("conv2d")) continue;
      // The first convolution's passes: they read w, or give its gradient.
      const bool dw = n.op == "conv2d_grad_weight";
      const bool first = dw ? n.attrs.get_ints_or("weight_shape", {}) == c.w : n.inputs[1] == w;
      if (!first) continue;
      ++passes;
      EXPECT_EQ(n.attrs.has("precision"), !c.all && !dw) << c.what << ": " << n.label();
    }
    EXPECT_EQ(passes, 3) << c.what;
    EXPECT_TRUE(graph::verify(g).ok()) << c.what;
  }
}

// A convolution's result that anything but batch norms reads (here also
// the output) stays f32.
TEST(Bf16, AConvolutionReadByMoreThanBatchNormsWritesF32) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {2, 16, 5, 5});
  Value w = b.input("param/w", DType::kF32, {16, 16, 3, 3});
  Value c16 = b.input("param/g", DType::kF32, {16});
  Value h = b.conv2d(x, w, {}, {1, 1}, {1, 1});
  Value y = b.batch_norm(h, c16, c16, c16, c16, true)[0];
  g.mark_output(y);
  g.mark_output(h);
  auto rep = graph::autocast_bf16(g);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->norms_read_bf16, 0);
  EXPECT_EQ(g.type(h).dtype, DType::kF32);
}

}  // namespace
}  // namespace shoal::runtime
