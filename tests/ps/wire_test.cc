// Parameter-server messages: round trips, and malformed input refused by
// field (every truncation of a valid push, a dimension product hidden
// behind a zero, trailing bytes, an unknown operation).
#include "shoal/ps/wire.h"

#include <gtest/gtest.h>

#include <cstring>

namespace shoal::ps {
namespace {

Request push() {
  Request r;
  r.op = 'P';
  r.worker = 3;
  r.key = "fc1.weight";
  r.step = 41;
  r.seq = 99;
  r.value = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  return r;
}

TEST(PsWire, RequestsRoundTrip) {
  const std::string m = encode(push());
  auto r = decode_request(m);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->worker, 3);
  EXPECT_EQ(r->key, "fc1.weight");
  EXPECT_EQ(r->step, 41);
  EXPECT_EQ(r->seq, 99u);
  EXPECT_EQ(r->value.shape(), (Shape{2, 3}));
  EXPECT_EQ(r->value.data<float>()[5], 6.f);
  EXPECT_EQ(encode(*r), m);
  auto p = decode_pull_reply(encode_pull_reply(7, r->value));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->first, 7u);
}

TEST(PsWire, MalformedMessagesAreRefusedByField) {
  const std::string m = encode(push());
  for (std::size_t n = 0; n < m.size(); ++n)
    EXPECT_FALSE(decode_request(m.substr(0, n)).ok()) << "a push cut to " << n << " bytes";
  auto trailing = decode_request(m + "x");
  EXPECT_NE(trailing.status().message().find("1 trailing bytes"), std::string::npos);
  auto unknown = decode_request("Z");
  EXPECT_NE(unknown.status().message().find("unknown operation 0x5a"), std::string::npos);
  // init of a tensor [0, 2^62, 2^62]: no elements, but a product that
  // overflows. Found by the fuzzer (tests/fuzz/wire_fuzz.cc).
  std::string init = "I";
  std::uint32_t klen = 1;
  init.append(reinterpret_cast<const char*>(&klen), 4);
  init += "k";
  init += static_cast<char>(3);
  for (std::int64_t d : {std::int64_t{0}, std::int64_t{1} << 62, std::int64_t{1} << 62})
    init.append(reinterpret_cast<const char*>(&d), 8);
  auto big = decode_request(init);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("field 'value' at byte"), std::string::npos)
      << big.status().to_string();
}

}  // namespace
}  // namespace shoal::ps
