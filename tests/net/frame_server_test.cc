// The frame server's byte paths: requests read into place (a big frame
// arriving in pieces, several frames in one read) and replies sent in
// pieces from the handler's memory, queued (copied) for what a slow reader
// does not take at once.
#include "shoal/net/frame_server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace shoal::net {
namespace {

constexpr char kToken[] = "frame-test-token";

std::uint64_t checksum(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string pattern(std::size_t n, int salt) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + salt) % 251);
  return s;
}

// "sum": replies with the body's length and checksum. "big": replies in
// three pieces, then overwrites the middle piece's memory (what the socket
// did not take must have been copied). Anything else: echoed.
class Handler final : public FrameServer::Handler {
 public:
  std::string on_request(FrameServer& s, FrameServer::ConnId c, const FrameHeader& h,
                         std::string_view body) override {
    if (body.substr(0, 3) == "sum") {
      s.reply(c, FrameType::kPsReply, h.seq,
              std::to_string(body.size()) + ":" + std::to_string(checksum(body)));
    } else if (body == "big") {
      std::string head = "head:", middle = pattern(12 << 20, 7), tail = ":tail";
      std::string_view parts[] = {head, middle, tail};
      s.reply(c, FrameType::kPsReply, h.seq, parts);
      std::fill(middle.begin(), middle.end(), 'X');
    } else {
      s.reply(c, FrameType::kPsReply, h.seq, body);
    }
    return "";
  }
};

struct Served {
  Handler handler;
  std::unique_ptr<FrameServer> server;
  Socket client;
  std::uint64_t seq = 0;

  Served() {
    ServerLimits lim;
    lim.max_request_bytes = 64 << 20;
    auto s = FrameServer::start("127.0.0.1", 0, kToken, &handler, lim, "test server");
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    server = std::move(s).value();
    auto c = connect_authenticated("127.0.0.1", server->port(), Deadline::after_seconds(10), kToken,
                                   "test server");
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    client = std::move(c).value();
  }
  void send(const std::string& body) {
    FrameHeader h;
    h.type = static_cast<std::uint16_t>(FrameType::kPsRequest);
    h.length = body.size();
    h.seq = ++seq;
    ASSERT_TRUE(client.send_frame(h, body.data(), Deadline::after_seconds(10)).ok());
  }
  std::string recv() {
    auto r = recv_reply(client, FrameType::kPsReply, FrameType::kStoreError, 1 << 28,
                        Deadline::after_seconds(10));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : std::string();
  }
};

TEST(FrameServer, BigAndPipelinedRequestsArriveWhole) {
  Served s;
  // A 20 MiB request, then small ones behind it in the same stream, then a
  // second big one: the buffer grows to a whole frame and keeps order.
  const std::string big = "sum" + pattern(20 << 20, 1), big2 = "sum" + pattern(9 << 20, 2);
  s.send(big);
  s.send("one");
  s.send("two");
  s.send(big2);
  EXPECT_EQ(s.recv(), std::to_string(big.size()) + ":" + std::to_string(checksum(big)));
  EXPECT_EQ(s.recv(), "one");
  EXPECT_EQ(s.recv(), "two");
  EXPECT_EQ(s.recv(), std::to_string(big2.size()) + ":" + std::to_string(checksum(big2)));
  // Then a stream of frames of many sizes: reads end inside frames, and
  // the unread rest moves to the front of the (now big) buffer.
  std::vector<std::string> bodies;
  for (int i = 0; i < 600; ++i) bodies.push_back("sum" + pattern(40000 + 977 * (i % 53), i));
  // One byte stream of all of them, sent in pieces that end inside frames.
  std::string stream;
  for (const auto& b : bodies) {
    FrameHeader h;
    h.type = static_cast<std::uint16_t>(FrameType::kPsRequest);
    h.length = b.size();
    h.seq = ++s.seq;
    std::uint8_t hb[kHeaderBytes];
    encode_header(h, hb);
    stream.append(reinterpret_cast<const char*>(hb), kHeaderBytes);
    stream += b;
  }
  std::thread sender([&] {
    for (std::size_t at = 0; at < stream.size(); at += 77777) {
      const std::size_t n = std::min<std::size_t>(77777, stream.size() - at);
      ASSERT_TRUE(s.client.send_all(stream.data() + at, n, Deadline::after_seconds(10)).ok());
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  for (const auto& b : bodies)
    EXPECT_EQ(s.recv(), std::to_string(b.size()) + ":" + std::to_string(checksum(b)));
  sender.join();
}

TEST(FrameServer, RepliesInPiecesReachASlowReaderIntactAndInOrder) {
  Served s;
  s.send("big");
  s.send("after");
  // The client reads nothing for a while: most of the 12 MiB cannot go
  // into the socket and waits in the server's queue, behind which "after"
  // must be queued, not sent first.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string got = s.recv();
  const std::string want = "head:" + pattern(12 << 20, 7) + ":tail";
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "the reply's bytes differ from what the handler sent";
  EXPECT_EQ(s.recv(), "after");
}

}  // namespace
}  // namespace shoal::net
