// `shoal run --elastic MIN`: data parallelism that survives its ranks
// without a restart (dist/elastic.h, launch/elastic_coordinator.h), through
// the real launcher and `shoal train`. A rank killed or frozen mid-training
// leaves; the others go on in-process from the state they kept in memory,
// on the same global batch, and end where a job that changed its
// membership on purpose (a checkpoint, then a resume on fewer ranks) ends.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_results.h"
#include "cli/local_slurm.h"
#include "cli/run_shoal.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::run_sh;
using testing::run_shoal;

bool has(const std::string& out, const std::string& s) { return out.find(s) != std::string::npos; }

// 250 steps an epoch of a global batch of 48 (12 x 4 ranks, 16 x 3);
// the tests give --epochs.
const char* kTrain =
    "train --model mlp --limit-train 12000 --limit-test 256 --threads 1 --no-plot --quiet "
    "--optimizer momentum --lr 0.05";

// `shoal train` under `sh`, in which rank id `victim` (shoal run's
// SHOAL_ELASTIC_ID, or srun's task) sends itself `sig` once the run has
// logged its first training record (step 25); bounded: 30 s.
std::string with_fault(const std::string& out, int victim, const char* sig,
                       const std::string& flags, const char* train = kTrain) {
  return fmt::format(
      "sh -c 'if [ ${{SHOAL_ELASTIC_ID:-$SLURM_PROCID}} = {2} ]; then (i=0; while [ $i -lt 3000 ] "
      "&& ! grep -q "
      "\"kind\\\":\\\"train\" {0}/metrics.jsonl 2>/dev/null; do sleep 0.01; i=$((i+1)); done; "
      "kill -{3} $$) & fi; exec {1} {4} {5} --out {0}'",
      out, SHOAL_BINARY, victim, sig, train, flags);
}

// Where the state is copied (sharded or with running statistics), a copy
// every 4 steps, so that one exists before the fault (the first train
// record, at step 25): by default the cadence follows the copy's cost
// against the step's, and on a loaded host the first copy came after the
// fault, the survivors went on from step 0, and the replay with
// --max-steps 0 compared nothing (seen after a netns test's teardown).
// Plain data parallelism keeps no copy (its live tensors are the state).
const char* kCommitEvery = "SHOAL_ELASTIC_COMMIT_EVERY=4 ";

// Every survivor of a fault without copies trained again only the step in
// flight: its log line says so, and none says more.
void expect_only_the_step_in_flight_again(const std::string& out) {
  EXPECT_TRUE(has(out, "(1 step trained again)")) << out;
  EXPECT_FALSE(has(out, "steps trained again")) << out;
}

// The membership records of a run's metrics.jsonl.
std::vector<nlohmann::json> memberships(const std::string& dir) {
  std::ifstream f(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> v;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("kind", "") == "membership") v.push_back(j);
  }
  return v;
}

// The newest checkpoints of two runs are at `step` and hold the same
// weights and optimizer state (every slot of every parameter) within 1e-5.
void expect_same_end(const std::string& a_dir, const std::string& b_dir, const char* step) {
  auto x = testing::last_checkpoint(a_dir), y = testing::last_checkpoint(b_dir);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->metadata.at("step"), step);
  EXPECT_EQ(y->metadata.at("step"), step);
  int np = 0, ns = 0;
  EXPECT_LE(testing::max_abs_diff(*x, *y, "param/", &np), 1e-5);
  EXPECT_LE(testing::max_abs_diff(*x, *y, "opt/", &ns), 1e-5);
  EXPECT_GT(np, 0);
  EXPECT_EQ(ns % np, 0);  // each parameter's every slot (momentum: one, Adam: two)
  EXPECT_GE(ns, np);
}

// One leg of a job run on purpose into `ref`: `ranks` ranks of `shoal
// train <train> <share>` to step `until` (0: to the end).
struct Leg {
  int ranks;
  std::string share;  // "--batch 12", "--global-batch 64"
  std::int64_t until;
};

