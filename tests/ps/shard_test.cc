// The parameter server's shard rules, against hand-computed results: sync
// rounds of distinct live workers equal one averaged step, duplicates and
// second pushes are refused, a leaving worker releases its rounds, async
// and bounded staleness, the training optimizer's kernels on the server,
// and snapshots that lose and double nothing.
#include "shoal/ps/shard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "temp_dir.h"

namespace shoal::ps {
namespace {

Tensor vec(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())});
}
std::vector<float> values(const Shard& s, const std::string& key) {
  auto p = s.pull(key);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  std::vector<float> out;
  for (std::int64_t i = 0; i < p->second.numel(); ++i) out.push_back(p->second.data<float>()[i]);
  return out;
}
std::unique_ptr<Shard> shard(Mode mode, const std::string& opt = "sgd", double lr = 0.5) {
  ShardOptions o;
  o.mode = mode;
  o.optimizer.name = opt;
  o.lr = lr;
  auto s = Shard::create(o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(s).value();
}
bool has(const Status& st, const std::string& s) {
  return st.message().find(s) != std::string::npos;
}

// Five elements over three workers: the round closes on the third distinct
// worker and applies the mean, w - lr * mean(g).
TEST(Shard, ASyncRoundIsOneStepOnTheMeanGradient) {
  auto s = shard(Mode::kSync);
  ASSERT_TRUE(s->init("w", vec({1, 2, 3, 4, 5})).ok());
  for (int w : {0, 1, 2}) ASSERT_TRUE(s->add_worker(w).ok());
  const std::vector<std::vector<float>> g = {{1, 0, 0, 3, 6}, {2, 0, 3, 0, 6}, {3, 3, 0, 0, 6}};
  for (int w = 0; w < 3; ++w) {
    auto r = s->push(w, "w", 0, 1, vec(g[static_cast<std::size_t>(w)]));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, w < 2 ? PushResult::kCollected : PushResult::kClosed);
  }
  const std::vector<float> want = {1 - 0.5f * 2, 2 - 0.5f * 1, 3 - 0.5f * 1, 4 - 0.5f * 1,
                                   5 - 0.5f * 6};
  EXPECT_EQ(values(*s, "w"), want);
  EXPECT_EQ(s->pull("w")->first, 1u);
  EXPECT_EQ(s->stats().rounds, 1u);
}

// A round counts distinct workers, never requests: a second push from one
// worker is refused by name, a retried one (same sequence number) is
// recognized and not counted, and neither closes the round.
TEST(Shard, RoundsCountDistinctWorkersNotRequests) {
  auto s = shard(Mode::kSync);
  ASSERT_TRUE(s->init("w", vec({0, 0, 0})).ok());
  for (int w : {0, 1}) ASSERT_TRUE(s->add_worker(w).ok());
  ASSERT_EQ(*s->push(0, "w", 0, 1, vec({2, 2, 2})), PushResult::kCollected);
  auto again = s->push(0, "w", 0, 2, vec({2, 2, 2}));
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(has(again.status(), "worker 0 already pushed key 'w' for step 0"))
      << again.status().to_string();
  auto retry = s->push(0, "w", 0, 1, vec({2, 2, 2}));
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(*retry, PushResult::kDuplicate);
  EXPECT_EQ(s->pull("w")->first, 0u) << "the round must still wait for worker 1";
  ASSERT_EQ(*s->push(1, "w", 0, 1, vec({4, 4, 4})), PushResult::kClosed);
  EXPECT_EQ(values(*s, "w"), (std::vector<float>{-1.5f, -1.5f, -1.5f}));
  EXPECT_EQ(s->stats().duplicates, 1u);
  EXPECT_EQ(s->stats().pushes, 2u);
}

