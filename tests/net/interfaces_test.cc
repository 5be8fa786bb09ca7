// Interface choice (SHOAL_SOCKET_IFNAME, the route to the store) on this
// host's own interfaces; across hosts in tests/cli/netns_cli_test.cc.
#include "shoal/net/interfaces.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace shoal::net {
namespace {

struct IfnameEnv {
  explicit IfnameEnv(const char* v) {
    if (v)
      setenv("SHOAL_SOCKET_IFNAME", v, 1);
    else
      unsetenv("SHOAL_SOCKET_IFNAME");
  }
  ~IfnameEnv() { unsetenv("SHOAL_SOCKET_IFNAME"); }
};

TEST(Interfaces, LoopbackIsListedAndSelectedByPrefixOrExactName) {
  auto all = list_interfaces();
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  bool lo = false;
  for (const Interface& i : *all) lo |= i.name == "lo" && i.addr == "127.0.0.1" && i.loopback;
  EXPECT_TRUE(lo);
  auto byprefix = interface_by_name("l");
  ASSERT_TRUE(byprefix.ok()) << byprefix.status().to_string();
  EXPECT_EQ(byprefix->name, "lo");
  auto exact = interface_by_name("=lo");
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->addr, "127.0.0.1");
  // "=l" is an exact name no interface has; the error lists what there is.
  auto none = interface_by_name("=l");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("lo (127.0.0.1)"), std::string::npos)
      << none.status().to_string();
  EXPECT_FALSE(interface_by_name("").ok());
  EXPECT_FALSE(interface_by_name("^").ok());
}

TEST(Interfaces, ExcludingLoopbackNeverYieldsIt) {
  auto other = interface_by_name("^lo");
  if (!other.ok()) GTEST_SKIP() << "this host has no interface but loopback";
  EXPECT_NE(other->name, "lo");
  EXPECT_FALSE(other->loopback);
}

TEST(Interfaces, TheRouteToALoopbackStoreIsLoopback) {
  IfnameEnv unset(nullptr);
  auto i = interface_toward("127.0.0.1");
  ASSERT_TRUE(i.ok()) << i.status().to_string();
  EXPECT_TRUE(i->loopback);
  EXPECT_EQ(i->addr, "127.0.0.1");
  std::string why;
  auto c = choose_interface("127.0.0.1", &why);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->addr, "127.0.0.1");
  EXPECT_NE(why.find("route"), std::string::npos) << why;
}

// Loopback named by SHOAL_SOCKET_IFNAME while the store is on another host
// (198.18.0.0/15: no such host here) is refused by name.
TEST(Interfaces, LoopbackIsNotOfferedWhenTheStoreIsElsewhere) {
  IfnameEnv lo("lo");
  std::string why;
  auto c = choose_interface("198.18.200.7", &why);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("SHOAL_SOCKET_IFNAME=lo selects the loopback"),
            std::string::npos)
      << c.status().to_string();
  EXPECT_NE(c.status().message().find("198.18.200.7"), std::string::npos);
  // The same choice with the store on this host is fine.
  auto local = choose_interface("127.0.0.1", &why);
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  EXPECT_EQ(why, "SHOAL_SOCKET_IFNAME=lo");
}

TEST(Interfaces, AnUnknownStoreHostIsNamed) {
  IfnameEnv unset(nullptr);
  std::string why;
  auto c = choose_interface("no-such-host.invalid", &why);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no-such-host.invalid"), std::string::npos);
}

// A store served under a name listens everywhere: this host may resolve
// its own name to 127.0.1.1 while the others resolve it to a reachable one
// (torchrun's c10d names the store by host name; NetnsCluster checks it).
TEST(Interfaces, AServerNamedByAHostNameListensOnEveryInterface) {
  EXPECT_EQ(listen_address_for("198.18.1.1"), "198.18.1.1");
  EXPECT_EQ(listen_address_for("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(listen_address_for("localhost"), "localhost");
  EXPECT_EQ(listen_address_for("[::1]"), "[::1]");
  EXPECT_EQ(listen_address_for("fd00::5"), "fd00::5");
  EXPECT_EQ(listen_address_for("node7"), "0.0.0.0");
}

}  // namespace
}  // namespace shoal::net