// The legs one after another, each but the first resuming the checkpoint
// the one before wrote: the membership changes an elastic job made, made
// on purpose.
void run_on_purpose(const std::string& env, const std::string& train, const std::string& ref,
                    const std::vector<Leg>& legs) {
  for (std::size_t i = 0; i < legs.size(); ++i) {
    auto a = run_sh(fmt::format("{}{} run -n {} -- {} {} {} --max-steps {}{} --out {}", env,
                                SHOAL_BINARY, legs[i].ranks, SHOAL_BINARY, train, legs[i].share,
                                legs[i].until, i > 0 ? " --resume" : "", ref));
    ASSERT_EQ(a.code, 0) << a.out;
  }
}

// Rank 2 of 4 is killed near step 25: the three others go on from the
// step they hold and end with the weights and momentum of a job that ran
// 4 ranks to that step, wrote a checkpoint, and resumed on 3 (--batch 16:
// the same global batch). No checkpoint is read by the elastic job.
TEST(Elastic, AKilledRankLeavesAndTheRestEndAsAJobThatShrankOnPurpose) {
  const std::string dir = testing::scratch_dir("elastic_kill");
  const std::string env = "SHOAL_DETERMINISTIC=1 ";
  auto r = run_sh(env + SHOAL_BINARY + " run -n 4 --elastic 2 --timeout 300 -- " +
                  with_fault(dir + "/elastic", 2, "KILL", "--batch 12 --epochs 2"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "generation 1: 3 ranks go on from step ")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 2 was killed by signal 9")) << r.out;
  EXPECT_TRUE(has(r.out, "the job ended on 3 ranks (it started on 4; generation 1)")) << r.out;
  EXPECT_FALSE(has(r.out, "resumed from " + dir)) << r.out;  // no file was read
  expect_only_the_step_in_flight_again(r.out);
  auto m = memberships(dir + "/elastic");
  ASSERT_EQ(m.size(), 1u) << r.out;
  // In rank order: the holder of the newest step first (any of the three).
  std::vector<int> members = m[0]["members"];
  std::sort(members.begin(), members.end());
  EXPECT_EQ(members, std::vector<int>({0, 1, 3}));
  EXPECT_EQ(m[0]["left"], std::vector<int>({2}));  // who left and joined, by id
  EXPECT_EQ(m[0]["joined"], std::vector<int>());
  const std::int64_t step = m[0]["step"];
  ASSERT_GT(step, 0);
  ASSERT_LT(step, 500);

  const std::string ref = dir + "/ref";
  run_on_purpose(env, std::string(kTrain) + " --epochs 2", ref,
                 {{4, "--batch 12", step}, {3, "--batch 16", 0}});
  expect_same_end(dir + "/elastic", ref, "500");
}

// With --max-restarts 1 the launcher starts a replacement for the killed
// rank 2 of 4: it joins at a step boundary (the three regroup), takes the
// state from rank 0's broadcast, and the job ends as one of the same
// layout (`flags`) that ran 4 ranks, then 3, then 4 again on purpose, each
// change a checkpoint and a resume.
// `engine`: shoal run's flags for it ("" for local ranks).
void replaced_rank_ends_as_on_purpose(const std::string& name, const std::string& flags,
                                      const std::string& engine = "") {
  const std::string dir = testing::scratch_dir(name);
  const bool copies = flags.find("--zero") != std::string::npos;
  const std::string env = "SHOAL_DETERMINISTIC=1 " + std::string(copies ? kCommitEvery : "");
  const std::string train = std::string(kTrain) + " --epochs 3" + flags;
  auto r = run_sh(env + SHOAL_BINARY + " run -n 4 " + engine +
                  " --elastic 2 --max-restarts 1 --timeout 300 -- " +
                  with_fault(dir + "/elastic", 2, "KILL", "--batch 12 --epochs 3" + flags));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "started rank 4 to replace a lost rank")) << r.out;
  // srun names the task it lost at once (the lease would take 15 s).
  if (!engine.empty()) {
    EXPECT_TRUE(has(r.out, "rank 2 killed (said srun)")) << r.out;
  }
  EXPECT_TRUE(has(r.out, "joining as rank 3 of 4")) << r.out;
  EXPECT_TRUE(has(r.out, "the job ended on 4 ranks (it started on 4; generation 2)")) << r.out;
  if (!copies) expect_only_the_step_in_flight_again(r.out);
  auto m = memberships(dir + "/elastic");
  ASSERT_EQ(m.size(), 2u) << r.out;
  EXPECT_EQ(m[0]["world"], 3);
  EXPECT_EQ(m[1]["world"], 4);
  EXPECT_EQ(m[1]["members"].back(), 4);  // the newcomer last: rank 0 holds the state
  EXPECT_EQ(m[1]["joined"], std::vector<int>({4}));
  EXPECT_EQ(m[1]["left"], std::vector<int>());
  const std::int64_t shrink = m[0]["step"], grow = m[1]["step"];
  ASSERT_GT(shrink, 0);
  ASSERT_GE(grow, shrink);
  ASSERT_LT(grow, 750);

  const std::string ref = dir + "/ref";
  run_on_purpose(env, train, ref,
                 {{4, "--batch 12", shrink}, {3, "--batch 16", grow}, {4, "--batch 12", 0}});
  expect_same_end(dir + "/elastic", ref, "750");
}

