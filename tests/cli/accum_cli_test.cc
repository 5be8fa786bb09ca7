// Gradient accumulation, `shoal train --micro-batches M` without --pp: after
// k momentum steps every parameter and its momentum equal the run on whole
// batches, in one process (M = 3 and 4 of a batch of 12), on 2
// data-parallel ranks (plain and ZeRO-2) and on tensor-parallel ranks (with
// sequence parallelism; 2 x 2 with ZeRO-2) against one process on their
// global batch; the planned step arena falls with M; a resume is
// bit-identical; what it cannot do, and a pipeline's flags without --pp, are
// refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli/cli_results.h"
#include "cli/run_shoal.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::last_checkpoint;
using testing::run_shoal;
using testing::TrainRun;

const std::string kText = "/usr/share/games/fortunes/fortunes";

const std::string kGpt = fmt::format(
    "--model gpt --untied --data text:{} --layers 2 --heads 2 --dim 16 --context 8 "
    "--limit-train 300 --limit-test 40",
    kText);

TrainRun train(const std::string& dir, int ranks, int steps, int batch, const std::string& extra,
               const std::string& model = kGpt,
               const std::string& optimizer = "--optimizer momentum --lr 0.05") {
  const std::string flags = fmt::format(
      "train {} --batch {} --max-steps {} --threads 1 {} --deterministic --no-plot "
      "--quiet --out {} {}",
      model, batch, steps, optimizer, dir, extra);
  auto r =
      ranks == 1
          ? run_shoal(flags)
          : run_shoal(fmt::format("run -n {} --timeout 120 -- {} {}", ranks, SHOAL_BINARY, flags));
  return {dir, r.out, r.code};
}

std::string tmpdir(const std::string& name) {
  return testing::scratch_dir("accum_" + name) + "/run";
}

// 2 blocks x 16 tensors + wte, wpe, ln_f (2), the untied head: 37.
constexpr int kParams = 37;

void expect_same(const std::string& a_dir, const std::string& b_dir) {
  testing::expect_same_training(a_dir, b_dir, kParams);
}

bool have_text() { return std::filesystem::exists(kText); }

TEST(AccumCli, MicroBatchesEqualTheWholeBatchInLessMemory) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun whole = train(tmpdir("whole"), 1, 6, 12, "");
  ASSERT_EQ(whole.code, 0) << whole.out;
  for (int m : {3, 4}) {
    SCOPED_TRACE(fmt::format("--micro-batches {}", m));
    TrainRun acc = train(tmpdir("acc"), 1, 6, 12, fmt::format("--micro-batches {}", m));
    ASSERT_EQ(acc.code, 0) << acc.out;
    EXPECT_NE(acc.out.find(fmt::format("each batch of 12 as {} micro-batches of {}", m, 12 / m)),
              std::string::npos)
        << acc.out;
    expect_same(whole.dir, acc.dir);
  }
  // One micro-batch's activations alive at a time: where activations
  // outweigh the parameters' buffers (a longer context), the planned step
  // arena falls with M (3.2 MB, 1.8 MB, 1.1 MB when written).
  auto planned = [](int m) {
    auto r = run_shoal(fmt::format(
        "train --model gpt --untied --data text:{} --layers 2 --heads 2 --dim 32 --context 32 "
        "--limit-train 2000 --limit-test 40 --batch 16 --max-steps 1 --threads 1 --no-plot "
        "--no-checkpoints --quiet --micro-batches {} --out {}",
        kText, m, tmpdir("arena")));
    EXPECT_EQ(r.code, 0) << r.out;
    return testing::step_arena(r.out);
  };
  const double a1 = planned(1), a2 = planned(2), a4 = planned(4);
  EXPECT_GT(a4, 0.0);
  EXPECT_LT(a2, 0.7 * a1);
  EXPECT_LT(a4, 0.7 * a2);
}

