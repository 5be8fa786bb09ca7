// Element types and conversions. f16 and bf16 are stored as raw 16-bit
// patterns; conversions from f32 round to nearest, ties to even. Pure
// functions; thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "shoal/core/status.h"

namespace shoal {

enum class DType : std::uint8_t { kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                       DType::kI32, DType::kI64, DType::kU8,  DType::kBool};

std::size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ...
Result<DType> parse_dtype(std::string_view name);
bool is_floating(DType t);

struct F16 {
  std::uint16_t bits = 0;
};
struct BF16 {
  std::uint16_t bits = 0;
};

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline BF16 float_to_bf16(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{static_cast<std::uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return BF16{static_cast<std::uint16_t>(u >> 16)};
}
inline float bf16_to_float(BF16 h) {
  return bits_to_float(static_cast<std::uint32_t>(h.bits) << 16);
}

F16 float_to_f16(float f);
float f16_to_float(F16 h);

// Maps a C++ type to its DType.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kF64;
};
template <>
struct DTypeOf<F16> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<BF16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::kU8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};

// Calls f(T{}) with T the C++ type of t.
template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(float{});
    case DType::kF64:
      return f(double{});
    case DType::kF16:
      return f(F16{});
    case DType::kBF16:
      return f(BF16{});
    case DType::kI32:
      return f(std::int32_t{});
    case DType::kI64:
      return f(std::int64_t{});
    case DType::kU8:
      return f(std::uint8_t{});
    case DType::kBool:
      return f(bool{});
  }
  return f(float{});
}

// Value conversions used by cast: to/from double for arithmetic types.
template <typename T>
inline double to_double(T v) {
  if constexpr (std::is_same_v<T, F16>)
    return f16_to_float(v);
  else if constexpr (std::is_same_v<T, BF16>)
    return bf16_to_float(v);
  else
    return static_cast<double>(v);
}
template <typename T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, F16>)
    return float_to_f16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, BF16>)
    return float_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>)
    return v != 0.0;
  else
    return static_cast<T>(v);
}

}  // namespace shoal
