// dist/plan.h's groups: which the layouts communicate in, how each is
// formed, and what the plan prices of their collectives (all-reduces
// between the sizes measured, links between hosts, the reduce-scatter and
// all-gather pair where it was measured).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "dist/plan_internal.h"
#include "plan_fixture.h"
#include "ranks.h"

namespace shoal::dist {
namespace {

using fixture::calibration;
using fixture::request;

TEST(Plan, TheGroupsAreThoseTheLayoutsCommunicateIn) {
  // 4 ranks, r = g*P*T + s*T + t: tensor groups T apart from 1, pipeline
  // neighbours T apart, data-parallel groups P*T apart.
  // Pipelines of 2 (dp 2) and of 4 stages, and of 2 stages of 2 tensor ranks.
  EXPECT_EQ(job_groups(request(4, 64)),
            (std::vector<Group>{
                {2, 1}, {2, 1, 0, 2}, {2, 1, 0, 4}, {2, 1, 1, 4}, {2, 2}, {2, 2, 0, 4}, {4, 1}}));
  // 2x2x2 on 8 ranks adds pipeline pairs 2 apart and data pairs 4 apart.
  const auto g8 = job_groups(request(8, 64));
  for (const Group g : {Group{2, 2, 0, 4}, Group{2, 4}, Group{4, 2}, Group{8, 1}, Group{2, 1}})
    EXPECT_NE(std::find(g8.begin(), g8.end(), g), g8.end()) << g.size << "/" << g.stride;
}

TEST(Plan, EachGroupIsFormedAsItsLayoutFormsIt) {
  auto colors = [](Group g, int world) {
    std::vector<int> c;
    for (int r = 0; r < world; ++r) c.push_back(group_color(g, r, world));
    return c;
  };
  // Tensor pairs, data-parallel pairs 2 apart, one group of all.
  EXPECT_EQ(colors({2, 1}, 4), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(colors({2, 2}, 4), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(colors({4, 1}, 4), (std::vector<int>{0, 0, 0, 0}));
  // Two pipelines of 4 stages: stages (0, 1), (2, 3), then (1, 2), the
  // first and last stage sitting out (no hop from stage 3 to the next
  // pipeline's 0).
  EXPECT_EQ(colors({2, 1, 0, 4}, 8), (std::vector<int>{0, 0, 1, 1, 4, 4, 5, 5}));
  EXPECT_EQ(colors({2, 1, 1, 4}, 8), (std::vector<int>{-1, 0, 0, -1, -1, 4, 4, -1}));
  // Stages of 2 tensor ranks: a stage's rank t talks to the next's t.
  EXPECT_EQ(colors({2, 2, 0, 4}, 4), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(colors({2, 2, 1, 6}, 6), (std::vector<int>{-1, -1, 0, 1, 0, 1}));
}

// 4 ranks on 2 hosts (0, 1 on one, 2, 3 on the other): the groups that
// cross hosts (data-parallel pairs 2 apart, groups of 4) run at 1 Gbit/s,
// pairs within a host at memory speed. The gradients' all-reduce then costs
// more than the compute, and the plan keeps it off the slow links: no
// data-parallel group, a pipeline (only activations cross).
TEST(Plan, ALinkBetweenHostsMovesTheGradientsOffIt) {
  const PlanRequest r = request(4, 64);
  Calibration fast = calibration(4, 64);
  const Candidate one_host = plan_layouts(r, fast).front();
  EXPECT_GT(one_host.dp, 1) << one_host.flags();
  Calibration two = fast;
  two.hosts = 2;
  for (auto& [g, f] : two.allreduce)
    if (g.size * g.stride + g.shift * g.stride > 2) f = {50e-6, 8e-9, {}};  // crosses the hosts
  const Candidate across = plan_layouts(r, two).front();
  EXPECT_EQ(across.dp, 1) << across.flags();
  EXPECT_LT(across.comm_s, predict(r, two, one_host.layout, one_host.zero).comm_s);
}

// Measured sizes price the sizes between them along their own segment: an
// algorithm that changes at 64 KiB is not averaged into one line.
TEST(Plan, AllReducesAreInterpolatedBetweenTheSizesMeasured) {
  LinkFit f{1e-6, 1e-9, {{4096, 20e-6}, {65536, 40e-6}, {1 << 20, 1e-3}}};
  EXPECT_NEAR(f.time(4096), 20e-6, 1e-12);
  EXPECT_NEAR(f.time(65536), 40e-6, 1e-12);
  EXPECT_NEAR(f.time((65536 + (1 << 20)) / 2.0), (40e-6 + 1e-3) / 2, 1e-9);
  EXPECT_GT(f.time(2 << 20), 1e-3);  // beyond: along the last segment
  EXPECT_GT(f.time(1024), 0);        // below: never free
  EXPECT_LE(f.time(1024), 20e-6);
  EXPECT_NEAR(LinkFit({1e-6, 1e-9, {}}).time(1000), 2e-6, 1e-12);  // no points: alpha-beta
}

// ZeRO reduce-scatters and all-gathers in its data-parallel groups, as
// sequence parallelism does in its tensor groups: those are the groups
// whose pair the calibration measures.
TEST(Plan, TheShardingGroupsAreThoseThatReduceScatter) {
  // tp 2 and 4 with sequence parallelism; ZeRO over dp 2 (pairs 2 apart)
  // and dp 4.
  EXPECT_EQ(job_shard_groups(request(4, 64)), (std::vector<Group>{{2, 1}, {2, 2}, {4, 1}}));
  EXPECT_EQ(job_shard_groups(request(1, 64)), (std::vector<Group>{}));
}

// Where the pair was measured the plan prices it, not the all-reduce: a
// ring across hosts costs more than the all-reduce the communicator picks.
TEST(Plan, ShardingPricesTheMeasuredPair) {
  const PlanRequest r = request(4, 64);
  Calibration c = calibration(4, 64);
  c.overlap = false;
  Layout dp;
  Layout sp;
  sp.tp = 2;
  sp.sequence_parallel = true;
  Layout tp = sp;
  tp.sequence_parallel = false;
  const Candidate z0 = predict(r, c, dp, 0), z1 = predict(r, c, dp, 1), s = predict(r, c, sp, 0),
                  t = predict(r, c, tp, 0);
  Calibration measured = c;
  const LinkFit pair{40e-6, 0.9e-9, {}};  // three times the all-reduce's bytes' cost
  measured.shard[{4, 1}] = pair;
  measured.shard[{2, 1}] = pair;
  const double grads = 8'000'000;
  const LinkFit& ar = c.allreduce.at({4, 1});
  // ZeRO-1 over 4: the pair's time in place of the all-reduce and the
  // second collective's latency.
  EXPECT_NEAR(predict(r, measured, dp, 1).shard_s - z1.shard_s,
              pair.time(grads) - ar.time(grads) - ar.time(1), 1e-12);
  EXPECT_EQ(predict(r, measured, dp, 0).allreduce_s, z0.allreduce_s);
  // Sequence parallelism's reduce-scatters and all-gathers cost more; tensor
  // parallelism's all-reduces do not move.
  EXPECT_GT(predict(r, measured, sp, 0).allreduce_s, s.allreduce_s);
  EXPECT_EQ(predict(r, measured, tp, 0).allreduce_s, t.allreduce_s);
  // The fits round-trip; a calibration without them prices as before.
  auto back = parse_calibration(calibration_json(measured));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->shard.size(), 2u);
  EXPECT_EQ(calibration_json(*back), calibration_json(measured));
  auto old = parse_calibration(calibration_json(c));
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  EXPECT_TRUE(old->shard.empty());
  EXPECT_EQ(predict(r, *old, dp, 1).shard_s, z1.shard_s);
}

// A size that ran slower per byte than the one before is measured again,
// the faster run kept: here 1 ms per MiB, but the first timing of 4 MiB
// (its warm-ups, probe and runs: 6 calls at 20 ms) five times that.
TEST(Plan, ALinkSizeDisturbedAgainstTheOneBeforeIsMeasuredAgain) {
  auto fits = testing::run_on_ranks<LinkFit>(2, "plan", [](int, comm::Communicator& c) {
    int disturbed = 6;
    return fit_sizes(c, [&](std::size_t n) {
      double ms = static_cast<double>(n) * 4.0 / (1 << 20);
      if (n == (std::size_t{4} << 20) / 4 && disturbed-- > 0) ms *= 5;
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
      return ok_status();
    });
  });
  for (const auto& f : fits) {
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    ASSERT_EQ(f->points.size(), 4u);
    EXPECT_EQ(f->points.back().first, 4 << 20);
    EXPECT_GT(f->points.back().second, 3.9e-3);
    EXPECT_LT(f->points.back().second, 8e-3) << "the disturbed run was kept";
  }
}

}  // namespace
}  // namespace shoal::dist
