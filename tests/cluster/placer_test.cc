// The placer: gangs whole or not at all, nothing over-committed, ring and
// mesh jobs on linked chips, packing that keeps whole nodes free, and an
// α-β cost that prices a scattered ring above an adjacent one. Properties
// checked on random clusters and random job streams.
#include "shoal/cluster/placer.h"

#include <gtest/gtest.h>

#include <bit>
#include <random>

namespace shoal::cluster {
namespace {

JobSpec job(const std::string& name, int ranks, int chips, LinkNeed links = LinkNeed::kNone) {
  JobSpec j;
  j.name = name;
  j.ranks = ranks;
  j.accels_per_rank = chips;
  j.cpus_per_rank = 1;
  j.links = links;
  return j;
}

// Every rank's chips are free chips of an up node, none twice, CPUs and
// memory within the node's.
void expect_valid(const ClusterState& before, const JobSpec& j, const Placement& p, int ranks) {
  ASSERT_EQ(static_cast<int>(p.ranks.size()), ranks + j.servers) << j.name;
  ClusterState s = before;
  ASSERT_TRUE(s.take(j, p.ranks).ok()) << j.name;
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    int want = static_cast<int>(r) < ranks ? j.accels_per_rank : 0;
    EXPECT_EQ(std::popcount(p.ranks[r].accels), want) << j.name << " rank " << r;
  }
}

TEST(Placer, RingOnAFreeArcAndAcrossWholeNodes) {
  Topology t = generate_topology(4, 2, 16, 64000, 8, ChipLinks::kRing);
  ClusterState s(t);
  // Chips 0-1 and 5 of n1 in use: its free arcs are 2-4 (3) and 6-7 (2).
  auto a = place(s, job("a", 2, 1), 2, {});
  ASSERT_TRUE(a);
  ASSERT_TRUE(s.take(job("a", 2, 1), a->ranks).ok());
  ASSERT_TRUE(s.take(job("b", 1, 1), {{0, 1ull << 5}}).ok());
  auto r = place(s, job("r", 2, 1, LinkNeed::kRing), 2, {});
  ASSERT_TRUE(r);
  EXPECT_TRUE(adjacent(t, job("r", 2, 1, LinkNeed::kRing), *r));
  EXPECT_EQ(r->ranks[0].node, 0);  // best fit: the arc of exactly two (6-7)
  EXPECT_EQ(r->ranks[0].accels | r->ranks[1].accels, 0b11000000ull);
  // 16 chips: two whole idle nodes, consecutive under one switch (n3-n4).
  auto big = job("big", 16, 1, LinkNeed::kRing);
  auto pb = place(s, big, 16, {});
  ASSERT_TRUE(pb);
  EXPECT_TRUE(adjacent(t, big, *pb));
  EXPECT_EQ(pb->ranks.front().node, 2);
  EXPECT_EQ(pb->ranks.back().node, 3);
  // Without adjacency the same job lands anywhere, and costs more.
  auto loose = place(s, big, 16, {true, false});
  ASSERT_TRUE(loose);
  EXPECT_GE(allreduce_seconds(t, big, *loose), allreduce_seconds(t, big, *pb));
}

TEST(Placer, MeshOnAnAlignedBlock) {
  Topology t = generate_topology(1, 1, 16, 64000, 8, ChipLinks::kMesh, 4, 2);
  ClusterState s(t);
  ASSERT_TRUE(s.take(job("x", 1, 1), {{0, 1ull << 0}}).ok());  // chip (0,0)
  JobSpec m = job("m", 4, 1, LinkNeed::kMesh);
  m.mesh_w = 2;
  m.mesh_h = 2;
  auto p = place(s, m, 4, {});
  ASSERT_TRUE(p);
  EXPECT_TRUE(adjacent(t, m, *p));
  std::uint64_t mask = 0;
  for (const RankSlot& r : p->ranks) mask |= r.accels;
  EXPECT_EQ(mask & 1, 0u);
  // A 4x2 block no longer fits; 2x4 does not exist on a 4x2 mesh.
  m.mesh_w = 4;
  m.mesh_h = 2;
  m.ranks = 8;
  EXPECT_FALSE(place(s, m, 8, {}));
}

// A gang that did not ask for links still all-reduces: it gets linked chips
// when they are free (and so the chip links' cost), else whatever fits.
TEST(Placer, AnUnlinkedGangTakesLinkedChipsWhenFree) {
  Topology t = generate_topology(1, 1, 16, 64000, 8, ChipLinks::kRing);
  ClusterState s(t);
  ASSERT_TRUE(s.take(job("used", 3, 1), {{0, 1ull << 0}, {0, 1ull << 1}, {0, 1ull << 3}}).ok());
  const JobSpec four = job("four", 4, 1);
  auto p = place(s, four, 4, {});
  ASSERT_TRUE(p);
  std::uint64_t mask = 0;
  for (const RankSlot& r : p->ranks) mask |= r.accels;
  EXPECT_EQ(mask, 0b11110000ull) << "the free arc 4-7, not the lowest free chips 2,4,5,6";
  EXPECT_LT(slowdown(t, four, *p), 1.0 + 1e-9);
  // Without a free arc of 4 it still starts, on any chips.
  ASSERT_TRUE(s.take(job("mid", 1, 1), {{0, 1ull << 5}}).ok());
  p = place(s, four, 4, {});
  ASSERT_TRUE(p);
  // As a scheduler that knows only chip counts does: the lowest free chips.
  s.give(job("mid", 1, 1), {{0, 1ull << 5}});
  PlaceOptions counts_only;
  counts_only.adjacency = false;
  p = place(s, four, 4, counts_only);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->ranks[0].accels | p->ranks[1].accels | p->ranks[2].accels | p->ranks[3].accels,
            0b01110100ull);
}

