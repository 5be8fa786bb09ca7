#include "shoal/net/store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "shoal/net/auth.h"

namespace shoal::net {
namespace {

void exercise(Store& a, Store& b) {
  ASSERT_TRUE(a.set("k", "v1").ok());
  auto g = b.get("k", Deadline::after_seconds(5));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(*g, "v1");
  EXPECT_EQ(*a.add("n", 5), 5);
  EXPECT_EQ(*b.add("n", -2), 3);
  EXPECT_EQ(*a.compare_set("c", "", "first"), "first");   // absent -> set
  EXPECT_EQ(*b.compare_set("c", "wrong", "x"), "first");  // no swap
  EXPECT_EQ(*b.compare_set("c", "first", "second"), "second");
  // get blocks until another client sets the key.
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(a.set("late", "here").ok());
  });
  auto late = b.get("late", Deadline::after_seconds(5));
  t.join();
  ASSERT_TRUE(late.ok()) << late.status().to_string();
  EXPECT_EQ(*late, "here");
  std::string big(3 << 20, 'z');  // values of megabytes
  ASSERT_TRUE(a.set("big", big).ok());
  EXPECT_EQ(*b.get("big", Deadline::after_seconds(5)), big);
}

TEST(Store, TcpSetGetAddCompareSetWait) {
  auto srv = TcpStoreServer::start("127.0.0.1", 0, "");
  ASSERT_TRUE(srv.ok()) << srv.status().to_string();
  auto a = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5), "");
  auto b = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5), "");
  ASSERT_TRUE(a.ok() && b.ok());
  exercise(**a, **b);
  auto miss = (*b)->get("never", Deadline::after(std::chrono::milliseconds(200)));
  ASSERT_FALSE(miss.ok());
  EXPECT_NE(miss.status().message().find("never"), std::string::npos);
}

TEST(Store, TcpOverIpv6Loopback) {
  auto srv = TcpStoreServer::start("::1", 0, "");
  if (!srv.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << srv.status().to_string();
  auto a = TcpStore::connect("::1", (*srv)->port(), Deadline::after_seconds(5), "");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE((*a)->set("six", "yes").ok());
  EXPECT_EQ(*(*a)->get("six", Deadline::after_seconds(5)), "yes");
}

TEST(Store, ManyConcurrentClientsCountExactly) {
  auto srv = TcpStoreServer::start("", 0, "");
  ASSERT_TRUE(srv.ok());
  std::vector<std::thread> ts;
  for (int i = 0; i < 16; ++i)
    ts.emplace_back([&] {
      auto c = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5), "");
      ASSERT_TRUE(c.ok());
      for (int k = 0; k < 50; ++k) ASSERT_TRUE((*c)->add("ctr", 1).ok());
    });
  for (auto& t : ts) t.join();
  auto c = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5), "");
  EXPECT_EQ(*(*c)->add("ctr", 0), 800);
}

TEST(Store, GarbageClientIsDroppedAndOthersContinue) {
  auto srv = TcpStoreServer::start("127.0.0.1", 0, "");
  ASSERT_TRUE(srv.ok());
  auto raw = Socket::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5));
  ASSERT_TRUE(raw.ok());
  std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789";
  ASSERT_TRUE(raw->send_all(junk.data(), junk.size(), Deadline::after_seconds(5)).ok());
  char c;
  // The server closes the connection instead of reading past a bad header.
  Status st = raw->recv_all(&c, 1, Deadline::after_seconds(5));
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(st.message().find("closed") != std::string::npos ||
              st.message().find("reset") != std::string::npos)
      << st.to_string();
  auto ok = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5), "");
  ASSERT_TRUE((*ok)->set("still", "serving").ok());
}

TEST(Store, UnreachableStoreIsAClearErrorNotAHang) {
  auto s = Socket::listen("127.0.0.1", 0);
  int port = *s->local_port();
  s->close();  // nothing listens there now
  auto t0 = std::chrono::steady_clock::now();
  auto c =
      TcpStore::connect("127.0.0.1", port, Deadline::after(std::chrono::milliseconds(500)), "");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("unreachable"), std::string::npos) << c.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

