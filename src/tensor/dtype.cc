#include "shoal/tensor/dtype.h"

namespace shoal {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

Result<DType> parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (name == dtype_name(t)) return t;
  return invalid_argument("unknown dtype '{}' (expected f32, f64, f16, bf16, i32, i64, u8, bool)",
                          name);
}

bool is_floating(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16;
}

// IEEE binary16 from binary32, round to nearest even, with subnormals,
// overflow to infinity and NaN kept quiet.
F16 float_to_f16(float f) {
  std::uint32_t x = float_to_bits(f);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return F16{static_cast<std::uint16_t>(sign | 0x7e00u)};   // NaN
  if (absx >= 0x477ff000u) return F16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // overflow/inf
  if (absx < 0x38800000u) {
    // Subnormal half (or zero): value = m * 2^-24.
    if (absx < 0x33000000u) return F16{static_cast<std::uint16_t>(sign)};  // < 2^-25 -> 0
    std::uint32_t e = absx >> 23;
    std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(e);  // 113 + 13 ... bits to drop
    std::uint32_t half = m >> shift;
    std::uint32_t rem = m & ((1u << shift) - 1);
    std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return F16{static_cast<std::uint16_t>(sign | half)};
  }
  std::uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  std::uint32_t half = r >> 13;
  std::uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return F16{static_cast<std::uint16_t>(sign | half)};
}

float f16_to_float(F16 h) {
  std::uint32_t sign = (static_cast<std::uint32_t>(h.bits) & 0x8000u) << 16;
  std::uint32_t e = (h.bits >> 10) & 0x1fu;
  std::uint32_t m = h.bits & 0x3ffu;
  if (e == 0x1f) return bits_to_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_to_float(sign);
    float v = static_cast<float>(m) * (1.0f / 16777216.0f);  // m * 2^-24
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace shoal