// A lone chip comes from the shortest free arc, so the long arc a ring
// job needs stays whole; a scheduler that counts chips takes the lowest.
TEST(Placer, ALoneChipKeepsTheLongestArcWhole) {
  Topology t = generate_topology(1, 1, 16, 64000, 8, ChipLinks::kRing);
  ClusterState s(t);
  // Chips 2 and 5 in use: free arcs 3-4 (two) and 6-7-0-1 (four).
  ASSERT_TRUE(s.take(job("used", 2, 1), {{0, 1ull << 2}, {0, 1ull << 5}}).ok());
  const JobSpec one = job("one", 1, 1);
  auto p = place(s, one, 1, {});
  ASSERT_TRUE(p);
  EXPECT_EQ(p->ranks[0].accels, 1ull << 3) << "the start of the arc of two";
  ASSERT_TRUE(s.take(one, p->ranks).ok());
  const JobSpec ring = job("ring", 4, 1, LinkNeed::kRing);
  auto r = place(s, ring, 4, {});
  ASSERT_TRUE(r) << "the arc of four was kept";
  EXPECT_TRUE(adjacent(t, ring, *r));
  PlaceOptions counts_only;
  counts_only.adjacency = false;
  ClusterState c(t);
  ASSERT_TRUE(c.take(job("used", 2, 1), {{0, 1ull << 2}, {0, 1ull << 5}}).ok());
  EXPECT_EQ(place(c, one, 1, counts_only)->ranks[0].accels, 1ull);
}

// An elastic gang placed with fewer ranks than it asked for also gets a
// free arc of that many chips when there is one.
TEST(Placer, FewerRanksOfAnUnlinkedGangStillTakeAnArc) {
  Topology t = generate_topology(1, 1, 16, 64000, 8, ChipLinks::kRing);
  ClusterState s(t);
  ASSERT_TRUE(s.take(job("used", 2, 1), {{0, 1ull << 0}, {0, 1ull << 3}}).ok());
  JobSpec e = job("elastic", 8, 1);
  e.kind = JobKind::kElastic;
  e.min_ranks = 2;
  auto p = place(s, e, 4, {});
  ASSERT_TRUE(p);
  std::uint64_t mask = 0;
  for (const RankSlot& r : p->ranks) mask |= r.accels;
  EXPECT_EQ(mask, 0b11110000ull) << "the free arc 4-7, not the lowest chips 1,2,4,5";
}

TEST(Placer, BestFitKeepsWholeNodesFree) {
  Topology t = generate_topology(4, 4, 16, 64000, 8, ChipLinks::kNone);
  ClusterState best(t), first(t);
  std::mt19937 rng(7);
  // Many small jobs: best fit fills partly used nodes first.
  for (int i = 0; i < 12; ++i) {
    JobSpec j = job("s" + std::to_string(i), 1 + static_cast<int>(rng() % 2), 1);
    auto pb = place(best, j, j.ranks, {true, true});
    ASSERT_TRUE(pb);
    ASSERT_TRUE(best.take(j, pb->ranks).ok());
    auto pf = place(first, j, j.ranks, {false, true});
    ASSERT_TRUE(pf);
    ASSERT_TRUE(first.take(j, pf->ranks).ok());
  }
  EXPECT_LE(best.fragmentation(), first.fragmentation());
  int idle = 0;
  for (int n = 0; n < 4; ++n) idle += best.idle(n);
  EXPECT_GE(idle, 1) << "best fit left no node idle";
}

