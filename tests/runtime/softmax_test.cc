// Attention's softmax as one op (scale and causal mask inside, the
// gradient one fused pass): it must give what the graph of separate ops
// gives (scores * scale + a -1e9 mask constant, softmax, autodiff's
// mul/reduce/sub chain), in f32 (the vectorized exp) and f64, on rows no
// vector width divides, square and wide matrices; and bad attributes are
// refused by name.
#include <gtest/gtest.h>

#include <cmath>

#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"

namespace shoal::runtime {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

struct Result2 {
  Tensor y, dx;
};

// y = attention softmax of x, dx = gradient of sum(y * w); fused or composed.
Result2 run(DType dt, const Shape& s, double scale, bool causal, bool fused) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", dt, s);
  Value w = b.input("w", dt, s);
  Value y;
  if (fused) {
    y = b.attention_softmax(x, scale, causal);
  } else {
    Tensor k = Tensor::empty({}, dt);
    k.set(0, scale);
    Value z = b.mul(x, b.constant(k));
    if (causal) {
      const std::int64_t rows = s[s.size() - 2], cols = s.back();
      Tensor m = Tensor::empty({rows, cols}, dt);
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) m.set(i * cols + j, j > i + cols - rows ? -1e9 : 0);
      z = b.add(z, b.constant(m));
    }
    y = b.softmax(z, -1);
  }
  Value loss = b.reduce_sum(b.mul(y, w), {});
  auto grads = graph::autodiff(g, loss, {x});
  EXPECT_TRUE(grads.ok()) << grads.status().to_string();
  g.mark_output(y);
  g.mark_output((*grads)[0]);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  Tensor xs = Tensor::empty(s, dt), ws = Tensor::empty(s, dt);
  for (std::int64_t i = 0; i < xs.numel(); ++i) {
    xs.set(i, 30 * std::sin(0.37 * static_cast<double>(i)));  // exp's arguments reach -60
    ws.set(i, std::cos(0.11 * static_cast<double>(i)));
  }
  EXPECT_TRUE((*exe)->bind("x", xs).ok());
  EXPECT_TRUE((*exe)->bind("w", ws).ok());
  EXPECT_TRUE((*exe)->run().ok());
  return {(*exe)->output(0).clone(), (*exe)->output(1).clone()};
}

TEST(AttentionSoftmax, MatchesTheComposedGraph) {
  for (Shape s : {Shape{2, 3, 37, 37}, Shape{3, 5, 21}, Shape{4, 1}, Shape{2, 64, 64}}) {
    for (bool causal : {true, false}) {
      for (DType dt : {DType::kF32, DType::kF64}) {
        SCOPED_TRACE(shape_str(s) + (causal ? " causal " : " ") + dtype_name(dt));
        const Result2 f = run(dt, s, 0.3, causal, true), c = run(dt, s, 0.3, causal, false);
        // f32: the polynomial exp is within a few ulp of libm's; f64 runs libm in both.
        const double tol = dt == DType::kF32 ? 2e-6 : 1e-12;
        const std::int64_t rows = s[s.size() - 2], cols = s.back();
        for (std::int64_t i = 0; i < f.y.numel(); ++i) {
          const std::int64_t r = (i / cols) % rows, j = i % cols;
          if (causal && r + cols - rows < 0) {  // a row that sees nothing is all 0
            ASSERT_EQ(f.y.get(i), 0.0) << "an empty row at " << i;
            ASSERT_EQ(f.dx.get(i), 0.0) << "an empty row's gradient at " << i;
            continue;
          }
          ASSERT_NEAR(f.y.get(i), c.y.get(i), tol) << "y at " << i;
          ASSERT_NEAR(f.dx.get(i), c.dx.get(i), tol) << "dx at " << i;
          if (causal && j > r + cols - rows) {
            ASSERT_EQ(f.y.get(i), 0.0) << "a masked entry at " << i;  // exactly 0
            ASSERT_EQ(f.dx.get(i), 0.0) << "a masked entry's gradient at " << i;
          }
        }
      }
    }
  }
}