// A raw connection that speaks the protocol by hand, to play clients that
// misbehave at a chosen point.
struct RawClient {
  Socket s;
  static RawClient connect(int port) {
    auto s = Socket::connect("127.0.0.1", port, Deadline::after_seconds(5));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return RawClient{std::move(s).value()};
  }
  Status send(FrameType t, const std::string& payload) {
    FrameHeader h;
    h.type = static_cast<std::uint16_t>(t);
    h.length = payload.size();
    return s.send_frame(h, payload.data(), Deadline::after_seconds(5));
  }
  // The handshake with `token`; true when the server accepted it.
  bool prove(const std::string& token) {
    std::string nc = make_nonce();
    if (!send(FrameType::kHello, nc).ok()) return false;
    auto h = s.recv_header(4096, Deadline::after_seconds(5));
    if (!h.ok()) return false;
    std::string body(h->length, '\0');
    if (!s.recv_all(body.data(), body.size(), Deadline::after_seconds(5)).ok()) return false;
    auto ch = parse_store_challenge(body, "test");
    if (!ch.ok() || !send(FrameType::kProof, store_proof(token, 'C', nc, ch->nonce)).ok())
      return false;
    auto ok = s.recv_header(4096, Deadline::after_seconds(5));
    return ok.ok() && ok->type == static_cast<std::uint16_t>(FrameType::kProof);
  }
  // True when the server has closed this connection (within `seconds`).
  bool closed_within(double seconds) {
    char c;
    Status st = s.recv_all(&c, 1, Deadline::after_seconds(seconds));
    return !st.ok() && st.code() != StatusCode::kDeadlineExceeded;
  }
};

