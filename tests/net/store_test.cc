#include "shoal/net/store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

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
  auto srv = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(srv.ok()) << srv.status().to_string();
  auto a = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5));
  auto b = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5));
  ASSERT_TRUE(a.ok() && b.ok());
  exercise(**a, **b);
  auto miss = (*b)->get("never", Deadline::after(std::chrono::milliseconds(200)));
  ASSERT_FALSE(miss.ok());
  EXPECT_NE(miss.status().message().find("never"), std::string::npos);
}

TEST(Store, TcpOverIpv6Loopback) {
  auto srv = TcpStoreServer::start("::1", 0);
  if (!srv.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << srv.status().to_string();
  auto a = TcpStore::connect("::1", (*srv)->port(), Deadline::after_seconds(5));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE((*a)->set("six", "yes").ok());
  EXPECT_EQ(*(*a)->get("six", Deadline::after_seconds(5)), "yes");
}

TEST(Store, ManyConcurrentClientsCountExactly) {
  auto srv = TcpStoreServer::start("", 0);
  ASSERT_TRUE(srv.ok());
  std::vector<std::thread> ts;
  for (int i = 0; i < 16; ++i)
    ts.emplace_back([&] {
      auto c = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5));
      ASSERT_TRUE(c.ok());
      for (int k = 0; k < 50; ++k) ASSERT_TRUE((*c)->add("ctr", 1).ok());
    });
  for (auto& t : ts) t.join();
  auto c = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5));
  EXPECT_EQ(*(*c)->add("ctr", 0), 800);
}

TEST(Store, GarbageClientIsDroppedAndOthersContinue) {
  auto srv = TcpStoreServer::start("127.0.0.1", 0);
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
  auto ok = TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(5));
  ASSERT_TRUE((*ok)->set("still", "serving").ok());
}

TEST(Store, UnreachableStoreIsAClearErrorNotAHang) {
  auto s = Socket::listen("127.0.0.1", 0);
  int port = *s->local_port();
  s->close();  // nothing listens there now
  auto t0 = std::chrono::steady_clock::now();
  auto c = TcpStore::connect("127.0.0.1", port, Deadline::after(std::chrono::milliseconds(500)));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("unreachable"), std::string::npos) << c.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
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
