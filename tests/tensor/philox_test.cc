#include "shoal/tensor/philox.h"

#include <gtest/gtest.h>

#include <cmath>

namespace shoal {
namespace {

TEST(Philox, KnownAnswer) {
  // Random123 known-answer vector for philox4x32-10 with all-ones inputs.
  auto out = philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff});
  EXPECT_EQ(out[0], 0x408f276du);
  EXPECT_EQ(out[1], 0x41c83b0eu);
  EXPECT_EQ(out[2], 0xa20bc7c6u);
  EXPECT_EQ(out[3], 0x6d5451fdu);
  auto zero = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(zero[0], 0x6627e8d5u);
  EXPECT_EQ(zero[1], 0xe169c58du);
  EXPECT_EQ(zero[2], 0xbc57ac4cu);
  EXPECT_EQ(zero[3], 0x9b00dbd8u);
}

TEST(Philox, StreamsAreReplayableAndIndependent) {
  PhiloxRng a(7, 0), b(7, 0), c(7, 1);
  Tensor ta = Tensor::empty({101}, DType::kF32), tb = ta.clone(), tc = ta.clone();
  a.fill_uniform(ta, -1, 1);
  b.fill_uniform(tb, -1, 1);
  c.fill_uniform(tc, -1, 1);
  EXPECT_EQ(ta.to_vector<float>(), tb.to_vector<float>());
  EXPECT_NE(ta.to_vector<float>(), tc.to_vector<float>());
  // Replay from a saved state.
  PhiloxRng d(PhiloxState{7, 0, 10});
  EXPECT_EQ(d.next_block(), PhiloxRng(7, 0).block(10));
}

TEST(Philox, NormalHasRightMoments) {
  PhiloxRng r(3, 4);
  Tensor t = Tensor::empty({200000}, DType::kF64);
  r.fill_normal(t, 2.0, 3.0);
  double s = 0, s2 = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    s += t.get(i);
    s2 += t.get(i) * t.get(i);
  }
  double m = s / t.numel(), v = s2 / t.numel() - m * m;
  EXPECT_NEAR(m, 2.0, 0.03);
  EXPECT_NEAR(std::sqrt(v), 3.0, 0.03);
}

}  // namespace
}  // namespace shoal
