#include "shoal/tensor/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace shoal {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType t : kAllDTypes) {
    auto p = parse_dtype(dtype_name(t));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, t);
  }
  auto bad = parse_dtype("f8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'f8'"), std::string::npos);
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(float_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);                // rounds to inf
  EXPECT_EQ(float_to_f16(5.960464477539063e-08f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(2.98e-08f).bits, 0x0000);               // below half of it
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
  // Ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
}

TEST(DType, F16RoundTripsEveryHalf) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    F16 h{static_cast<std::uint16_t>(b)};
    float f = f16_to_float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_f16(f).bits, h.bits) << b;
  }
}

TEST(DType, BF16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (down).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(-3.5f)), -3.5f);
}

}  // namespace
}  // namespace shoal