TEST(AttentionSoftmax, RowsSumToOneOverTheWholeExpRange) {
  // Scores from -87 to +88 after scaling: the clamped ends must not make
  // a row's mass drift or produce inf/nan.
  const Shape s = {3, 200};
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, s);
  g.mark_output(b.attention_softmax(x, 1.0, false));
  auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  Tensor xs = Tensor::empty(s, DType::kF32);
  for (std::int64_t i = 0; i < xs.numel(); ++i)
    xs.set(i, -87.0 + 175.0 * static_cast<double>(i % 200) / 199.0 - 40.0 * (i / 200));
  ASSERT_TRUE((*exe)->bind("x", xs).ok());
  ASSERT_TRUE((*exe)->run().ok());
  const Tensor& y = (*exe)->output(0);
  for (std::int64_t r = 0; r < 3; ++r) {
    double sum = 0, mx = -1e300;
    for (std::int64_t j = 0; j < 200; ++j) {
      const double v = y.get(r * 200 + j);
      ASSERT_TRUE(std::isfinite(v)) << r << "," << j;
      sum += v;
      mx = std::max(mx, static_cast<double>(xs.get(r * 200 + j)));
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << r;
    // The last entry: e^(x - max) with x the row's maximum, against the
    // exact value of the others' mass (a geometric series).
    const double step = 175.0 / 199.0;
    const double exact = (1 - std::exp(-step)) / (1 - std::exp(-step * 200));
    EXPECT_NEAR(y.get(r * 200 + 199), exact, 1e-6 * exact + 1e-7) << "row " << r << " max " << mx;
  }
}

TEST(AttentionSoftmax, ExpIsWithinAFewUlpOfLibm) {
  // Rows [0, t]: the second entry is e^t / (1 + e^t), so for t << 0 the
  // polynomial exp's relative error shows undiluted by the normalisation.
  const std::int64_t n = 2001;
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {n, 2});
  g.mark_output(b.attention_softmax(x, 1.0, false));
  auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  Tensor xs = Tensor::empty({n, 2}, DType::kF32);
  for (std::int64_t i = 0; i < n; ++i) {
    xs.set(2 * i, 0.0);
    xs.set(2 * i + 1, -80.0 * static_cast<double>(i) / static_cast<double>(n - 1));
  }
  ASSERT_TRUE((*exe)->bind("x", xs).ok());
  ASSERT_TRUE((*exe)->run().ok());
  for (std::int64_t i = 0; i < n; ++i) {
    const double t = xs.get(2 * i + 1), want = std::exp(t) / (1 + std::exp(t));
    ASSERT_NEAR((*exe)->output(0).get(2 * i + 1), want, 4e-7 * want) << "t = " << t;
  }
}

// The loss's f32 rows run the vectorized log-sum-exp, in parallel; the
// f64 rows libm. Rows of 93 (no vector width divides it), scores to +-25.
TEST(CrossEntropy, F32MatchesF64AndABadLabelIsNamed) {
  auto loss = [](DType dt, std::int32_t bad) {
    const std::int64_t n = 301, k = 93;
    Graph g;
    Builder b(g);
    Value x = b.input("x", dt, {n, k});
    Value lab = b.input("labels", DType::kI32, {n});
    g.mark_output(b.cross_entropy(x, lab));
    auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
    EXPECT_TRUE(exe.ok()) << exe.status().to_string();
    Tensor xs = Tensor::empty({n, k}, dt), ls = Tensor::empty({n}, DType::kI32);
    for (std::int64_t i = 0; i < n * k; ++i)
      xs.set(i, 25 * std::sin(0.731 * static_cast<double>(i)));
    for (std::int64_t i = 0; i < n; ++i) ls.set(i, static_cast<double>((i * 7) % k));
    if (bad != 0) ls.set(200, bad);
    EXPECT_TRUE((*exe)->bind("x", xs).ok());
    EXPECT_TRUE((*exe)->bind("labels", ls).ok());
    Status st = (*exe)->run();
    return std::make_pair(st, st.ok() ? (*exe)->output(0).get(0) : 0.0);
  };
  const auto [s32, f] = loss(DType::kF32, 0);
  const auto [s64, d] = loss(DType::kF64, 0);
  ASSERT_TRUE(s32.ok() && s64.ok()) << s32.to_string() << s64.to_string();
  EXPECT_NEAR(f, d, 2e-6 * std::abs(d)) << "f32 " << f << " f64 " << d;
  const auto [bad, unused] = loss(DType::kF32, 93);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.to_string().find("label/index 93 at position 200 is outside [0, 93)"),
            std::string::npos)
      << bad.to_string();
}

TEST(AttentionSoftmax, BadAttributesAreRefusedByName) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {4, 5});
  b.op("softmax", {x}, {{"axis", std::int64_t{0}}, {"causal", std::int64_t{1}}});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("causal needs the last axis"), std::string::npos)
      << b.status().to_string();
  Graph g2;
  Builder b2(g2);
  Value x2 = b2.input("x", DType::kF32, {4, 5});
  b2.attention_softmax(x2, 0.0, false);
  ASSERT_FALSE(b2.ok());
  EXPECT_NE(b2.status().message().find("scale must be finite and > 0, got 0"), std::string::npos)
      << b2.status().to_string();
}

}  // namespace
}  // namespace shoal::runtime