TEST(Elastic, AReplacementJoinsAtAStepBoundaryAndTakesTheStateFromRankZero) {
  replaced_rank_ends_as_on_purpose("elastic_grow", "");
}

// ZeRO-2: each rank holds a shard of the momentum, and the dead rank's
// shard dies with it. The copy is kept whole (gathered at each commit), so
// each generation cuts its own shards, for 3 ranks and again for 4 (the
// 535818 elements of each slot do not split evenly over 4). Skipping that
// cut (the scatter after the start-up broadcast) ends 0.39 away.
TEST(Elastic, ZeroShardsAreCutAgainAtEveryChangeOfMembership) {
  replaced_rank_ends_as_on_purpose("elastic_zero", " --zero 2");
}

// A global batch of 64 (--batch 16 x 4 ranks) that 3 ranks do not divide:
// after rank 2 is killed the survivors take shares of 22, 21 and 21, each
// gradient weighted by its share, and the job ends as one run on purpose
// with --global-batch 64 on 4 ranks, then on 3. Before, the job was refused.
TEST(Elastic, AGlobalBatchTheSurvivorsDoNotDivideIsSharedUnevenly) {
  const std::string dir = testing::scratch_dir("elastic_uneven");
  const std::string env = "SHOAL_DETERMINISTIC=1 ";
  auto r = run_sh(env + SHOAL_BINARY + " run -n 4 --elastic 2 --timeout 300 -- " +
                  with_fault(dir + "/elastic", 2, "KILL", "--batch 16 --epochs 2"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "generation 1: 3 ranks go on from step ")) << r.out;
  auto m = memberships(dir + "/elastic");
  ASSERT_EQ(m.size(), 1u) << r.out;
  const std::int64_t step = m[0]["step"];
  ASSERT_GT(step, 0);
  const std::string ref = dir + "/ref";
  run_on_purpose(env, std::string(kTrain) + " --epochs 2", ref,
                 {{4, "--global-batch 64", step}, {3, "--global-batch 64", 0}});
  expect_same_end(dir + "/elastic", ref, "374");
}

