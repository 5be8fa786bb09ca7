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

#include "cli/cli_results.h"
#include "cli/run_shoal.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::run_sh;
using testing::run_shoal;

bool has(const std::string& out, const std::string& s) { return out.find(s) != std::string::npos; }

// 250 steps an epoch of a global batch of 48 (12 x 4 ranks, 16 x 3).
const char* kTrain =
    "train --model mlp --limit-train 12000 --limit-test 256 --threads 1 --no-plot --quiet "
    "--optimizer momentum --lr 0.05 --epochs 2";

// `shoal train` under `sh`, in which rank `victim` sends itself `sig` once
// the run has logged its first training record (step 25); bounded: 30 s.
std::string with_fault(const std::string& out, int victim, const char* sig,
                       const std::string& flags) {
  return fmt::format(
      "sh -c 'if [ $SHOAL_RANK = {2} ]; then (i=0; while [ $i -lt 3000 ] && ! grep -q "
      "\"kind\\\":\\\"train\" {0}/metrics.jsonl 2>/dev/null; do sleep 0.01; i=$((i+1)); done; "
      "kill -{3} $$) & fi; exec {1} {4} {5} --out {0}'",
      out, SHOAL_BINARY, victim, sig, kTrain, flags);
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

// Rank 2 of 4 is killed near step 25: the three others go on from the
// step they hold and end with the weights and momentum of a job that ran
// 4 ranks to that step, wrote a checkpoint, and resumed on 3 (--batch 16:
// the same global batch). No checkpoint is read by the elastic job.
TEST(Elastic, AKilledRankLeavesAndTheRestEndAsAJobThatShrankOnPurpose) {
  const std::string dir = testing::scratch_dir("elastic_kill");
  const std::string env = "SHOAL_DETERMINISTIC=1 ";
  auto r = run_sh(env + SHOAL_BINARY + " run -n 4 --elastic 2 --timeout 300 -- " +
                  with_fault(dir + "/elastic", 2, "KILL", "--batch 12"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "generation 1: 3 ranks go on from step ")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 2 was killed by signal 9")) << r.out;
  EXPECT_TRUE(has(r.out, "the job ran on 3 of 4 ranks")) << r.out;
  EXPECT_FALSE(has(r.out, "resumed from " + dir)) << r.out;  // no file was read
  auto m = memberships(dir + "/elastic");
  ASSERT_EQ(m.size(), 1u) << r.out;
  // In rank order: the holder of the newest step first (any of the three).
  std::vector<int> members = m[0]["members"];
  std::sort(members.begin(), members.end());
  EXPECT_EQ(members, std::vector<int>({0, 1, 3}));
  const std::int64_t step = m[0]["step"];
  ASSERT_GT(step, 0);
  ASSERT_LT(step, 500);

  const std::string ref = dir + "/ref";
  auto a = run_sh(fmt::format("{}{} run -n 4 -- {} {} --batch 12 --max-steps {} --out {}", env,
                              SHOAL_BINARY, SHOAL_BINARY, kTrain, step, ref));
  ASSERT_EQ(a.code, 0) << a.out;
  auto b = run_sh(fmt::format("{}{} run -n 3 -- {} {} --batch 16 --max-steps 0 --resume --out {}",
                              env, SHOAL_BINARY, SHOAL_BINARY, kTrain, ref));
  ASSERT_EQ(b.code, 0) << b.out;
  auto x = testing::last_checkpoint(dir + "/elastic"), y = testing::last_checkpoint(ref);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->metadata.at("step"), "500");
  EXPECT_EQ(y->metadata.at("step"), "500");
  int np = 0, ns = 0;
  EXPECT_LE(testing::max_abs_diff(*x, *y, "param/", &np), 1e-5);
  EXPECT_LE(testing::max_abs_diff(*x, *y, "opt/", &ns), 1e-5);
  EXPECT_GT(np, 0);
  EXPECT_EQ(ns, np);  // momentum: one state tensor per parameter
}

// A frozen rank (SIGSTOP) is named by the heartbeat, the survivors end the
// step in flight and check in, and the launcher kills the stopped one and
// forms the next generation: the job finishes.
TEST(Elastic, AFrozenRankIsDroppedAndKilledAndTheJobFinishes) {
  const std::string dir = testing::scratch_dir("elastic_freeze");
  auto r = run_sh(fmt::format("SHOAL_HEARTBEAT=2 {} run -n 3 --elastic 2 --timeout 300 -- {}",
                              SHOAL_BINARY, with_fault(dir, 1, "STOP", "--batch 16")));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "sent no heartbeat")) << r.out;
  EXPECT_TRUE(has(r.out, "ending the step in flight")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1 was stopped (state T) when its peers lost it: killed")) << r.out;
  EXPECT_TRUE(has(r.out, "generation 1: 2 ranks go on")) << r.out;
  auto ck = testing::last_checkpoint(dir);
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ(ck->metadata.at("step"), "500");
}

// Below MIN the job stops, naming who left and the floor.
TEST(Elastic, FewerRanksThanTheMinimumStopTheJob) {
  const std::string dir = testing::scratch_dir("elastic_floor");
  auto r = run_sh(fmt::format("{} run -n 2 --elastic 2 --timeout 300 -- {}", SHOAL_BINARY,
                              with_fault(dir, 1, "KILL", "--batch 24")));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "1 rank left after generation 0 (rank 1 was killed by signal 9")) << r.out;
  EXPECT_TRUE(has(r.out, "fewer than --elastic 2")) << r.out;
}

// What elastic training does not do is refused by name before training.
TEST(Elastic, WhatIsNotBuiltForItIsRefusedByName) {
  auto uneven = run_shoal(fmt::format("run -n 4 --elastic 2 -- {} {} --batch 16 --out {}",
                                      SHOAL_BINARY, kTrain, testing::scratch_dir("elastic_b")));
  EXPECT_NE(uneven.code, 0);
  EXPECT_TRUE(has(uneven.out,
                  "the global batch 64 (--batch 16 x 4 ranks) does not split evenly "
                  "over 3 ranks"))
      << uneven.out;
  auto zero = run_shoal(fmt::format("run -n 2 --elastic 1 -- {} {} --batch 16 --zero 1 --out {}",
                                    SHOAL_BINARY, kTrain, testing::scratch_dir("elastic_z")));
  EXPECT_NE(zero.code, 0);
  EXPECT_TRUE(has(zero.out, "--zero, --tp and --pp are not built for it yet")) << zero.out;
  auto srun = run_shoal("run -n 2 --elastic 1 --engine srun -- true");
  EXPECT_EQ(srun.code, 2);
  EXPECT_TRUE(has(srun.out, "it takes no --engine srun")) << srun.out;
  auto grow = run_shoal("run -n 2 --elastic 1:4 -- true");
  EXPECT_EQ(grow.code, 2);
  EXPECT_TRUE(has(grow.out, "ranks joining beyond -n 2 are not built yet")) << grow.out;
  auto by_hand =
      run_sh(fmt::format("SHOAL_ELASTIC=1 SHOAL_RANK=0 SHOAL_WORLD_SIZE=1 {} {} --out {}",
                         SHOAL_BINARY, kTrain, testing::scratch_dir("elastic_h")));
  EXPECT_NE(by_hand.code, 0);
  EXPECT_TRUE(has(by_hand.out, "not by `shoal run --elastic`")) << by_hand.out;
}

}  // namespace
}  // namespace shoal
