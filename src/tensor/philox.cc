#include "shoal/tensor/philox.h"

#include <cmath>

namespace shoal {
namespace {
constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
}  // namespace

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> c,
                                        std::array<std::uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c[0];
    std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c[2];
    std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

std::array<std::uint32_t, 4> PhiloxRng::block(std::uint64_t counter) const {
  std::array<std::uint32_t, 4> c = {
      static_cast<std::uint32_t>(counter), static_cast<std::uint32_t>(counter >> 32),
      static_cast<std::uint32_t>(state_.stream), static_cast<std::uint32_t>(state_.stream >> 32)};
  std::array<std::uint32_t, 2> k = {static_cast<std::uint32_t>(state_.seed),
                                    static_cast<std::uint32_t>(state_.seed >> 32)};
  return philox4x32(c, k);
}

double PhiloxRng::uniform() {
  auto b = next_block();
  std::uint64_t x = (static_cast<std::uint64_t>(b[0]) << 21) ^ b[1];
  return static_cast<double>(x & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

void PhiloxRng::fill_uniform(Tensor& t, double lo, double hi) {
  std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; i += 4) {
    auto b = next_block();
    for (int j = 0; j < 4 && i + j < n; ++j)
      t.set(i + j, lo + (hi - lo) * static_cast<double>(u32_to_unit_float(b[j])));
  }
}

void PhiloxRng::fill_normal(Tensor& t, double mean, double stddev) {
  std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; i += 2) {
    auto b = next_block();
    // Box-Muller on two 64-bit uniforms in (0, 1].
    double u1 = (static_cast<double>((static_cast<std::uint64_t>(b[0]) << 20) ^ b[1]) + 1.0) /
                (static_cast<double>(1ull << 52) + 1.0);
    double u2 = static_cast<double>((static_cast<std::uint64_t>(b[2]) << 20) ^ b[3]) /
                static_cast<double>(1ull << 52);
    u1 = std::min(u1, 1.0);
    double r = std::sqrt(-2.0 * std::log(u1));
    double th = 2.0 * M_PI * std::fmod(u2, 1.0);
    t.set(i, mean + stddev * r * std::cos(th));
    if (i + 1 < n) t.set(i + 1, mean + stddev * r * std::sin(th));
  }
}

}  // namespace shoal
