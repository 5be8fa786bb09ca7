// Philox-4x32-10 counter-based RNG (Salmon et al., SC'11). A stream is keyed
// by (seed, stream id); draws are a pure function of (seed, stream, counter),
// so ranks can draw identical or independent streams and a run can be
// replayed from a saved counter. A PhiloxRng object is not thread-safe; make
// one per thread with distinct stream ids.
#pragma once

#include <array>
#include <cstdint>

#include "shoal/tensor/tensor.h"

namespace shoal {

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                        std::array<std::uint32_t, 2> key);

struct PhiloxState {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
  std::uint64_t counter = 0;  // number of 4-word blocks consumed
};

class PhiloxRng {
 public:
  PhiloxRng(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter = 0)
      : state_{seed, stream, counter} {}
  explicit PhiloxRng(PhiloxState s) : state_(s) {}

  // Block number `counter` of this stream (does not advance).
  std::array<std::uint32_t, 4> block(std::uint64_t counter) const;
  std::array<std::uint32_t, 4> next_block() { return block(state_.counter++); }

  // Uniform in [lo, hi), normal(mean, std): each call consumes whole blocks.
  void fill_uniform(Tensor& t, double lo, double hi);
  void fill_normal(Tensor& t, double mean, double stddev);
  double uniform();  // one value in [0, 1), consumes a block

  const PhiloxState& state() const { return state_; }

 private:
  PhiloxState state_;
};

// Uniform [0,1) float from 32 random bits (24 significant bits).
inline float u32_to_unit_float(std::uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

}  // namespace shoal
