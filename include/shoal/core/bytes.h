// Little-endian fields appended to a byte string: the one writer of the
// wire formats (ps/wire.cc, net/c10d_store.cc). Shoal's formats are
// little-endian and it builds only for little-endian hosts.
#pragma once

#include <bit>
#include <cstring>
#include <string>
#include <type_traits>

namespace shoal {

static_assert(std::endian::native == std::endian::little,
              "Shoal's wire formats are little-endian, written in host order");

template <typename T>
void append_le(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

}  // namespace shoal