// Gradient accumulation: each generation splits its share of the global
// batch 48 into 2 micro-batches (12 = 2 x 6 on 4 ranks, 16 = 2 x 8 on 3),
// and the job ends as one run on purpose with those micro-batches.
TEST(Elastic, MicroBatchesSplitEachGenerationsShare) {
  const std::string dir = testing::scratch_dir("elastic_micro");
  const std::string env = "SHOAL_DETERMINISTIC=1 ";
  auto r =
      run_sh(env + SHOAL_BINARY + " run -n 4 --elastic 2 --timeout 300 -- " +
             with_fault(dir + "/elastic", 2, "KILL", "--batch 12 --epochs 2 --micro-batches 2"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = memberships(dir + "/elastic");
  ASSERT_EQ(m.size(), 1u) << r.out;
  const std::int64_t step = m[0]["step"];
  ASSERT_GT(step, 0);
  const std::string ref = dir + "/ref";
  run_on_purpose(env, std::string(kTrain) + " --epochs 2 --micro-batches 2", ref,
                 {{4, "--batch 12", step}, {3, "--batch 16", 0}});
  expect_same_end(dir + "/elastic", ref, "500");
}

// The CNN's batch norms: each rank's running statistics differ, and a
// checkpoint holds their mean. The copy holds the mean too, so the job
// that lost rank 1 (ZeRO-1, Adam) ends with the weights, the moments and
// the running statistics of a checkpoint and a resume on 3 ranks (before,
// the new rank 0's own statistics went on: 1.2e-3 away).
TEST(Elastic, RunningStatisticsAreKeptAsACheckpointKeepsThem) {
  const std::string dir = testing::scratch_dir("elastic_bn");
  const std::string env = "SHOAL_DETERMINISTIC=1 " + std::string(kCommitEvery);
  const char* cnn =
      "train --model cnn --limit-train 2400 --limit-test 256 --threads 1 --no-plot --quiet "
      "--optimizer adam --lr 0.001 --epochs 1 --zero 1";
  auto r = run_sh(env + SHOAL_BINARY + " run -n 4 --elastic 2 --timeout 300 -- " +
                  with_fault(dir + "/elastic", 1, "KILL", "--batch 12", cnn));
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = memberships(dir + "/elastic");
  ASSERT_EQ(m.size(), 1u) << r.out;
  const std::int64_t step = m[0]["step"];
  ASSERT_GT(step, 0) << r.out;
  const std::string ref = dir + "/ref";
  run_on_purpose(env, cnn, ref, {{4, "--batch 12", step}, {3, "--batch 16", 0}});
  expect_same_end(dir + "/elastic", ref, "50");
  auto x = testing::last_checkpoint(dir + "/elastic"), y = testing::last_checkpoint(ref);
  ASSERT_TRUE(x.ok() && y.ok());
  int nb = 0;
  EXPECT_LE(testing::max_abs_diff(*x, *y, "buf/", &nb), 1e-5);
  EXPECT_GT(nb, 0);
}

// A frozen rank (SIGSTOP) is named by the heartbeat, the survivors end the
// step in flight and check in, and the launcher kills the stopped one and
// forms the next generation: the job finishes.
TEST(Elastic, AFrozenRankIsDroppedAndKilledAndTheJobFinishes) {
  const std::string dir = testing::scratch_dir("elastic_freeze");
  auto r = run_sh(fmt::format("SHOAL_HEARTBEAT=2 {} run -n 3 --elastic 2 --timeout 300 -- {}",
                              SHOAL_BINARY, with_fault(dir, 1, "STOP", "--batch 16 --epochs 2")));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "sent no heartbeat")) << r.out;
  EXPECT_TRUE(has(r.out, "ending the step in flight")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1 was stopped (state T) when its peers lost it: killed")) << r.out;
  EXPECT_TRUE(has(r.out, "generation 1: 2 ranks go on")) << r.out;
  auto ck = testing::last_checkpoint(dir);
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ(ck->metadata.at("step"), "500");
}

// Growing beyond -n: `shoal join --job DIR --ranks 2` on a job of 2 ranks
// run with --elastic 1:3 starts one rank (MAX 3) and refuses the other by
// count; the newcomer joins at a step boundary with rank 0's state, and the
// job ends as one that ran 2 ranks to that step, wrote a checkpoint and
// resumed on 3 (the same global batch of 48), within 1e-5.
// 6 epochs (1,500 steps): 2 ended in 0.4 s on a fast host, before the join
// took effect.
TEST(Elastic, ShoalJoinAddsRanksUpToMax) {
  const std::string dir = testing::scratch_dir("elastic_join");
  const std::string env = "SHOAL_DETERMINISTIC=1 ";
  const std::string ask = fmt::format(
      "if [ $SHOAL_ELASTIC_ID = 1 ] && mkdir {0}/once 2>/dev/null; then (i=0; while [ $i -lt "
      "3000 ] && ! grep -q \"kind\\\":\\\"train\" {0}/elastic/metrics.jsonl 2>/dev/null; do "
      "sleep 0.01; i=$((i+1)); done; {1} join --job {0}/job --ranks 2; {1} join --job {0}/job -- "
      "{1} train > {0}/claim.log 2>&1; echo claim-rc=$? >> {0}/claim.log) & fi;",
      dir, SHOAL_BINARY);
  auto r = run_sh(fmt::format(
      "{}{} run -n 2 --elastic 1:3 --job-dir {}/job --timeout 300 -- sh -c '{} exec {} {} --batch "
      "24 --epochs 6 --out {}/elastic'",
      env, SHOAL_BINARY, dir, ask, SHOAL_BINARY, kTrain, dir));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "more ranks join with `shoal join --job " + dir + "/job`")) << r.out;
  EXPECT_TRUE(has(r.out, "shoal join: asked job")) << r.out;
  EXPECT_TRUE(has(r.out,
                  "2 more rank(s) asked for by shoal join, but 2 train or are joining "
                  "(--elastic max 3): 1 refused"))
      << r.out;
  EXPECT_TRUE(has(r.out, "started rank 2 (asked for by shoal join)")) << r.out;
  EXPECT_TRUE(has(r.out, "joining as rank 2 of 3")) << r.out;
  auto m = memberships(dir + "/elastic");
  ASSERT_EQ(m.size(), 1u) << r.out;
  EXPECT_EQ(m[0]["world"], 3);
  const std::int64_t grow = m[0]["step"];
  ASSERT_GT(grow, 0);
  ASSERT_LT(grow, 1500);
  const std::string ref = dir + "/ref", train = std::string(kTrain) + " --epochs 6";
  run_on_purpose(env, train, ref, {{2, "--batch 24", grow}, {3, "--batch 16", 0}});
  expect_same_end(dir + "/elastic", ref, "1500");
  // A rank started by hand has no place in a job whose launcher starts its
  // own: refused by name (it would wait for a place that never comes).
  auto claim = run_sh("cat " + dir + "/claim.log");
  EXPECT_TRUE(has(claim.out, "this job's launcher starts its own ranks")) << claim.out;
  EXPECT_TRUE(has(claim.out, "claim-rc=2")) << claim.out;
  auto both = run_shoal(fmt::format("join --job {}/job --ranks 2 -- true", dir));
  EXPECT_EQ(both.code, 2);
  EXPECT_TRUE(has(both.out, "--ranks 2 with a command: a command runs one rank here")) << both.out;
  // Not an elastic job, or no job there: named.
  auto none = run_shoal(fmt::format("join --job {}/nowhere", dir));
  EXPECT_EQ(none.code, 2);
  EXPECT_TRUE(has(none.out, "job.env is not there")) << none.out;
}

