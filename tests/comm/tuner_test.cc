// The tuner's cost model across hosts (src/comm/tuner.h), with link
// constants like those fitted on the netns testbed at 1 Gbit/s: a host
// link of ~20 us and 8 ns per byte, a host's own memory of ~8 us and
// 0.5 ns per byte (4 hosts x 2 ranks, each host fitted in turn). The choices checked are the ones
// measured there (docs/BENCHMARKS.md, bench/netns_model.py).
#include "comm/tuner.h"

#include <gtest/gtest.h>

namespace shoal::comm {
namespace {

constexpr double kLocalA = 8e-6, kLocalB = 0.5e-9;

Topology hosts_of(std::vector<int> host, bool uniform) {
  Topology t;
  t.host = std::move(host);
  t.uniform = uniform;
  t.cross = LinkCost{20e-6, 8e-9};
  t.local = LinkCost{kLocalA, kLocalB};
  return t;
}

TEST(Tuner, TwoHostsOfTwoRanks) {
  const Topology t = hosts_of({0, 0, 1, 1}, true);
  // A few bytes: recursive doubling's two steps (one inside the host).
  EXPECT_EQ(cheapest_allreduce(t, 4, 1).algo, Algorithm::kRecursiveDoubling);
  // 4 KiB: recursive doubling sends both ranks' 4 KiB over each host's link
  // at once; the two-level form sends 2 KiB per rank (measured 65 vs 33 us).
  EXPECT_EQ(cheapest_allreduce(t, 4096, 1024).algo, Algorithm::kHierarchical);
  // 16 MiB: the ring's 1.5 n per host link loses to n (measured: ring 211
  // ms, halving-doubling 144, two levels 141).
  const std::size_t n = 16 << 20;
  EXPECT_EQ(cheapest_allreduce(t, n, n / 4).algo, Algorithm::kHierarchical);
  const double ring = allreduce_seconds(t, Algorithm::kRing, n, n / 4);
  const double hd = allreduce_seconds(t, Algorithm::kHalvingDoubling, n, n / 4);
  EXPECT_NEAR(ring, 6 * (20e-6 + (n / 4) * 8e-9), 1e-9);
  EXPECT_LT(hd, 0.75 * ring);
}

TEST(Tuner, ATieGoesToOneAlgorithm) {
  // 4 hosts x 2 ranks: halving-doubling (near partners first) and the two
  // levels move the same bytes over the same links up to one pipeline piece
  // (measured at 64 KiB: 822 us against 1099); beyond it the two levels'
  // pipeline hides the hosts' own phases (16 MiB: 215 ms against 239).
  const Topology t = hosts_of({0, 0, 1, 1, 2, 2, 3, 3}, true);
  EXPECT_EQ(cheapest_allreduce(t, 64 << 10, 16 << 10).algo, Algorithm::kHalvingDoubling);
  EXPECT_EQ(cheapest_allreduce(t, 4 << 20, 1 << 20).algo, Algorithm::kHalvingDoubling);
  EXPECT_EQ(cheapest_allreduce(t, 16 << 20, 4 << 20).algo, Algorithm::kHierarchical);
}

TEST(Tuner, AStepIsAsSlowAsItsBusiestHostLink) {
  // Interleaved (rank r on host r % 2): recursive doubling's first step
  // crosses with both ranks of each host, its second stays inside.
  const Topology t = hosts_of({0, 1, 0, 1}, true);
  const double n = 1 << 20;
  const double rd = allreduce_seconds(t, Algorithm::kRecursiveDoubling, 1 << 20, 1 << 18);
  const double expect =
      (20e-6 + 2 * n * 8e-9 + n * kLocalB) + (kLocalA + n * kLocalB + n * kLocalB);
  EXPECT_NEAR(rd, expect, 1e-9);
}

TEST(Tuner, UnevenHostsUseTheLeaders) {
  // 3 + 1: no sliced form; the leader form moves n once across.
  const Topology t = hosts_of({0, 0, 0, 1}, false);
  const std::size_t n = 16 << 20;
  const double hier = allreduce_seconds(t, Algorithm::kHierarchical, n, n / 4);
  // Reduce and broadcast in 2 levels each inside, then 2 x (n/2) across.
  EXPECT_NEAR(hier, 4 * (kLocalA + n * kLocalB) + 2 * (20e-6 + n / 2 * 8e-9), 1e-9);
  EXPECT_EQ(cheapest_allreduce(t, n, n / 4).algo, Algorithm::kHierarchical);
}

TEST(Tuner, FewerElementsThanRanksNeverSplit) {
  const Topology t = hosts_of({0, 0, 1, 1, 2, 2}, true);
  const Algorithm a = cheapest_allreduce(t, 8, 2).algo;
  EXPECT_TRUE(a == Algorithm::kRecursiveDoubling || a == Algorithm::kHierarchical);
}

}  // namespace
}  // namespace shoal::comm