// Uneven data: worker 2 runs out after step 0 and leaves. The round it
// never pushed to closes with the others' mean, and later rounds need only
// the workers still there: no hang at the last epoch.
TEST(Shard, AWorkerThatLeavesReleasesItsRounds) {
  auto s = shard(Mode::kSync, "sgd", 1.0);
  ASSERT_TRUE(s->init("b", vec({10})).ok());
  for (int w : {0, 1, 2}) ASSERT_TRUE(s->add_worker(w).ok());
  std::uint64_t seq = 0;
  for (int w : {0, 1, 2}) ASSERT_TRUE(s->push(w, "b", 0, ++seq, vec({1})).ok());
  EXPECT_EQ(values(*s, "b"), std::vector<float>{9});
  ASSERT_EQ(*s->push(0, "b", 1, ++seq, vec({2})), PushResult::kCollected);
  ASSERT_EQ(*s->push(1, "b", 1, ++seq, vec({4})), PushResult::kCollected);
  ASSERT_TRUE(s->remove_worker(2).ok());  // closes step 1 on workers 0 and 1
  EXPECT_EQ(values(*s, "b"), std::vector<float>{6});
  ASSERT_EQ(*s->push(0, "b", 2, ++seq, vec({1})), PushResult::kCollected);
  ASSERT_EQ(*s->push(1, "b", 2, ++seq, vec({1})), PushResult::kClosed);
  EXPECT_EQ(values(*s, "b"), std::vector<float>{5});
  EXPECT_FALSE(s->remove_worker(2).ok());
}

TEST(Shard, AsyncAppliesEachPushAndBoundedHoldsBackTheFastest) {
  auto a = shard(Mode::kAsync, "sgd", 1.0);
  ASSERT_TRUE(a->init("w", vec({0})).ok());
  for (int w : {0, 1}) ASSERT_TRUE(a->add_worker(w).ok());
  EXPECT_EQ(*a->push(0, "w", 0, 1, vec({1})), PushResult::kApplied);
  EXPECT_EQ(*a->push(0, "w", 1, 2, vec({1})), PushResult::kApplied);
  EXPECT_EQ(values(*a, "w"), std::vector<float>{-2});

  ShardOptions o;
  o.mode = Mode::kBounded;
  o.staleness = 1;
  o.lr = 1.0;
  auto b = std::move(Shard::create(o)).value();
  ASSERT_TRUE(b->init("w", vec({0})).ok());
  for (int w : {0, 1}) ASSERT_TRUE(b->add_worker(w).ok());
  EXPECT_EQ(*b->push(0, "w", 1, 1, vec({1})), PushResult::kApplied);  // 1 ahead: allowed
  EXPECT_EQ(*b->push(0, "w", 2, 2, vec({1})), PushResult::kWait);     // 2 ahead: wait
  EXPECT_EQ(b->lag(1), 1);
  EXPECT_EQ(*b->push(1, "w", 1, 1, vec({1})), PushResult::kApplied);
  EXPECT_EQ(*b->push(0, "w", 2, 2, vec({1})), PushResult::kApplied);  // the retry now passes
  EXPECT_EQ(values(*b, "w"), std::vector<float>{-3});
}

// Staleness-aware rates (async): a push counts the updates the key took
// since its worker was sent the value; with stale_lr its rate is divided by
// that count (one update in between keeps the full rate). The counts are
// kept either way; the option is part of the job's options.
TEST(Shard, StaleLrDividesAPushsRateByItsStaleness) {
  for (bool on : {false, true}) {
    SCOPED_TRACE(on ? "stale_lr" : "plain");
    ShardOptions o;
    o.mode = Mode::kAsync;
    o.lr = 1.0;
    o.stale_lr = on;
    auto s = std::move(Shard::create(o)).value();
    ASSERT_TRUE(s->init("w", vec({0})).ok());
    for (int w : {0, 1}) ASSERT_TRUE(s->add_worker(w).ok());
    s->sent(0, "w", 0);  // worker 0 computes from version 0
    // Worker 1 (never sent a value: unknown, full rate) pushes three times.
    for (int i = 0; i < 3; ++i)
      ASSERT_EQ(*s->push(1, "w", i, i + 1, vec({1})), PushResult::kApplied);
    // Worker 0's gradient is 3 updates old: 6 * 1/3 under stale_lr.
    ASSERT_EQ(*s->push(0, "w", 0, 1, vec({6})), PushResult::kApplied);
    EXPECT_EQ(values(*s, "w"), std::vector<float>{on ? -5.f : -9.f});
    s->sent(0, "w", 4);
    ASSERT_EQ(*s->push(1, "w", 3, 4, vec({1})), PushResult::kApplied);
    ASSERT_EQ(*s->push(0, "w", 1, 2, vec({2})), PushResult::kApplied);  // 1 update old: full rate
    EXPECT_EQ(values(*s, "w"), std::vector<float>{on ? -8.f : -12.f});
    EXPECT_EQ(s->stats().staleness_pushes, 2u);
    EXPECT_EQ(s->stats().staleness_sum, 4u);
  }
  ShardOptions a, b;
  b.stale_lr = true;
  EXPECT_EQ(config_diff(a, b), "stale_lr: the server has 0, the worker asks for 1");
  auto back = parse_config(config_text(b));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(back->stale_lr);
  std::string bad = config_text(b);
  bad.replace(bad.find("stale_lr=1"), 10, "stale_lr=2");
  EXPECT_TRUE(has(parse_config(bad).status(), "field 'stale_lr' is '2', not 0 or 1"));
}

