// Shared regions: lookup of buffers in live regions, and mapping another
// process's region (a forked child's) through /proc, with the checks that
// refuse a wrong id, a wrong size or a closed fd.
#include "shoal/net/shared_memory.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

namespace shoal::net {
namespace {

TEST(SharedRegion, FindsBuffersOnlyInsideLiveRegions) {
  auto r = SharedRegion::create(10000);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto* base = static_cast<std::uint8_t*>((*r)->data());
  EXPECT_GE((*r)->size(), 10000u);
  EXPECT_EQ((*r)->size() % static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), 0u);
  for (std::size_t i = 0; i < (*r)->size(); ++i) ASSERT_EQ(base[i], 0) << "not zero at " << i;
  auto in = find_shared(base + 64, 1000);
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->offset, 64u);
  EXPECT_EQ(in->region_bytes, (*r)->size());
  EXPECT_NE(in->id, 0u);
  EXPECT_TRUE(find_shared(base, (*r)->size()).has_value());
  EXPECT_FALSE(find_shared(base + 1, (*r)->size()).has_value()) << "runs past the end";
  int local = 0;
  EXPECT_FALSE(find_shared(&local, sizeof local).has_value());
  auto other = SharedRegion::create(1);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(find_shared((*other)->data(), 1)->id, in->id);
  r->reset();
  EXPECT_FALSE(find_shared(base + 64, 1000).has_value()) << "a freed region is still found";
}

// The child creates a region, fills it, reports where it is, and waits; the
// parent maps it, checks the bytes, writes its own, and the child checks them.
TEST(PeerMapping, MapsAnotherProcessRegionAndRefusesWrongOnes) {
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  const std::size_t n = 3 * 4096 + 100;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(30);  // never outlive a broken parent
    auto r = SharedRegion::create(n);
    if (!r.ok()) _exit(10);
    auto* p = static_cast<std::uint8_t*>((*r)->data());
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(i * 7);
    auto ref = find_shared(p + 100, n - 100);
    if (!ref) _exit(11);
    if (write(up[1], &*ref, sizeof *ref) != static_cast<ssize_t>(sizeof *ref)) _exit(12);
    char go = 0;
    if (read(down[0], &go, 1) != 1) _exit(13);
    for (std::size_t i = 100; i < n; ++i)
      if (p[i] != static_cast<std::uint8_t>(255 - i % 200)) _exit(14);
    _exit(0);
  }
  SharedRef ref;
  ASSERT_EQ(read(up[0], &ref, sizeof ref), static_cast<ssize_t>(sizeof ref));
  EXPECT_EQ(ref.offset, 100u);

  // Wrong id (an fd that holds another region), wrong size, closed fd.
  SharedRef wrong = ref;
  wrong.id += 1000;
  auto bad = PeerMapping::open(pid, wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not the announced region"), std::string::npos)
      << bad.status().to_string();
  wrong = ref;
  wrong.region_bytes += 4096;
  bad = PeerMapping::open(pid, wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("holds"), std::string::npos) << bad.status().to_string();
  wrong = ref;
  wrong.fd = 987;
  bad = PeerMapping::open(pid, wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("/fd/987"), std::string::npos) << bad.status().to_string();

  auto m = PeerMapping::open(pid, ref);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ((*m)->size(), ref.region_bytes);
  std::uint8_t* q = (*m)->data();
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(q[i], static_cast<std::uint8_t>(i * 7)) << "byte " << i;
  for (std::size_t i = 100; i < n; ++i) q[i] = static_cast<std::uint8_t>(255 - i % 200);
  char go = 1;
  ASSERT_EQ(write(down[1], &go, 1), 1);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
}

}  // namespace
}  // namespace shoal::net
