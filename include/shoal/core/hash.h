// FNV-1a, 64-bit: a stable hash of bytes, the same in every build and on
// every host (unlike std::hash), for values ranks must agree on: graph and
// build fingerprints, key placement, ports derived from job ids.
#pragma once

#include <cstdint>
#include <string_view>

namespace shoal {

inline std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace shoal