// Below MIN the job stops, naming who left and the floor.
TEST(Elastic, FewerRanksThanTheMinimumStopTheJob) {
  const std::string dir = testing::scratch_dir("elastic_floor");
  auto r = run_sh(fmt::format("{} run -n 2 --elastic 2 --timeout 300 -- {}", SHOAL_BINARY,
                              with_fault(dir, 1, "KILL", "--batch 24 --epochs 2")));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "1 rank left after generation 0 (rank 1 was killed by signal 9")) << r.out;
  EXPECT_TRUE(has(r.out, "fewer than --elastic 2")) << r.out;
}

// What elastic training does not do is refused by name before training.
TEST(Elastic, WhatIsNotBuiltForItIsRefusedByName) {
  auto few = run_shoal(fmt::format("run -n 4 --elastic 2 -- {} {} --global-batch 3 --out {}",
                                   SHOAL_BINARY, kTrain, testing::scratch_dir("elastic_b")));
  EXPECT_NE(few.code, 0);
  EXPECT_TRUE(has(few.out, "the global batch 3 is fewer samples than the 4 ranks")) << few.out;
  auto zero = run_shoal(fmt::format("run -n 2 --elastic 1 -- {} {} --batch 16 --zero 3 --out {}",
                                    SHOAL_BINARY, kTrain, testing::scratch_dir("elastic_z")));
  EXPECT_NE(zero.code, 0);
  EXPECT_TRUE(has(zero.out, "--zero 3 (parameters in shards) is not built for it yet")) << zero.out;
  auto micro =
      run_shoal(fmt::format("run -n 4 --elastic 2 -- {} {} --batch 12 --micro-batches 3 --out {}",
                            SHOAL_BINARY, kTrain, testing::scratch_dir("elastic_m")));
  EXPECT_NE(micro.code, 0);
  EXPECT_TRUE(has(micro.out,
                  "the global batch 48 does not split into 3 equal micro-batches on each of 3 "
                  "ranks; choose a global batch that is a multiple of 36"))
      << micro.out;
  auto mpirun = run_shoal("run -n 2 --elastic 1 --engine mpirun -- true");
  EXPECT_EQ(mpirun.code, 2);
  EXPECT_TRUE(has(mpirun.out, "it takes no --engine mpirun (mpirun ends every rank when one dies)"))
      << mpirun.out;
  auto shrunk = run_shoal("run -n 3 --elastic 1:2 -- true");
  EXPECT_EQ(shrunk.code, 2);
  EXPECT_TRUE(has(shrunk.out, "--elastic 1:2: MAX must be at least -n 3")) << shrunk.out;
  auto by_hand =
      run_sh(fmt::format("SHOAL_ELASTIC=1 SHOAL_RANK=0 SHOAL_WORLD_SIZE=1 {} {} --out {}",
                         SHOAL_BINARY, kTrain, testing::scratch_dir("elastic_h")));
  EXPECT_NE(by_hand.code, 0);
  EXPECT_TRUE(has(by_hand.out, "not by `shoal run --elastic`")) << by_hand.out;
}