TEST(AccumCli, RanksAccumulateAsOneProcessOnTheGlobalBatch) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one8 = train(tmpdir("one8"), 1, 5, 8, "");
  TrainRun one16 = train(tmpdir("one16"), 1, 5, 16, "");
  ASSERT_EQ(one8.code, 0) << one8.out;
  ASSERT_EQ(one16.code, 0) << one16.out;
  struct Layout {
    int ranks;
    std::string flags;
    const TrainRun& one;  // the same global batch in one process
  };
  for (const Layout& l :
       {Layout{2, "--micro-batches 4", one16}, Layout{2, "--micro-batches 4 --zero 2", one16},
        Layout{2, "--micro-batches 4 --tp 2", one8},
        Layout{2, "--micro-batches 2 --tp 2 --sequence-parallel", one8},
        Layout{4, "--micro-batches 2 --tp 2 --zero 2", one16}}) {
    SCOPED_TRACE(l.flags);
    TrainRun r = train(tmpdir("ranks"), l.ranks, 5, 8, l.flags);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("gradient accumulation: each batch of 8 as"), std::string::npos) << r.out;
    expect_same(l.one.dir, r.dir);
    // Tensor-parallel ranks still hold slices: about half the parameters.
    if (l.flags.find("--tp 2") != std::string::npos) {
      auto mine = testing::numbers_after(r.out, "parameters ");
      auto whole = testing::numbers_after(l.one.out, "parameters ");
      ASSERT_FALSE(mine.empty() || whole.empty()) << r.out << l.one.out;
      EXPECT_LT(mine[0], 0.75 * whole[0]) << r.out;
    }
  }
  // Stopped half way and resumed, it lands on the same bits.
  testing::expect_resume_bit_identical(
      [](const std::string& dir, int steps, const std::string& extra) {
        return train(dir, 2, steps, 8, "--micro-batches 2 " + extra);
      },
      tmpdir("whole"), tmpdir("resumed"), 6);
}

// Batch norm normalizes each micro-batch by its own statistics, as PyTorch's
// accumulation loop does and as data-parallel ranks without synchronized
// batch norm do: M micro-batches give the weights of M such ranks. Its
// running statistics go through the micro-batches in turn: with the weights
// held still (a negligible learning rate), 2 steps of 2 micro-batches leave
// the statistics of 4 steps of one.
TEST(AccumCli, BatchNormIsPerMicroBatchAsOnDataParallelRanks) {
  const std::string cnn = "--model cnn --limit-train 256 --limit-test 64";
  TrainRun acc = train(tmpdir("bn_acc"), 1, 4, 16, "--micro-batches 2", cnn);
  TrainRun dp = train(tmpdir("bn_dp"), 2, 4, 8, "", cnn);
  ASSERT_EQ(acc.code, 0) << acc.out;
  ASSERT_EQ(dp.code, 0) << dp.out;
  testing::expect_same_training(acc.dir, dp.dir, 10);
  const std::string still = "--optimizer sgd --lr 1e-30";
  TrainRun two = train(tmpdir("bn_two"), 1, 2, 16, "--micro-batches 2", cnn, still);
  TrainRun four = train(tmpdir("bn_four"), 1, 4, 8, "", cnn, still);
  ASSERT_EQ(two.code, 0) << two.out;
  ASSERT_EQ(four.code, 0) << four.out;
  auto t = last_checkpoint(two.dir), f = last_checkpoint(four.dir);
  ASSERT_TRUE(t.ok() && f.ok());
  int nb = 0;
  EXPECT_LE(testing::max_abs_diff(*t, *f, "buf/", &nb), 1e-5);
  EXPECT_EQ(nb, 4);  // 2 batch norms x (mean, variance)
}

TEST(AccumCli, WhatItCannotDoIsRefusedByName) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  auto refused = [](const TrainRun& r, const std::string& what) {
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(what), std::string::npos) << r.out;
  };
  refused(train(tmpdir("z3"), 2, 1, 8, "--micro-batches 2 --zero 3"),
          "--micro-batches 2 with --zero 3 would gather every parameter again");
  refused(train(tmpdir("z3one"), 1, 1, 8, "--micro-batches 2 --zero 3"),
          "--micro-batches 2 with --zero 3 would gather");
  // A pipeline's own flags without a pipeline.
  refused(train(tmpdir("gpipe"), 1, 1, 8, "--micro-batches 2 --pp-schedule gpipe"),
          "--pp-schedule gpipe orders a pipeline's micro-batches: it needs --pp > 1, got --pp 1");
  refused(train(tmpdir("cuts"), 2, 1, 8, "--pp-cuts 1,2"),
          "--pp-cuts 1,2 places a pipeline's cuts: it needs --pp > 1, got --pp 1");
  refused(train(tmpdir("split"), 1, 1, 8, "--micro-batches 3"),
          "--micro-batches 3 must divide --batch 8");
  refused(train(tmpdir("ps"), 1, 1, 8, "--micro-batches 2 --dist ps"),
          "--micro-batches 2: a parameter-server worker pushes the gradient of each batch");
}

}  // namespace
}  // namespace shoal
