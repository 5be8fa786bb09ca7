// Parameter-server compression (ps/codec.h): f16/bf16 within their
// rounding, two-bit codes exact for what error feedback produced, the
// error-feedback properties (per-element error bounded by the threshold
// while |g + r| <= 2t; over many pushes what was sent plus the residual
// equals the sum of the gradients), malformed payloads refused by name, and
// sizes that do not fill the last byte.
#include "shoal/ps/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ps/wire.h"

namespace shoal::ps {
namespace {

std::vector<float> randoms(std::size_t n, float scale, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(PsCodec, ParsesWhatTheFlagAllowsAndNamesTheRest) {
  EXPECT_EQ(parse_compression("none")->push, Codec::kF32);
  auto b = parse_compression("bf16");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->push, Codec::kBF16);
  EXPECT_EQ(b->pull, Codec::kBF16);
  auto t = parse_compression("2bit:0.005,f16");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->push, Codec::kTwoBit);
  EXPECT_EQ(t->pull, Codec::kF16);
  EXPECT_FLOAT_EQ(t->threshold, 0.005f);
  EXPECT_EQ(*parse_compression(compression_text(*t)), *t);
  EXPECT_EQ(parse_compression("2bit:0.5")->pull, Codec::kF32);
  for (const char* bad : {"2bit", "2bit:", "2bit:-1", "2bit:x", "2bit:0.1,2bit", "int8", "f16,"}) {
    auto r = parse_compression(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
  }
}

TEST(PsCodec, HalfTypesRoundToNearestAtEverySize) {
  for (std::uint64_t n : {1u, 3u, 4u, 5u, 1001u}) {
    const auto x = randoms(n, 3.f, static_cast<std::uint32_t>(n));
    for (Codec c : {Codec::kF32, Codec::kF16, Codec::kBF16}) {
      std::string out;
      append_coded(out, x.data(), n, c, 0);
      ASSERT_EQ(out.size(), 1 + codec_payload_bytes(c, n));
      std::vector<float> y(n);
      auto used = decode_coded(out, n, y.data());
      ASSERT_TRUE(used.ok()) << used.status().to_string();
      EXPECT_EQ(*used, out.size());
      // Relative half-ulp: 2^-24 (f32, exact), 2^-11 (f16), 2^-8 (bf16).
      const double rel = c == Codec::kF32 ? 0 : c == Codec::kF16 ? 1.0 / 2048 : 1.0 / 256;
      for (std::uint64_t i = 0; i < n; ++i)
        ASSERT_LE(std::abs(y[i] - x[i]), rel * std::abs(x[i]) + 1e-7)
            << codec_name(c) << " element " << i << " of " << n;
    }
  }
}

TEST(PsCodec, TwoBitCarriesQuantizedValuesExactly) {
  for (std::uint64_t n : {1u, 2u, 3u, 4u, 5u, 7u, 9u, 1001u}) {
    const float t = 0.25f;
    ErrorFeedback ef(t);
    const auto g = randoms(n, 0.3f, 7);
    Tensor grad = Tensor::from_vector(g, {static_cast<std::int64_t>(n)});
    Tensor q = Tensor::empty(grad.shape(), DType::kF32);
    ASSERT_TRUE(ef.quantize("k", grad, q).ok());
    std::string out;
    append_coded(out, q.data<float>(), n, Codec::kTwoBit, t);
    EXPECT_EQ(out.size(), 1 + 4 + (n + 3) / 4);  // a quarter of a byte each
    std::vector<float> y(n);
    ASSERT_TRUE(decode_coded(out, n, y.data()).ok());
    for (std::uint64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], q.data<float>()[i]) << i << " of " << n;
  }
}

// The two properties of error feedback, on 200 pushes of one key.
TEST(PsCodec, ErrorFeedbackLosesNothingAndErrsAtMostTheThreshold) {
  const float t = 0.05f;
  const std::int64_t n = 257;
  ErrorFeedback ef(t);
  std::vector<double> sum_g(n, 0), sum_q(n, 0);
  std::vector<float> before(n, 0.f);
  int zeros = 0, sends = 0;
  for (int k = 0; k < 200; ++k) {
    // Mostly small gradients, some above the threshold.
    const auto g = randoms(static_cast<std::size_t>(n), k % 10 == 0 ? 0.2f : 0.01f,
                           static_cast<std::uint32_t>(k + 1));
    Tensor grad = Tensor::from_vector(g, {n});
    Tensor q = Tensor::empty({n}, DType::kF32);
    ASSERT_TRUE(ef.quantize("w", grad, q).ok());
    const float* r = ef.residuals().at("w").data<float>();
    for (std::int64_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(g[i]) + before[i];
      const float qi = q.data<float>()[i];
      ASSERT_TRUE(qi == 0.f || qi == t || qi == -t) << qi;
      // What is sent is never further from g + r than t, unless g + r is
      // beyond 2t (then it is t, and the rest waits in the residual).
      if (std::abs(v) <= 2 * t) {
        ASSERT_LE(std::abs(v - qi), t + 1e-6) << "push " << k;
      }
      ASSERT_NEAR(r[i], v - qi, 1e-6);
      sum_g[i] += g[i];
      sum_q[i] += qi;
      before[i] = r[i];
      (qi == 0.f ? zeros : sends) += 1;
    }
  }
  // Nothing lost: sent + residual = the gradients' sum, element by element.
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(sum_q[i] + before[i], sum_g[i], 1e-4) << "element " << i;
  EXPECT_GT(zeros, 0);
  EXPECT_GT(sends, 0);
}

TEST(PsCodec, MalformedPayloadsAreRefusedByName) {
  std::vector<float> y(5);
  auto expect = [&](const std::string& in, std::uint64_t n, const char* what) {
    auto r = decode_coded(in, n, y.data());
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  expect("", 1, "no codec byte");
  expect(std::string(1, '\x07') + "abcd", 1, "unknown codec 7");
  expect(std::string("\x03\x00\x00\x00\x3f", 5) + std::string(1, '\xff'), 4, "unused code 3");
  expect(std::string("\x03\x00\x00\x80\xbf", 5) + std::string(1, '\x00'), 4, "threshold");
  expect(std::string("\x03\x00\x00\x00\x3f", 5), 5, "need 2 bytes");
  expect(std::string("\x01\x00", 2), 1, "need 2 bytes, 1 are left");
  ErrorFeedback ef(0.1f);
  ASSERT_TRUE(ef.restore({{"k", Tensor::zeros({3}, DType::kF32)}}).ok());
  Tensor g = Tensor::zeros({4}, DType::kF32), q = Tensor::zeros({4}, DType::kF32);
  auto st = ef.quantize("k", g, q);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("residual [3]"), std::string::npos) << st.message();
}

TEST(PsCodec, CodedPushesAndRepliesCrossTheWire) {
  Request r;
  r.op = Op::kPushPull;
  r.worker = 1;
  r.key = "emb";
  r.step = 3;
  r.seq = 4;
  r.lr = 0.1;
  r.codec = Codec::kTwoBit;
  r.threshold = 0.5f;
  r.reply = Codec::kBF16;
  r.value = Tensor::from_vector(std::vector<float>{0.5f, -0.5f, 0, 0.5f, 0}, {5});
  const std::string m = encode(r);
  auto d = decode_request(m);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->codec, Codec::kTwoBit);
  EXPECT_EQ(d->threshold, 0.5f);
  EXPECT_EQ(d->reply, Codec::kBF16);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(d->value.data<float>()[i], r.value.data<float>()[i]);
  EXPECT_EQ(encode(*d), m);
  // A reply in bf16: half the bytes of f32, within bf16's rounding.
  const Tensor v = Tensor::from_vector(std::vector<float>{1.f / 3, -2.5f, 1e-3f}, {3});
  const std::string f32 = encode_pull_reply(9, v), half = encode_pull_reply(9, v, Codec::kBF16);
  EXPECT_EQ(f32.size() - half.size(), 6u);
  auto p = decode_pull_reply(half);
  ASSERT_TRUE(p.ok());
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(p->second.data<float>()[i], v.data<float>()[i], std::abs(v.data<float>()[i]) / 256);
  // A reply codec that is not f32/f16/bf16 is refused by field.
  std::string bad = m;
  bad[1 + 4 + 4 + 3 + 8 + 8 + 8] = '\x03';
  auto e = decode_request(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("'reply'"), std::string::npos) << e.status().message();
}

}  // namespace
}  // namespace shoal::ps
