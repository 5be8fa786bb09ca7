// InBuffer against a plain string doing the same: random reads of random
// sizes, random consumption from the front, so that the buffer compacts,
// grows and resets in every order.
#include "net/in_buffer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace shoal::net {
namespace {

TEST(InBuffer, HoldsExactlyWhatWasReadAndNotConsumed) {
  std::mt19937 rng(7);
  InBuffer b;
  std::string model;
  std::size_t produced = 0;
  for (int i = 0; i < 20000; ++i) {
    if (rng() % 2) {
      // A "read": room for at least `want`, filled with part of it.
      const std::size_t want = 1 + rng() % (rng() % 8 == 0 ? 300000 : 3000);
      const std::size_t room = b.make_room(want);
      ASSERT_GE(room, want);
      const std::size_t got = 1 + rng() % want;
      for (std::size_t k = 0; k < got; ++k) b.tail()[k] = static_cast<char>(produced++ % 251);
      model.append(b.tail(), got);
      b.commit(got);
    } else {
      const std::size_t n = rng() % 4 == 0 ? b.size() : rng() % (b.size() + 1);
      b.consume(n);
      model.erase(0, n);
    }
    ASSERT_EQ(b.size(), model.size()) << "step " << i;
    ASSERT_TRUE(std::string(b.data(), b.size()) == model) << "step " << i;
  }
}

}  // namespace
}  // namespace shoal::net
