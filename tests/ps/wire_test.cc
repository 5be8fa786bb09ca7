// Parameter-server messages: round trips, and malformed input refused by
// field (every truncation of a valid push, a dimension product hidden
// behind a zero, trailing bytes, an unknown operation).
#include "ps/wire.h"

#include <gtest/gtest.h>

#include <cstring>

#include "shoal/ps/shard.h"

namespace shoal::ps {
namespace {

Request push() {
  Request r;
  r.op = Op::kPush;
  r.worker = 3;
  r.key = "fc1.weight";
  r.step = 41;
  r.seq = 99;
  r.value = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  return r;
}

TEST(PsWire, RowSparseRequestsRoundTripAndTheirRowsAreChecked) {
  Request r;
  r.op = Op::kPushRows;
  r.worker = 2;
  r.key = "emb";
  r.step = 5;
  r.seq = 6;
  r.lr = 0.5;
  r.rows = {9, 0, 9};
  r.value = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2});
  const std::string m = encode(r);
  auto d = decode_request(m);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->rows, r.rows);
  EXPECT_EQ(d->value.shape(), (Shape{3, 2}));
  EXPECT_EQ(encode(*d), m);
  Request w;
  w.op = Op::kPullRows;
  w.key = "emb";
  w.min_version = 3;
  w.rows = {4};
  auto dw = decode_request(encode(w));
  ASSERT_TRUE(dw.ok()) << dw.status().to_string();
  EXPECT_EQ(dw->rows, w.rows);
  EXPECT_EQ(dw->min_version, 3u);
  // A push-rows-pull: the row push's fields and the reply codec.
  Request x = r;
  x.op = Op::kPushRowsPull;
  x.reply = Codec::kBF16;
  const std::string mx = encode(x);
  auto dx = decode_request(mx);
  ASSERT_TRUE(dx.ok()) << dx.status().to_string();
  EXPECT_EQ(dx->rows, x.rows);
  EXPECT_EQ(dx->reply, Codec::kBF16);
  EXPECT_EQ(dx->lr, 0.5);
  EXPECT_EQ(encode(*dx), mx);
  EXPECT_EQ(
      encode_head(x) + std::string(static_cast<const char*>(x.value.raw_data()), x.value.nbytes()),
      mx);
  // A row count beyond the bytes that follow is refused by field.
  std::string cut = encode(w);
  cut.resize(cut.size() - 1);
  auto e = decode_request(cut);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("'rows'"), std::string::npos) << e.status().message();
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

TEST(PsWire, PushPullConfigAndHeartbeatRoundTrip) {
  Request x = push();
  x.op = Op::kPushPull;
  x.lr = 0.125;
  auto r = decode_request(encode(x));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->lr, 0.125);
  EXPECT_EQ(r->seq, 99u);
  EXPECT_EQ(encode(*r), encode(x));
  x.lr = -1;  // refused by name
  auto neg = decode_request(encode(x));
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("field 'lr' is -1"), std::string::npos);
  Request c;
  c.op = Op::kConfig;
  ShardOptions so;
  so.mode = Mode::kBounded;
  so.optimizer.name = "adam";
  so.lr = 0.003;
  c.config = config_text(so);
  auto rc = decode_request(encode(c));
  ASSERT_TRUE(rc.ok());
  auto parsed = parse_config(rc->config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->mode, Mode::kBounded);
  EXPECT_EQ(parsed->optimizer.name, "adam");
  EXPECT_EQ(parsed->lr, 0.003);
  EXPECT_EQ(config_diff(so, *parsed), "");
  parsed->optimizer.momentum = 0.5;
  EXPECT_EQ(config_diff(so, *parsed), "momentum: the server has 0.9, the worker asks for 0.5");
  EXPECT_FALSE(parse_config("mode=sync").ok());  // every field, or refused
  Request h;
  h.op = Op::kHeartbeat;
  h.worker = 4;
  auto rh = decode_request(encode(h));
  ASSERT_TRUE(rh.ok());
  EXPECT_EQ(rh->worker, 4);
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

namespace shoal::ps {
namespace {

// The same-host messages: a mapcheck and a shmpushpull carry references
// into the worker's shared regions, and what they point at must lie inside.
TEST(PsWire, InPlaceRequestsRoundTripAndTheirRegionsAreChecked) {
  Request y;
  y.op = Op::kShmPushPull;
  y.worker = 1;
  y.key = "fc1.weight";
  y.step = 7;
  y.seq = 12;
  y.lr = 0.25;
  y.mem.pid = 4242;
  y.mem.shape = {3, 5};  // 60 bytes
  y.mem.grad = {9, 17, 4096, 0};
  y.mem.dst = {9, 17, 4096, 4096 - 60};  // ends exactly at the region's end
  const std::string m = encode(y);
  auto d = decode_request(m);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->op, Op::kShmPushPull);
  EXPECT_EQ(d->key, y.key);
  EXPECT_EQ(d->mem.pid, 4242);
  EXPECT_EQ(d->mem.shape, (Shape{3, 5}));
  EXPECT_EQ(d->mem.dst.offset, 4096u - 60);
  EXPECT_EQ(d->mem.grad.fd, 17);
  EXPECT_EQ(encode(*d), m);
  // One byte past the region's end: refused by field.
  Request past = y;
  past.mem.dst.offset = 4096 - 59;
  auto dp = decode_request(encode(past));
  ASSERT_FALSE(dp.ok());
  EXPECT_NE(dp.status().message().find("field 'dst'"), std::string::npos) << dp.status().message();
  EXPECT_NE(dp.status().message().find("60 bytes at offset 4037 of a region of 4096"),
            std::string::npos)
      << dp.status().message();
  // An offset beyond the region, a missing region id, a bad process.
  Request beyond = y;
  beyond.mem.grad.offset = ~std::uint64_t{0};
  EXPECT_FALSE(decode_request(encode(beyond)).ok());
  Request none = y;
  none.mem.grad.id = 0;
  auto dn = decode_request(encode(none));
  ASSERT_FALSE(dn.ok());
  EXPECT_NE(dn.status().message().find("field 'grad'"), std::string::npos) << dn.status().message();
  Request nopid = y;
  nopid.mem.pid = 0;
  auto dz = decode_request(encode(nopid));
  ASSERT_FALSE(dz.ok());
  EXPECT_NE(dz.status().message().find("'pid' is 0"), std::string::npos) << dz.status().message();
  // Every truncation is refused.
  for (std::size_t n = 0; n < m.size(); ++n)
    EXPECT_FALSE(decode_request(m.substr(0, n)).ok()) << "truncated to " << n;
  // The mapcheck: its probe word (8 bytes) must lie in the region too.
  Request c;
  c.op = Op::kMapCheck;
  c.worker = 1;
  c.mem.pid = 4242;
  c.mem.grad = {3, 5, 4096, 4088};
  auto dc = decode_request(encode(c));
  ASSERT_TRUE(dc.ok()) << dc.status().to_string();
  EXPECT_EQ(dc->mem.grad.offset, 4088u);
  EXPECT_EQ(encode(*dc), encode(c));
  c.mem.grad.offset = 4089;
  EXPECT_FALSE(decode_request(encode(c)).ok());
  // The answer's value part: version, shape and the in-place codec byte, no data.
  std::string reply;
  append_pull_reply_in_place(reply, 5, {3, 5});
  EXPECT_EQ(reply.size(), 8u + 1 + 16 + 1);
  EXPECT_EQ(static_cast<std::uint8_t>(reply.back()), kInPlace);
}

}  // namespace
}  // namespace shoal::ps