TEST(Placer, NeverPartNeverOvercommittedAlwaysAdjacent) {
  std::mt19937_64 rng(2026);
  int placed = 0, refused = 0, rings = 0;
  for (int cluster = 0; cluster < 20; ++cluster) {
    int nodes = 2 + static_cast<int>(rng() % 12), chips = 1 << (rng() % 4);
    Topology t = generate_topology(nodes, 1 + static_cast<int>(rng() % 4), 8, 32000, chips,
                                   ChipLinks::kRing);
    ClusterState s(t);
    std::vector<std::pair<JobSpec, Placement>> live;
    for (int step = 0; step < 200; ++step) {
      if (!live.empty() && rng() % 3 == 0) {  // a job ends
        std::size_t k = rng() % live.size();
        s.give(live[k].first, live[k].second.ranks);
        live.erase(live.begin() + static_cast<long>(k));
        continue;
      }
      int ranks = 1 << (rng() % 5);
      JobSpec j = job("j" + std::to_string(step), ranks, 1,
                      rng() % 3 == 0 ? LinkNeed::kRing : LinkNeed::kNone);
      j.cpus_per_rank = 1 + static_cast<int>(rng() % 2);
      j.mem_mb_per_rank = 1000 * static_cast<std::int64_t>(rng() % 4);
      if (rng() % 5 == 0) {
        j.kind = JobKind::kPs;
        j.links = LinkNeed::kNone;
        j.servers = 1;
        j.min_ranks = ranks;
      }
      auto p = place(s, j, ranks, {rng() % 2 == 0, true});
      if (!p) {
        ++refused;
        continue;
      }
      expect_valid(s, j, *p, ranks);
      ASSERT_TRUE(s.take(j, p->ranks).ok());
      if (j.links == LinkNeed::kRing) {
        ++rings;
        EXPECT_TRUE(adjacent(t, j, *p)) << j.name << " on cluster " << cluster;
      }
      EXPECT_GE(slowdown(t, j, *p), 1.0);
      live.push_back({j, *p});
      ++placed;
    }
    // The totals agree with the nodes after all of it.
    int free_chips = 0;
    for (int n = 0; n < nodes; ++n) free_chips += std::popcount(s.free_accels(n));
    EXPECT_EQ(free_chips, s.free_accels_total());
  }
  EXPECT_GT(placed, 500);
  EXPECT_GT(refused, 50);
  EXPECT_GT(rings, 50);
}

// Why a job does not fit, counted per node (each under its first
// reason), and the verdict the CLI and the engines share: now, not now,
// never.
TEST(Placer, SaysWhyAJobDoesNotFit) {
  Topology t = generate_topology(4, 2, 4, 8000, 4, ChipLinks::kRing);
  ClusterState s(t);
  s.set_up(0, false);
  JobSpec hog = job("hog", 1, 0);
  hog.cpus_per_rank = 4;
  ASSERT_TRUE(s.take(hog, {{1, 0}}).ok());
  ASSERT_TRUE(s.take(job("three", 1, 3), {{2, 0b0111}}).ok());
  Fit now = fit(s, job("two", 2, 2));
  EXPECT_TRUE(now.p.has_value());  // node 3 holds both
  Fit later = fit(s, job("three", 3, 2));
  EXPECT_FALSE(later.p);
  EXPECT_TRUE(later.ever);
  EXPECT_EQ(later.why,
            "1/4 nodes can take a rank: 1 down, 1 too few free CPUs (needs 1), 1 too few free "
            "GPUs (needs 2); room for 2 of 3 ranks");
  // 12 linked chips: 3 whole nodes of one switch, and the switches hold 2.
  Fit never = fit(s, job("ring", 3, 4, LinkNeed::kRing));
  EXPECT_FALSE(never.ever);
  EXPECT_EQ(never.why,
            "4/4 nodes can take a rank; room for all 3 ranks, but not as a ring: 12 linked chips "
            "in one node, or whole nodes of one switch");
}

TEST(Placer, TakeRefusesWhatIsNotFree) {
  Topology t = generate_topology(2, 2, 4, 8000, 4, ChipLinks::kRing);
  ClusterState s(t);
  JobSpec j = job("j", 2, 1);
  ASSERT_TRUE(s.take(j, {{0, 1}, {0, 2}}).ok());
  Status twice = s.take(j, {{0, 1}, {1, 1}});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.message().find("node `n1` cannot hold its ranks"), std::string::npos)
      << twice.message();
  EXPECT_EQ(std::popcount(s.free_accels(1)), 4);  // the refused take changed nothing
  s.set_up(1, false);
  EXPECT_FALSE(place(s, job("k", 4, 1), 4, {}));
  EXPECT_FALSE(s.take(j, {{1, 1}}).ok());
}

TEST(Placer, CostPricesHops) {
  Topology t = generate_topology(4, 2, 16, 64000, 8, ChipLinks::kRing);
  JobSpec j = job("c", 4, 1, LinkNeed::kRing);
  Placement arc{{{0, 1}, {0, 2}, {0, 4}, {0, 8}}};
  Placement scattered{{{0, 1}, {0, 4}, {0, 16}, {0, 64}}};
  Placement two_leaves{{{0, 1}, {0, 2}, {2, 1}, {2, 2}}};
  EXPECT_TRUE(adjacent(t, j, arc));
  EXPECT_FALSE(adjacent(t, j, scattered));
  double a = allreduce_seconds(t, j, arc), b = allreduce_seconds(t, j, scattered),
         c = allreduce_seconds(t, j, two_leaves);
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_DOUBLE_EQ(a, ideal_allreduce_seconds(t, j, 4));
  EXPECT_DOUBLE_EQ(slowdown(t, j, arc), 1.0);
  // 2(k−1) steps, each α + (S/k)·β over a chip link.
  EXPECT_NEAR(a, 6 * (t.costs.chip.alpha + 100e6 / 4 * t.costs.chip.beta), 1e-12);
}

}  // namespace
}  // namespace shoal::cluster