TEST(Store, OnlyClientsHoldingTheTokenGetIn) {
  auto srv = TcpStoreServer::start("127.0.0.1", 0, "job-secret");
  ASSERT_TRUE(srv.ok());
  const int port = (*srv)->port();
  auto good = TcpStore::connect("127.0.0.1", port, Deadline::after_seconds(5), "job-secret");
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  ASSERT_TRUE((*good)->set("shoal/addr/0", "10.0.0.1:4000").ok());
  // A client with another token is refused, and says why.
  auto bad = TcpStore::connect("127.0.0.1", port, Deadline::after_seconds(5), "guess");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does not hold this job's token"), std::string::npos)
      << bad.status().to_string();
  // One that skips the handshake and asks for a key gets no answer but a close.
  RawClient raw = RawClient::connect(port);
  ASSERT_TRUE(
      raw.send(FrameType::kStoreRequest, pack_store_request('G', "shoal/addr/0", "", "")).ok());
  EXPECT_TRUE(raw.closed_within(5));
  // One that proves a wrong token by hand is closed too.
  RawClient liar = RawClient::connect(port);
  EXPECT_FALSE(liar.prove("guess"));
  // (The first client dropped the connection itself on seeing the server's
  // proof; the other two are refused by the server.)
  for (int i = 0; i < 100 && (*srv)->refused() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE((*srv)->refused(), 2);
  // A server holding another token is no store for a client: an impostor
  // on the port cannot feed a rank addresses.
  auto other = TcpStoreServer::start("127.0.0.1", 0, "other-job");
  auto fooled =
      TcpStore::connect("127.0.0.1", (*other)->port(), Deadline::after_seconds(5), "job-secret");
  EXPECT_FALSE(fooled.ok());
  // The good client was served throughout.
  EXPECT_EQ(*(*good)->get("shoal/addr/0", Deadline::after_seconds(5)), "10.0.0.1:4000");
}

TEST(Store, SilentAndSlowClientsDoNotDelayOthers) {
  StoreLimits lim;
  lim.handshake_seconds = 1;
  lim.io_seconds = 1;
  auto srv = TcpStoreServer::start("127.0.0.1", 0, "t", lim);
  ASSERT_TRUE(srv.ok());
  const int port = (*srv)->port();
  RawClient silent = RawClient::connect(port);  // connects, sends nothing
  RawClient slow = RawClient::connect(port);    // proves, then a byte at a time
  ASSERT_TRUE(slow.prove("t"));
  std::string req = pack_store_request('S', "k", "v", "");
  std::thread trickle([&] {
    net::FrameHeader h;
    h.type = static_cast<std::uint16_t>(FrameType::kStoreRequest);
    h.length = req.size();
    std::uint8_t hb[kHeaderBytes];
    encode_header(h, hb);
    for (int i = 0; i < 8; ++i) {  // 8 of 32 header bytes over ~2.4 s
      if (!slow.s.send_all(hb + i, 1, Deadline::after_seconds(1)).ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  auto good = TcpStore::connect("127.0.0.1", port, Deadline::after_seconds(5), "t");
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  for (int i = 0; i < 20; ++i) {  // each call is answered at once meanwhile
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE((*good)->set("x" + std::to_string(i), "y").ok());
    ASSERT_TRUE((*good)->get("x" + std::to_string(i), Deadline::after_seconds(1)).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(silent.closed_within(3)) << "a silent client must be dropped at its deadline";
  trickle.join();
  EXPECT_TRUE(slow.closed_within(3)) << "a trickling client must be dropped at its deadline";
  EXPECT_GE((*srv)->refused(), 2);
}

TEST(Store, LimitsOnKeysRequestsAndConnections) {
  StoreLimits lim;
  lim.max_keys = 3;
  lim.max_request_bytes = 1024;
  lim.max_clients_per_address = 2;
  auto srv = TcpStoreServer::start("127.0.0.1", 0, "t", lim);
  ASSERT_TRUE(srv.ok());
  const int port = (*srv)->port();
  auto a = TcpStore::connect("127.0.0.1", port, Deadline::after_seconds(5), "t");
  ASSERT_TRUE(a.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*a)->set("k" + std::to_string(i), "v").ok());
  Status full = (*a)->set("k3", "v");
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find("store full: 3 keys held, the limit is 3"), std::string::npos)
      << full.to_string();
  EXPECT_TRUE((*a)->set("k0", "replaced").ok());  // an existing key can still change
  // A second client fits; a third from the same address is refused.
  auto b = TcpStore::connect("127.0.0.1", port, Deadline::after_seconds(5), "t");
  ASSERT_TRUE(b.ok());
  auto c = TcpStore::connect("127.0.0.1", port, Deadline::after_seconds(2), "t");
  EXPECT_FALSE(c.ok());
  // A request over the bound closes that client only.
  EXPECT_FALSE((*b)->set("big", std::string(4096, 'z')).ok());
  EXPECT_EQ(*(*a)->get("k0", Deadline::after_seconds(5)), "replaced");
}

TEST(FileStore, JobsSharingADirectoryNeverReadEachOthersKeys) {
  auto dir = std::filesystem::temp_directory_path() / ("shoal_fjobs_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  FileStore first(dir.string(), "20261124-a.0");
  ASSERT_TRUE(first.set("shoal/addr/0", "stale:1").ok());
  FileStore second(dir.string(), "20261124-b.0");
  auto miss = second.get("shoal/addr/0", Deadline::after(std::chrono::milliseconds(100)));
  EXPECT_FALSE(miss.ok()) << "the second job read the first job's key";
  ASSERT_TRUE(second.set("shoal/addr/0", "fresh:2").ok());
  EXPECT_EQ(*first.get("shoal/addr/0", Deadline::after_seconds(1)), "stale:1");
  struct stat st {};
  ASSERT_EQ(::stat(second.dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "keys readable by other users";
  std::filesystem::remove_all(dir);
}

TEST(FileStore, SameContractOnADirectory) {
  auto dir = std::filesystem::temp_directory_path() / ("shoal_fstore_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  FileStore a(dir.string()), b(dir.string());
  exercise(a, b);
  auto miss = b.get("never/ever", Deadline::after(std::chrono::milliseconds(100)));
  EXPECT_FALSE(miss.ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal::net
