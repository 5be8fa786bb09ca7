// `shoal train --sharded-checkpoints` under `shoal run -n N`: every rank
// writes its share of each checkpoint (ckpt-<step>/ with one safetensors
// file per rank and Hugging Face's index). The shards hold exactly the
// tensors one file would, bit for bit; a resume in the same layout is
// bit-identical; a checkpoint written by `--tp 2 --pp 2` on 4 ranks resumes
// in one process onto the uninterrupted run; PyTorch reads the shards
// through the index to Shoal's test accuracy.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli/cli_results.h"
#include "cli/run_shoal.h"
#include "shoal/train/checkpoint.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::last_checkpoint;
using testing::run_shoal;
using testing::TrainRun;
namespace fs = std::filesystem;

const std::string kText = "/usr/share/games/fortunes/fortunes";

std::string tmpdir(const std::string& name) {
  return testing::scratch_dir("shck_" + name) + "/run";
}

TrainRun train(const std::string& dir, int ranks, int steps, const std::string& extra,
               const std::string& model = "--model mlp --limit-train 2048 --limit-test 256") {
  const std::string flags = fmt::format(
      "train {} --batch 16 --max-steps {} --threads 1 --deterministic --no-plot --quiet --out {} "
      "{}",
      model, steps, dir, extra);
  auto r =
      ranks == 1
          ? run_shoal(flags)
          : run_shoal(fmt::format("run -n {} --timeout 120 -- {} {}", ranks, SHOAL_BINARY, flags));
  return {dir, r.out, r.code};
}

// The newest checkpoint's entry in <dir>/checkpoints.
std::string newest(const std::string& dir) {
  auto all = train::CheckpointDir(dir + "/checkpoints", 1).list();
  return all.empty() ? "" : all[0];
}

double accuracy(const std::string& out, const std::string& prefix) {
  auto v = testing::numbers_after(out, prefix);
  return v.empty() ? -1 : v.back();
}

TEST(ShardedCheckpointCli, ShardsHoldWhatOneFileHoldsAndResumeBitIdentical) {
  const std::string opt = "--optimizer adam --lr 0.002 --zero 1";
  TrainRun file = train(tmpdir("file"), 3, 6, opt);
  TrainRun shards = train(tmpdir("shards"), 3, 6, opt + " --sharded-checkpoints");
  ASSERT_EQ(file.code, 0) << file.out;
  ASSERT_EQ(shards.code, 0) << shards.out;
  const std::string ck = newest(shards.dir);
  ASSERT_TRUE(fs::is_directory(ck)) << ck;
  EXPECT_EQ(fs::path(ck).filename(), "ckpt-0000000006");
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(fs::exists(ck + "/" + train::checkpoint_shard_name(r, 3))) << r;
  EXPECT_TRUE(fs::exists(ck + "/" + train::kCheckpointIndex));
  auto a = last_checkpoint(file.dir), b = last_checkpoint(shards.dir);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->tensors.size(), 18u);  // 6 parameters, 12 Adam slots
  EXPECT_TRUE(testing::same_bits(*a, *b));
  testing::expect_resume_bit_identical(
      [&](const std::string& dir, int steps, const std::string& extra) {
        return train(dir, 3, steps, opt + " --sharded-checkpoints " + extra);
      },
      tmpdir("bits1"), tmpdir("bits2"), 6);
}