// `shoal run --engine external`: the launcher serves the store and keeps
// the generations; the ranks are started by something else (here `shoal
// join --job DIR -- CMD`, as on each host or in each Kubernetes pod) and
// claim their ids. The third started is killed once training runs, a fifth
// joins once the three went on: the job ends as one that ran 4 ranks, then 3, then 4 on
// purpose. A sixth, beyond --elastic 2:4, waits as a standby, and is told
// the job finished without it.
TEST(Elastic, RanksStartedElsewhereClaimTheirPlaces) {
  const std::string dir = testing::scratch_dir("elastic_external");
  const std::string env = "SHOAL_DETERMINISTIC=1 " + std::string(kCommitEvery);
  const std::string train = std::string(kTrain) + " --epochs 3";
  const std::string rank =
      fmt::format("{}timeout -s KILL 200 {} join --job {}/job -- {} {} --batch 12 --out {}/el", env,
                  SHOAL_BINARY, dir, SHOAL_BINARY, train, dir);
  const std::string trained = fmt::format(
      "i=0; while [ $i -lt 3000 ] && ! grep -q 'kind\":\"train' {}/el/metrics.jsonl "
      "2>/dev/null; do sleep 0.01; i=$((i+1)); done; ",
      dir);
  auto r = run_sh(fmt::format(
      "{bin} run --engine external -n 4 --elastic 2:4 --job-dir {dir}/job --timeout 200 > "
      "{dir}/launcher.log 2>&1 & job=$!\n"
      "i=0; while [ $i -lt 600 ] && [ ! -s {dir}/job/job.env ]; do sleep 0.05; i=$((i+1)); done\n"
      "for k in 0 1 2 3; do {rank} > {dir}/r$k.log 2>&1 & eval p$k=$!; done\n"
      "{trained} pkill -KILL -P $p2\n"
      "i=0; while [ $i -lt 600 ] && ! grep -q 'generation 1:' {dir}/launcher.log; do sleep 0.05; "
      "i=$((i+1)); done; {rank} > {dir}/r4.log 2>&1 & p4=$!\n"
      "i=0; while [ $i -lt 600 ] && ! grep -q 'rank 4 joined' {dir}/launcher.log; do sleep 0.05; "
      "i=$((i+1)); done; {rank} > {dir}/r5.log 2>&1 & p5=$!\n"
      "wait $job; echo job-rc=$?; for k in 0 1 3 4; do wait $(eval echo \\$p$k); echo "
      "rank-rc=$?; done; wait $p5; echo extra-rc=$?; cat {dir}/launcher.log {dir}/r5.log",
      fmt::arg("bin", SHOAL_BINARY), fmt::arg("dir", dir), fmt::arg("rank", rank),
      fmt::arg("trained", trained)));
  EXPECT_TRUE(has(r.out, "job-rc=0")) << r.out;
  EXPECT_EQ(testing::numbers_after(r.out, "rank-rc=").size(), 4u) << r.out;
  for (double rc : testing::numbers_after(r.out, "rank-rc=")) EXPECT_EQ(rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "when its peers lost it (dead, stopped or cut off)")) << r.out;
  EXPECT_TRUE(has(r.out, "rank id 4 asks to join (started elsewhere)")) << r.out;
  EXPECT_TRUE(has(r.out, "the job ended on 4 ranks (it started on 4; generation 2)")) << r.out;
  EXPECT_TRUE(has(r.out, "extra-rc=1")) << r.out;
  EXPECT_TRUE(has(r.out,
                  "rank id 5 asks to join (started elsewhere): 4 train at --elastic max 4, "
                  "so it waits as a standby"))
      << r.out;
  EXPECT_TRUE(has(r.out, "rank 5 was not admitted: the job finished first")) << r.out;
  EXPECT_TRUE(has(r.out, "the launcher ended the job: the job finished before it was admitted"))
      << r.out;
  auto m = memberships(dir + "/el");
  ASSERT_EQ(m.size(), 2u) << r.out;
  EXPECT_EQ(m[0]["world"], 3);
  EXPECT_EQ(m[1]["world"], 4);
  EXPECT_EQ(m[1]["joined"], std::vector<int>({4}));
  const std::int64_t shrink = m[0]["step"], grow = m[1]["step"];
  ASSERT_GT(shrink, 0);
  ASSERT_GE(grow, shrink);
  const std::string ref = dir + "/ref";
  run_on_purpose(env, train, ref,
                 {{4, "--batch 12", shrink}, {3, "--batch 16", grow}, {4, "--batch 12", 0}});
  expect_same_end(dir + "/el", ref, "750");
}

