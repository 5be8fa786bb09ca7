// Data-parallel training end to end: `shoal run -n N -- shoal train` on
// real Fashion-MNIST, N ranks x batch B against one process x batch N*B
// (same weights after k steps), run-to-run bit-identity in deterministic
// mode, and ranks that disagree on the model refused at start-up.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/cli_results.h"
#include "cli/run_shoal.h"
#include "free_port.h"
#include "shoal/tensor/safetensors.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::last_checkpoint;
using testing::run_shoal;

// A fresh run directory, removed when the test process exits.
std::string tmpdir(const std::string& name) { return testing::scratch_dir("dp_" + name) + "/run"; }

// Trains `steps` steps of the MLP with `ranks` ranks of batch `batch`.
std::string train(const std::string& name, int ranks, int batch, int steps,
                  const std::string& extra = "") {
  std::string out = tmpdir(name);
  auto r = run_shoal(fmt::format(
      "run -n {} --timeout 120 -- {} train --model mlp --batch {} --max-steps {} --limit-train "
      "2048 --limit-test 256 --threads 1 --optimizer momentum --lr 0.05 --deterministic "
      "--no-plot --quiet --out {} {}",
      ranks, SHOAL_BINARY, batch, steps, out, extra));
  EXPECT_EQ(r.code, 0) << r.out;
  return out;
}

// The losses a data-parallel run logs each step are the global batch's,
// not rank 0's own: metrics.jsonl of 2 ranks x 16 matches one process x 32
// line for line (before: step 1 logged 4.5332 against 4.5241).
TEST(DataParallelCli, TheLoggedLossIsTheGlobalBatchs) {
  auto losses = [](const std::string& dir) {
    std::vector<double> v;
    std::ifstream in(dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      if (line.find("\"kind\":\"train\"") != std::string::npos)
        v.push_back(testing::numbers_after(line, "\"loss\":").at(0));
    return v;
  };
  // Lines at steps 6, 12 and 18: the runs' weights drift apart by float
  // rounding (1e-5 at step 6, 1e-4 at 12), far below the gap between one
  // half-batch's loss and the whole batch's (0.01-0.1).
  const auto one = losses(train("loss_one", 1, 32, 18));
  const auto two = losses(train("loss_two", 2, 16, 18));
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(one.size(), two.size());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(two[i], one[i], 1e-3) << "line " << i;
}

TEST(DataParallelCli, NRanksMatchOneRankOnTheWholeBatch) {
  constexpr int kB = 16, kSteps = 8;
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("{} ranks", n));
    auto one = last_checkpoint(train(fmt::format("one{}", n), 1, n * kB, kSteps));
    auto many = last_checkpoint(train(fmt::format("many{}", n), n, kB, kSteps));
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    EXPECT_EQ(many->metadata.at("step"), std::to_string(kSteps));
    EXPECT_EQ(many->metadata.at("world"), std::to_string(n));
    int params = 0;
    for (const auto& [name, t] : one->tensors) {
      if (name.rfind("param/", 0) != 0) continue;
      ++params;
      const Tensor* u = many->find(name);
      ASSERT_NE(u, nullptr) << name;
      double worst = 0;
      for (std::int64_t i = 0; i < t.numel(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(u->data<float>()[i]) -
                                         static_cast<double>(t.data<float>()[i])));
      EXPECT_LE(worst, 1e-5) << name;
    }
    EXPECT_EQ(params, 6);
  }
}

// --global-batch 50, which 3 and 4 ranks do not divide: shares of
// 17/17/16 and 13/13/12/12, each rank's gradient weighted by its share
// (with ZeRO-2 too), end with the weights and momentum of one process on
// the 50 samples. Unweighted, the shares' mean is 0.3 away.
TEST(DataParallelCli, AGlobalBatchTheRanksDoNotDivideMatchesOneProcess) {
  constexpr int kSteps = 8;
  const std::string one = train("global_one", 1, 50, kSteps);
  for (auto [n, extra] : {std::pair{3, ""}, std::pair{4, ""}, std::pair{3, "--zero 2"}}) {
    SCOPED_TRACE(fmt::format("{} ranks {}", n, extra));
    std::string out = tmpdir(fmt::format("global{}{}", n, extra[0] ? "z" : ""));
    auto r = run_shoal(fmt::format(
        "run -n {} --timeout 120 -- {} train --model mlp --global-batch 50 --max-steps {} "
        "--limit-train 2048 --limit-test 256 --threads 1 --optimizer momentum --lr 0.05 "
        "--deterministic --no-plot --out {} {}",
        n, SHOAL_BINARY, kSteps, out, extra));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(fmt::format("batch {} or {} (a global 50 over {} data-parallel ranks",
                                     50 / n + 1, 50 / n, n)),
              std::string::npos)
        << r.out;
    testing::expect_same_training(one, out, 6);
  }
  auto both =
      run_shoal(fmt::format("train --batch 8 --global-batch 50 --out {}", tmpdir("global_both")));
  EXPECT_EQ(both.code, 2);
  EXPECT_NE(both.out.find("--batch excludes --global-batch"), std::string::npos) << both.out;
}