TEST(ShardedCheckpointCli, FourRanksOfTensorAndPipelineStagesResumeInOneProcess) {
  if (!fs::exists(kText)) GTEST_SKIP() << "Debian's fortunes package is not installed";
  const std::string gpt =
      "--model gpt --untied --data text:" + kText +
      " --layers 3 --heads 4 --dim 16 --context 8 --limit-train 200 --limit-test 40 "
      "--optimizer momentum --lr 0.05";
  TrainRun one = train(tmpdir("one"), 1, 6, "", gpt);
  ASSERT_EQ(one.code, 0) << one.out;
  const std::string dir = tmpdir("move");
  TrainRun a = train(dir, 4, 3, "--tp 2 --pp 2 --sharded-checkpoints", gpt);
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_TRUE(fs::exists(newest(dir) + "/" + train::checkpoint_shard_name(3, 4))) << newest(dir);
  TrainRun b = train(dir, 1, 6, "--resume", gpt);
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("resumed from " + dir + "/checkpoints/ckpt-0000000003 "), std::string::npos)
      << b.out;
  auto x = last_checkpoint(one.dir), y = last_checkpoint(dir);
  ASSERT_TRUE(x.ok() && y.ok());
  int np = 0, ns = 0;
  EXPECT_LE(testing::max_abs_diff(*x, *y, "param/", &np), 1e-5);
  EXPECT_LE(testing::max_abs_diff(*x, *y, "opt/", &ns), 1e-5);
  EXPECT_EQ(np, 53);  // 3 blocks x 16 + wte, wpe, ln_f (2), the head
  EXPECT_EQ(ns, 53);
  // Each rank keeps only what it writes of the 106 tensors gathered whole:
  // one file, rank 0 all of them and the others none; shards, a share each.
  const std::string flags = fmt::format(
      "SHOAL_LOG_LEVEL=debug {} run -n 4 --timeout 120 -- {} train {} --batch 16 --max-steps 1 "
      "--threads 1 --no-plot --quiet --tp 2 --pp 2",
      SHOAL_BINARY, SHOAL_BINARY, gpt);
  auto file = testing::run_sh(flags + " --out " + tmpdir("keep1"));
  ASSERT_EQ(file.code, 0) << file.out;
  EXPECT_NE(file.out.find("rank 0 holds 106 of the 106 tensors"), std::string::npos) << file.out;
  for (int r = 1; r < 4; ++r)
    EXPECT_NE(file.out.find(fmt::format("rank {} holds 0 of the 106 tensors", r)),
              std::string::npos)
        << file.out;
  auto shards = testing::run_sh(flags + " --sharded-checkpoints --out " + tmpdir("keep4"));
  ASSERT_EQ(shards.code, 0) << shards.out;
  auto held = testing::numbers_after(shards.out, "holds ");
  ASSERT_EQ(held.size(), 4u) << shards.out;
  double sum = 0;
  for (double h : held) {
    EXPECT_GT(h, 0) << shards.out;
    EXPECT_LT(h, 106) << shards.out;
    sum += h;
  }
  EXPECT_EQ(sum, 106) << shards.out;
}

// One resolver for every loader: a run directory, its checkpoints/, a
// sharded checkpoint's directory and its index file, and a single file
// all load in `shoal eval --weights` and `shoal train --init-from`, to the
// same accuracy. Before: eval on a sharded checkpoint's directory gave a
// shape error and --init-from RUN failed.
TEST(ShardedCheckpointCli, EveryLoaderTakesEveryFormOfACheckpoint) {
  TrainRun shards = train(tmpdir("forms_sharded"), 2, 6, "--sharded-checkpoints");
  ASSERT_EQ(shards.code, 0) << shards.out;
  TrainRun file = train(tmpdir("forms_file"), 1, 6, "");
  ASSERT_EQ(file.code, 0) << file.out;
  const std::string ck = newest(shards.dir);
  ASSERT_TRUE(fs::is_directory(ck)) << ck;
  const std::string eval = "eval --model mlp --limit-test 256 --threads 1 --weights ";
  double want = -1;
  for (const std::string& w :
       {shards.dir, shards.dir + "/checkpoints", ck, ck + "/" + train::kCheckpointIndex}) {
    auto r = run_shoal(eval + w);
    ASSERT_EQ(r.code, 0) << w << "\n" << r.out;
    const double acc = accuracy(r.out, "accuracy ");
    if (want < 0) want = acc;
    EXPECT_EQ(acc, want) << w << "\n" << r.out;
  }
  for (const std::string& w : {file.dir, newest(file.dir)}) {
    auto r = run_shoal(eval + w);
    EXPECT_EQ(r.code, 0) << w << "\n" << r.out;
    auto t = run_shoal(fmt::format(
        "train --model mlp --limit-train 256 --limit-test 64 --max-steps 1 --threads 1 --no-plot "
        "--quiet --out {}/init --init-from {}",
        testing::scratch_dir("shck_init"), w));
    EXPECT_EQ(t.code, 0) << w << "\n" << t.out;
  }
}

TEST(ShardedCheckpointCli, PyTorchReadsTheShardsThroughTheIndex) {
  if (testing::run_sh("/usr/bin/python3 -c 'import torch, numpy'").code != 0)
    GTEST_SKIP() << "Debian's python3-torch is not installed (tools/install-deps.sh installs it)";
  TrainRun r =
      train(tmpdir("torch"), 2, 200, "--optimizer momentum --lr 0.05 --sharded-checkpoints",
            "--model mlp --limit-train 8192");
  ASSERT_EQ(r.code, 0) << r.out;
  const double shoal_acc = accuracy(r.out, "final: test accuracy ");
  ASSERT_GT(shoal_acc, 60) << r.out;
  auto back = testing::run_sh("/usr/bin/python3 " + std::string(SHOAL_SOURCE_DIR) +
                              "/tests/python/torch_roundtrip.py eval " + newest(r.dir) + "/" +
                              train::kCheckpointIndex);
  ASSERT_EQ(back.code, 0) << back.out;
  EXPECT_NE(back.out.find("torch: 12 tensors from 2 shards"), std::string::npos) << back.out;
  // Float sums in another order may flip a borderline image: 0.02 points.
  EXPECT_NEAR(accuracy(back.out, "torch: test accuracy "), shoal_acc, 0.02) << r.out << back.out;
}

}  // namespace
}  // namespace shoal