// Under a real Slurm (tools/slurm-cluster.sh: four slurmd on this host):
// `shoal run --engine srun --elastic`, whose ranks are tasks of a job step
// the launcher cannot see into. It knows them by what srun says of each
// task and by each rank's lease in the store (launch/members.h).
class ElasticSrun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::have_slurm()) return;
    dir_ = ::testing::TempDir() + "/shoal-slurm-elastic-" + std::to_string(getpid());
    started_ = testing::start_local_slurm(dir_);
  }
  static void TearDownTestSuite() { testing::stop_local_slurm(started_, dir_); }
  void SetUp() override {
    if (!testing::have_slurm())
      GTEST_SKIP() << "SKIP: slurm-wlm is not installed (tools/install-deps.sh installs it)";
    ASSERT_TRUE(started_) << "tools/slurm-cluster.sh start failed";
  }
  static std::string dir_;
  static bool started_;
};
std::string ElasticSrun::dir_;
bool ElasticSrun::started_ = false;

// Task 2 of the step is killed: srun names it ("task 2: Killed"), the
// three others go on, the launcher starts a step of one task to replace
// it, and the job ends as one that changed its membership on purpose.
TEST_F(ElasticSrun, AKilledTaskIsReplacedByAStepOfItsOwn) {
  replaced_rank_ends_as_on_purpose("elastic_srun_kill", "", "--engine srun");
}

// Task 1 is stopped (SIGSTOP): its peers' heartbeat names it, its lease
// stands still, and the two others go on without it. The launcher cannot
// kill one task of a step; when the job has finished it cancels the step,
// so nothing of it is left running (or stopped).
TEST_F(ElasticSrun, AFrozenTaskIsDroppedByItsLeaseAndCancelledAtTheEnd) {
  const std::string dir = testing::scratch_dir("elastic_srun_freeze");
  auto r = run_sh(
      fmt::format("SHOAL_HEARTBEAT=2 {} run -n 3 --engine srun --elastic 2 --timeout 300 -- {}",
                  SHOAL_BINARY, with_fault(dir, 1, "STOP", "--batch 16 --epochs 2")));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "sent no heartbeat")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1 renewed no lease for 2.")) << r.out;
  EXPECT_TRUE(has(r.out, "dropped (refused by generation should it wake)")) << r.out;
  EXPECT_TRUE(has(r.out, "generation 1: 2 ranks go on")) << r.out;
  EXPECT_TRUE(has(r.out, "the job ended on 2 ranks (it started on 3; generation 1)")) << r.out;
  auto ck = testing::last_checkpoint(dir);
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ(ck->metadata.at("step"), "500");
  auto left = run_sh("pgrep -f -- '--out " + dir + "$'");
  EXPECT_NE(left.code, 0) << "still running: " << left.out;
}

}  // namespace
}  // namespace shoal