// Deterministic mode: two runs of the same 3-rank job give the same bits.
TEST(DataParallelCli, DeterministicRunsAreBitIdentical) {
  auto a = last_checkpoint(train("deta", 3, 16, 6));
  auto b = last_checkpoint(train("detb", 3, 16, 6));
  ASSERT_TRUE(a.ok() && b.ok());
  for (const auto& [name, t] : a->tensors) {
    const Tensor* u = b->find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(0, std::memcmp(t.raw_data(), u->raw_data(), t.nbytes())) << name;
  }
}

// Ranks started with different options are refused before any gradient
// travels, naming the option and both values: the batch (a different
// graph), the learning rate (the same graph, silently different math
// before), and the wire type of the all-reduce.
TEST(DataParallelCli, RanksWithDifferentOptionsAreRefusedByName) {
  const std::string common =
      "--max-steps 2 --limit-train 512 --limit-test 64 --threads 1 --no-plot --no-checkpoints "
      "--quiet";
  for (auto [flag, expect] : std::vector<std::pair<std::string, std::string>>{
           {"--batch $((16 + SHOAL_RANK))", "disagree on --batch: rank 0 has 16, rank 1 has 17"},
           {"--lr $([ $SHOAL_RANK = 1 ] && echo 0.5 || echo 0.02)",
            "disagree on --lr: rank 0 has 0.02, rank 1 has 0.5"},
           {"--wire $([ $SHOAL_RANK = 1 ] && echo bf16 || echo f32)",
            "disagree on --wire: rank 0 has f32, rank 1 has bf16"},
       }) {
    auto r = run_shoal(fmt::format("run -n 2 --timeout 60 -- sh -c '{} train --model mlp {} {}'",
                                   SHOAL_BINARY, flag, common));
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << expect << "\n" << r.out;
  }
}

// A rank killed with SIGKILL mid-run: with --max-restarts 1 the launcher
// restarts every rank, training resumes from the newest checkpoint, and the
// final weights are bit-identical to a run that was never interrupted.
TEST(DataParallelCli, RestartAfterKillResumesToTheSameWeights) {
  const std::string flags =
      "--model mlp --batch 16 --max-steps 60 --checkpoint-every 10 --limit-train 2048 "
      "--limit-test 256 --threads 1 --optimizer momentum --lr 0.05 --deterministic --no-plot "
      "--quiet";
  std::string clean = train("clean", 2, 16, 60, "--checkpoint-every 10");
  std::string out = tmpdir("killed");
  // Rank 1 of the first attempt kills itself (kill -9) once a checkpoint exists.
  auto r = run_shoal(fmt::format(
      "run -n 2 --max-restarts 1 --timeout 120 -- sh -c '"
      "if [ $SHOAL_RESTART_COUNT = 0 ] && [ $SHOAL_RANK = 1 ]; then "
      "(i=0; while [ $i -lt 600 ] && ! ls {0}/checkpoints/*.safetensors >/dev/null 2>&1; do "
      "sleep 0.02; i=$((i+1)); done; kill -9 $$) & fi; exec {1} train {2} --out {0}'",
      out, SHOAL_BINARY, flags));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1 was killed by signal 9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("restarting all 2 ranks from the latest checkpoint (restart 1 of 1)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  auto a = last_checkpoint(clean);
  auto b = last_checkpoint(out);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->metadata.at("step"), "60");
  for (const auto& [name, t] : a->tensors) {
    const Tensor* u = b->find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(0, std::memcmp(t.raw_data(), u->raw_data(), t.nbytes())) << name;
  }
}

// Ranks started the way torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT; rank 0 serves the store) train together without shoal run,
// even when rank 1 starts first.
TEST(DataParallelCli, TorchrunStyleEnvironmentWorks) {
  std::string out = tmpdir("torchrun");
  const int port = testing::free_port();  // tests run in parallel: not a guessed one
  std::string common = fmt::format(
      "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT={} SHOAL_JOB_TOKEN=t0k3n timeout 120 {} "
      "train --model mlp --batch 16 --max-steps 10 --limit-train 2048 --limit-test 256 "
      "--threads 1 --no-plot --quiet --out {}",
      port, SHOAL_BINARY, out);
  auto r = testing::run_sh(fmt::format(
      "RANK=1 {0} > {1}.r1.log 2>&1 & sleep 0.5; RANK=0 {0}; rc=$?; wait; cat {1}.r1.log; "
      "exit $rc",
      common, out));
  EXPECT_EQ(r.code, 0) << r.out;
  auto ck = last_checkpoint(out);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string() << r.out;
  EXPECT_EQ(ck->metadata.at("world"), "2");
  EXPECT_EQ(ck->metadata.at("step"), "10");
}

// --trace: every rank writes its trace, the launcher merges them (pid =
// rank) and reports the exposed communication time.
TEST(DataParallelCli, LauncherMergesTraces) {
  std::string out = tmpdir("trace");
  std::string merged = out + ".trace.json";
  auto r = run_shoal(fmt::format(
      "run -n 2 --timeout 120 --trace {} -- {} train --model mlp --batch 16 --max-steps 12 "
      "--limit-train 2048 --limit-test 64 --threads 1 --no-plot --quiet --out {}",
      merged, SHOAL_BINARY, out));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1: 10 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exposed (compute waiting for it)"), std::string::npos) << r.out;
  auto text = read_file(merged);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("\"pid\":1"), std::string::npos);
  EXPECT_NE(text->find("allreduce/bucket0"), std::string::npos);
}

}  // namespace
}  // namespace shoal