// The server's optimizer is the training kernel: Adam's first step moves
// every element by lr against its gradient's sign (bias-corrected m/sqrt(v)).
TEST(Shard, TheOptimizerIsTheTrainingKernel) {
  auto s = shard(Mode::kAsync, "adam", 0.01);
  ASSERT_TRUE(s->init("w", vec({1, 1, 1, 1})).ok());
  ASSERT_TRUE(s->add_worker(0).ok());
  ASSERT_EQ(*s->push(0, "w", 0, 1, vec({0.3f, -2, 5, -0.01f})), PushResult::kApplied);
  const auto v = values(*s, "w");
  const float want[] = {0.99f, 1.01f, 0.99f, 1.01f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(v[static_cast<std::size_t>(i)], want[i], 1e-4) << i;
}

TEST(Shard, BadPushesAreRefusedByName) {
  auto s = shard(Mode::kSync);
  ASSERT_TRUE(s->init("w", vec({0, 0})).ok());
  ASSERT_TRUE(s->add_worker(0).ok());
  EXPECT_TRUE(has(s->push(7, "w", 0, 1, vec({1, 1})).status(), "worker 7, which is not a member"));
  EXPECT_TRUE(has(s->push(0, "v", 0, 1, vec({1, 1})).status(), "key 'v', which this server"));
  EXPECT_TRUE(
      has(s->push(0, "w", 0, 1, vec({1, 1, 1})).status(), "as f32 [3]; the key is f32 [2]"));
  EXPECT_TRUE(has(s->push(0, "w", 3, 1, vec({1, 1})).status(), "the open round is step 0"));
  EXPECT_TRUE(has(s->init("w", vec({1, 2, 3})), "is [2] on this server, initialized again as [3]"));
  EXPECT_EQ(s->stats().pushes, 0u);
}

// A server killed mid-round restarts from its snapshot: the worker that had
// pushed retries its push (same sequence number), which is recognized; the
// round closes once, and the values equal those of a server never stopped.
TEST(Shard, ARestoredServerLosesNothingAndAppliesNothingTwice) {
  shoal::testing::TempDir dir("ps");
  const std::string snap = dir.path() + "/shard.safetensors";
  auto run = [&](bool restart) {
    auto s = shard(Mode::kSync, "momentum", 0.1);
    EXPECT_TRUE(s->init("w", vec({1, 2, 3})).ok());
    for (int w : {0, 1}) EXPECT_TRUE(s->add_worker(w).ok());
    EXPECT_TRUE(s->push(0, "w", 0, 1, vec({1, 1, 1})).ok());
    EXPECT_TRUE(s->push(1, "w", 0, 1, vec({3, 3, 3})).ok());
    EXPECT_TRUE(s->push(0, "w", 1, 2, vec({2, 0, 2})).ok());  // round 1: one of two
    if (restart) {
      EXPECT_TRUE(s->snapshot(snap).ok());
      s = shard(Mode::kSync, "momentum", 0.1);  // the restarted server
      EXPECT_TRUE(s->init("w", vec({0, 0, 0})).ok());
      Status st = s->restore(snap);
      EXPECT_TRUE(st.ok()) << st.to_string();
      auto again = s->push(0, "w", 1, 2, vec({2, 0, 2}));  // the worker's retry
      EXPECT_TRUE(again.ok() && *again == PushResult::kDuplicate);
    }
    EXPECT_EQ(*s->push(1, "w", 1, 2, vec({0, 2, 0})), PushResult::kClosed);
    EXPECT_EQ(s->pull("w")->first, 2u);
    return values(*s, "w");
  };
  const auto straight = run(false);
  EXPECT_EQ(run(true), straight);
  // Another server's configuration is refused by name.
  auto other = shard(Mode::kAsync);
  ASSERT_TRUE(other->init("w", vec({0, 0, 0})).ok());
  EXPECT_TRUE(has(other->restore(snap), "a snapshot of a sync server with optimizer 'momentum'"));
}

}  // namespace
}  // namespace shoal::ps
