// Bit tricks over a node's chips (bit i = chip i): free arcs of a chip
// ring, blocks of a chip mesh.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

namespace shoal::cluster {

inline std::uint64_t all_chips(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

// The k chips start, start+1, … (mod n) as a mask.
inline std::uint64_t arc_mask(int n, int start, int k) {
  std::uint64_t m = 0;
  for (int i = 0; i < k; ++i) m |= 1ull << ((start + i) % n);
  return m;
}

struct Arc {
  int start = 0, length = 0;
};
// Maximal runs of set bits of `free` around a ring of n chips.
inline std::vector<Arc> free_arcs(std::uint64_t free, int n) {
  std::vector<Arc> arcs;
  if (n <= 0 || free == 0) return arcs;
  if (free == all_chips(n)) return {{0, n}};
  int z = 0;  // a used chip: runs start after it
  while (free >> z & 1) ++z;
  for (int i = 1; i <= n; ++i) {
    int c = (z + i) % n;
    if (free >> c & 1) {
      if (!(free >> ((c + n - 1) % n) & 1)) arcs.push_back({c, 0});  // after a used chip
      ++arcs.back().length;
    }
  }
  return arcs;
}

// Whether `mask` (non-empty) is one contiguous arc of a ring of n chips.
inline bool is_arc(std::uint64_t mask, int n) {
  if (mask == 0) return false;
  auto arcs = free_arcs(mask, n);
  return arcs.size() == 1;
}

// The w×h block at (x, y) of a mesh w_n wide.
inline std::uint64_t block_mask(int w_n, int x, int y, int w, int h) {
  std::uint64_t m = 0;
  for (int r = 0; r < h; ++r) m |= (all_chips(w) << x) << ((y + r) * w_n);
  return m;
}

// Whether `mask` is exactly an axis-aligned w×h or h×w block of the mesh.
inline bool is_block(std::uint64_t mask, int w_n, int h_n, int w, int h) {
  for (int turn = 0; turn < 2; ++turn) {
    int bw = turn ? h : w, bh = turn ? w : h;
    for (int y = 0; y + bh <= h_n; ++y)
      for (int x = 0; x + bw <= w_n; ++x)
        if (block_mask(w_n, x, y, bw, bh) == mask) return true;
  }
  return false;
}

// Chips of `mask` in ascending order.
inline std::vector<int> chips_of(std::uint64_t mask) {
  std::vector<int> out;
  while (mask) {
    out.push_back(std::countr_zero(mask));
    mask &= mask - 1;
  }
  return out;
}

}  // namespace shoal::cluster
