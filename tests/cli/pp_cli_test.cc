// Pipeline parallelism in `shoal train --pp P` under `shoal run`: the
// GPT's layers cut into P stages, each batch run as micro-batches under
// 1F1B or GPipe; after k momentum steps every parameter and its momentum
// (gathered from the stage that holds it) equal one process on the whole
// batch, at P = 2, 3 and 4 and as 2 data-parallel groups of 2 stages; the
// two schedules give the same bits; 1F1B keeps fewer activations alive;
// checkpoints move between layouts; stages of tensor-parallel ranks
// (`--tp 2 --pp 2`) equal one process too; what does not fit is refused by
// name.
#include <gtest/gtest.h>
#include <unistd.h>

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

std::string gpt(int layers = 3) {
  return fmt::format(
      "--model gpt --untied --data text:{} --layers {} --heads 4 --dim 16 --context 8 "
      "--limit-train 200 --limit-test 40",
      kText, layers);
}

TrainRun train(const std::string& dir, int ranks, int steps, const std::string& extra,
               int batch = 8, const std::string& model = gpt()) {
  const std::string flags = fmt::format(
      "train {} --batch {} --max-steps {} --threads 1 --optimizer momentum --lr 0.05 "
      "--deterministic --no-plot --quiet --out {} {}",
      model, batch, steps, dir, extra);
  auto r =
      ranks == 1
          ? run_shoal(flags)
          : run_shoal(fmt::format("run -n {} --timeout 120 -- {} {}", ranks, SHOAL_BINARY, flags));
  return {dir, r.out, r.code};
}

std::string tmpdir(const std::string& name) { return testing::scratch_dir("pp_" + name) + "/run"; }

// 3 blocks x 16 tensors + wte, wpe, ln_f (2), the untied head: 53.
constexpr int kParams = 53;

// The GPT above with its token table tied to the head: one tensor fewer.
std::string tied_gpt() {
  return fmt::format(
      "--model gpt --data text:{} --layers 3 --heads 4 --dim 16 --context 8 --limit-train 200 "
      "--limit-test 40",
      kText);
}

void expect_same(const std::string& a_dir, const std::string& b_dir, double tol = 1e-5,
                 int params = kParams) {
  testing::expect_same_training(a_dir, b_dir, params, tol);
}

// A layout's checkpoint after 3 steps, resumed in another layout for the
// rest of 6, lands on `ref_dir` (the uninterrupted run).
void expect_moves(const std::string& ref_dir, const std::string& name, int ranks_a,
                  const std::string& layout_a, int ranks_b, const std::string& layout_b,
                  const std::string& model = gpt(), int params = kParams) {
  const std::string dir = tmpdir(name);
  TrainRun a = train(dir, ranks_a, 3, layout_a, 8, model);
  ASSERT_EQ(a.code, 0) << a.out;
  TrainRun b = train(dir, ranks_b, 6, "--resume " + layout_b, 8, model);
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
  expect_same(ref_dir, dir, 1e-5, params);
}

bool have_text() { return std::filesystem::exists(kText); }

TEST(PpCli, StagesEqualOneProcessOnTheGpt) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = train(tmpdir("one"), 1, 6, "");
  ASSERT_EQ(one.code, 0) << one.out;
  for (int p : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("--pp {}", p));
    TrainRun pp = train(tmpdir("pp"), p, 6, fmt::format("--pp {} --micro-batches 4", p));
    ASSERT_EQ(pp.code, 0) << pp.out;
    EXPECT_NE(pp.out.find(fmt::format("pipeline of {} stages, 4 micro-batches", p)),
              std::string::npos)
        << pp.out;
    expect_same(one.dir, pp.dir);
    // The job's metrics are the last stage's, reported once.
    EXPECT_NE(pp.out.find("final: validation"), std::string::npos) << pp.out;
  }
}

TEST(PpCli, GPipeAndOneForwardOneBackwardGiveTheSameBits) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun a = train(tmpdir("1f1b"), 2, 4, "--pp 2 --micro-batches 8 --pp-schedule 1f1b", 16);
  TrainRun b = train(tmpdir("gpipe"), 2, 4, "--pp 2 --micro-batches 8 --pp-schedule gpipe", 16);
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  auto ca = last_checkpoint(a.dir), cb = last_checkpoint(b.dir);
  ASSERT_TRUE(ca.ok() && cb.ok());
  EXPECT_TRUE(testing::same_bits(*ca, *cb));
  // 1F1B holds at most P micro-batches' activations on the first stage,
  // GPipe all 8: rank 0's planned step arena is smaller.
  EXPECT_GT(testing::step_arena(a.out), 0);
  EXPECT_LT(testing::step_arena(a.out), 0.8 * testing::step_arena(b.out)) << a.out << b.out;
}

// 4 ranks: 2 data-parallel groups of 2 stages, each group on its half of
// the global batch of 16, against one process on all 16.
TEST(PpCli, DataParallelGroupsOfPipelinesEqualOneProcess) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = train(tmpdir("dp1"), 1, 5, "", 16);
  ASSERT_EQ(one.code, 0) << one.out;
  TrainRun both = train(tmpdir("dp2pp2"), 4, 5, "--pp 2 --dp 2 --micro-batches 2");
  ASSERT_EQ(both.code, 0) << both.out;
  EXPECT_NE(both.out.find("2 data-parallel groups x 2 pipeline stages"), std::string::npos)
      << both.out;
  expect_same(one.dir, both.dir);
  // The run's header says the batch is each group's, not each rank's.
  auto header = run_shoal(
      fmt::format("run -n 4 --timeout 120 -- {} train {} --batch 8 --max-steps 1 --pp 2 --dp 2 "
                  "--micro-batches 2 --no-plot --no-checkpoints --out {}",
                  SHOAL_BINARY, gpt(), tmpdir("header")));
  ASSERT_EQ(header.code, 0) << header.out;
  EXPECT_NE(header.out.find("batch 8 per data-parallel group x 2 groups of 2 ranks"),
            std::string::npos)
      << header.out;
}

// 4 ranks as 2 stages of 2 tensor-parallel ranks each, and 8 with 2
// data-parallel groups of those: the pipeline cuts
// the tensor-parallel graph; each stage's slices are gathered within the
// stage, then broadcast along the pipeline. A checkpoint of that layout
// resumes in one process onto the uninterrupted run.
TEST(PpCli, TensorParallelStagesEqualOneProcess) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = train(tmpdir("tp1"), 1, 6, "");
  ASSERT_EQ(one.code, 0) << one.out;
  TrainRun both = train(tmpdir("tp2pp2"), 4, 6, "--tp 2 --pp 2");
  ASSERT_EQ(both.code, 0) << both.out;
  EXPECT_NE(both.out.find("pipeline of 2 stages"), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("tensor parallel over 2 ranks"), std::string::npos) << both.out;
  expect_same(one.dir, both.dir);
  expect_moves(one.dir, "tp2pp2move", 4, "--tp 2 --pp 2", 1, "");
  // All three on 8 ranks: 2 data-parallel groups (batch 8 each) x 2 stages
  // x 2 tensor-parallel ranks, against one process on the batch of 16.
  TrainRun one16 = train(tmpdir("one16"), 1, 5, "", 16);
  ASSERT_EQ(one16.code, 0) << one16.out;
  TrainRun all = train(tmpdir("3d"), 8, 5, "--tp 2 --pp 2 --dp 2");
  ASSERT_EQ(all.code, 0) << all.out;
  EXPECT_NE(all.out.find("2 data-parallel groups x 2 pipeline stages x 2 tensor-parallel ranks"),
            std::string::npos)
      << all.out;
  expect_same(one16.dir, all.dir);
}

// ZeRO over each stage's data-parallel group: the ranks holding the same
// stage (and slice) shard its gradients and optimizer state. 2 groups x 2
// stages at stages 1 and 2, and 2 x 2 stages x 2 tensor ranks, equal one
// process on the whole batch; a ZeRO checkpoint resumes without ZeRO onto
// it; a resume in the same layout is bit-identical.
TEST(PpCli, ZeroShardsEachStageOverItsDataParallelGroup) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = train(tmpdir("z1"), 1, 6, "", 16);
  ASSERT_EQ(one.code, 0) << one.out;
  for (const char* layout :
       {"--pp 2 --dp 2 --zero 1", "--pp 2 --dp 2 --zero 2 --zero-bucket-mb 0.001",
        "--pp 2 --tp 2 --dp 2 --zero 1"}) {
    SCOPED_TRACE(layout);
    const int ranks = std::string(layout).find("--tp") != std::string::npos ? 8 : 4;
    TrainRun r = train(tmpdir("z"), ranks, 6, layout);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("(sharded)"), std::string::npos) << r.out;
    expect_same(one.dir, r.dir);
  }
  expect_moves(one.dir, "zmove", 4, "--pp 2 --dp 2 --zero 1", 4, "--pp 2 --dp 2");
  testing::expect_resume_bit_identical(
      [](const std::string& d, int steps, const std::string& extra) {
        return train(d, 4, steps, "--pp 2 --dp 2 --zero 2 " + extra);
      },
      tmpdir("zbits1"), tmpdir("zbits2"), 6);
  TrainRun alone = train(tmpdir("zalone"), 2, 1, "--pp 2 --zero 1");
  EXPECT_NE(alone.code, 0);
  EXPECT_NE(alone.out.find("--zero 1 with --pp 2 on 2 ranks: no data-parallel group"),
            std::string::npos)
      << alone.out;
}

TEST(PpCli, CheckpointsMoveBetweenOneProcessAndStages) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun ref = train(tmpdir("ref"), 1, 6, "");
  ASSERT_EQ(ref.code, 0) << ref.out;
  for (bool pp_first : {true, false}) {
    SCOPED_TRACE(pp_first ? "--pp 2, then one process" : "one process, then --pp 3");
    expect_moves(ref.dir, "move", pp_first ? 2 : 1, pp_first ? "--pp 2" : "", pp_first ? 1 : 3,
                 pp_first ? "" : "--pp 3");
  }
}

TEST(PpCli, AResumeInTheSameLayoutIsBitIdentical) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  testing::expect_resume_bit_identical(
      [](const std::string& dir, int steps, const std::string& extra) {
        return train(dir, 2, steps, "--pp 2 " + extra);
      },
      tmpdir("bits1"), tmpdir("bits2"), 6);
}

// The GPT's tied embedding and output head (wte.weight, read by the first
// stage's lookup and the last stage's head): both ends hold it and sum its
// gradient between them, Megatron's way, so the pipeline equals one process
// at 2 and 3 stages, with data-parallel groups and with tensor-parallel
// stages; a checkpoint holds it once and resumes in one process.
TEST(PpCli, ATiedEmbeddingIsHeldByBothEndsWithItsGradientSummed) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  const std::string tied = tied_gpt();
  auto same = [](const std::string& a_dir, const std::string& b_dir) {
    expect_same(a_dir, b_dir, 1e-5, kParams - 1);  // no separate head
  };
  TrainRun one = train(tmpdir("t1"), 1, 6, "", 8, tied);
  TrainRun one16 = train(tmpdir("t16"), 1, 6, "", 16, tied);
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(one16.code, 0) << one16.out;
  for (const char* layout : {"--pp 2", "--pp 3", "--pp 2 --dp 2", "--pp 2 --tp 2"}) {
    SCOPED_TRACE(layout);
    const std::string l = layout;
    const int ranks = l == "--pp 2" ? 2 : l == "--pp 3" ? 3 : 4;
    TrainRun r = train(tmpdir("t"), ranks, 6, l, 8, tied);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(
        r.out.find("'wte.weight' is held by stages 0, " + std::to_string(l == "--pp 3" ? 2 : 1)),
        std::string::npos)
        << r.out;
    same(l.find("--dp") != std::string::npos ? one16.dir : one.dir, r.dir);
  }
  expect_moves(one.dir, "tmove", 3, "--pp 3", 1, "", tied, kParams - 1);
}

// Interleaved stages (--pp-virtual 2): rank s holds pieces s and s + P of
// the GPT, each micro-batch goes round the ranks twice. The math is the
// plain pipeline's, op for op: the same bits as --pp without chunks, and
// one process's weights, also with data-parallel groups, tensor-parallel
// stages and a tied embedding (the first piece's and the last's).
TEST(PpCli, InterleavedChunksEqualOneProcessAndThePlainPipeline) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = train(tmpdir("v_one"), 1, 6, "");
  TrainRun plain = train(tmpdir("v_plain"), 2, 6, "--pp 2 --micro-batches 4");
  TrainRun two = train(tmpdir("v_two"), 2, 6, "--pp 2 --pp-virtual 2 --micro-batches 4");
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("pipeline of 2 stages of 2 interleaved chunks each, 4 micro-batches"),
            std::string::npos)
      << two.out;
  expect_same(one.dir, two.dir);
  auto a = last_checkpoint(plain.dir), b = last_checkpoint(two.dir);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(testing::same_bits(*a, *b));
  TrainRun one6 = train(tmpdir("v_one6"), 1, 6, "", 6);
  ASSERT_EQ(one6.code, 0) << one6.out;
  TrainRun three = train(tmpdir("v_three"), 3, 6, "--pp 3 --pp-virtual 2 --micro-batches 3", 6);
  ASSERT_EQ(three.code, 0) << three.out;
  expect_same(one6.dir, three.dir);
  TrainRun gpipe =
      train(tmpdir("v_gpipe"), 2, 6, "--pp 2 --pp-virtual 3 --micro-batches 2 --pp-schedule gpipe");
  ASSERT_EQ(gpipe.code, 0) << gpipe.out;
  expect_same(one.dir, gpipe.dir);
  TrainRun one16 = train(tmpdir("v_one16"), 1, 6, "", 16);
  ASSERT_EQ(one16.code, 0) << one16.out;
  TrainRun dp = train(tmpdir("v_dp"), 4, 6, "--pp 2 --pp-virtual 2 --dp 2 --micro-batches 2");
  ASSERT_EQ(dp.code, 0) << dp.out;
  expect_same(one16.dir, dp.dir);
  TrainRun tp = train(tmpdir("v_tp"), 4, 6, "--pp 2 --pp-virtual 2 --tp 2 --micro-batches 2");
  ASSERT_EQ(tp.code, 0) << tp.out;
  expect_same(one.dir, tp.dir);
  TrainRun tied_one = train(tmpdir("v_tied1"), 1, 6, "", 8, tied_gpt());
  TrainRun tied_two = train(tmpdir("v_tied2"), 2, 6, "--pp 2 --pp-virtual 2", 8, tied_gpt());
  ASSERT_EQ(tied_one.code, 0) << tied_one.out;
  ASSERT_EQ(tied_two.code, 0) << tied_two.out;
  EXPECT_NE(tied_two.out.find("'wte.weight' is held by stages 0, 1"), std::string::npos)
      << tied_two.out;
  expect_same(tied_one.dir, tied_two.dir, 1e-5, kParams - 1);  // no separate head
  // Refused by name: chunks without a pipeline; micro-batches not in groups of --pp.
  TrainRun alone = train(tmpdir("v_alone"), 2, 1, "--pp-virtual 2");
  EXPECT_NE(alone.code, 0);
  EXPECT_NE(alone.out.find("--pp-virtual 2 interleaves a pipeline's stages: it needs --pp > 1"),
            std::string::npos)
      << alone.out;
  TrainRun groups = train(tmpdir("v_groups"), 2, 1, "--pp 2 --pp-virtual 2 --micro-batches 1");
  EXPECT_NE(groups.code, 0);
  EXPECT_NE(groups.out.find("--micro-batches 1 is not a multiple of it"), std::string::npos)
      << groups.out;
}

// Interleaved stages with ZeRO over the data-parallel groups, resumed in
// the same layout (bit-identical), and a checkpoint of theirs resumed in a
// plain pipeline of another depth.
TEST(PpCli, InterleavedChunksShardResumeAndMoveToAnotherLayout) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one16 = train(tmpdir("vz_one16"), 1, 6, "", 16);
  ASSERT_EQ(one16.code, 0) << one16.out;
  TrainRun z = train(tmpdir("vz"), 4, 6,
                     "--pp 2 --pp-virtual 2 --dp 2 --micro-batches 2 --zero 2 "
                     "--zero-bucket-mb 0.001");
  ASSERT_EQ(z.code, 0) << z.out;
  EXPECT_NE(z.out.find("(sharded)"), std::string::npos) << z.out;
  expect_same(one16.dir, z.dir);
  testing::expect_resume_bit_identical(
      [](const std::string& d, int steps, const std::string& extra) {
        return train(d, 2, steps, "--pp 2 --pp-virtual 2 " + extra);
      },
      tmpdir("vbits1"), tmpdir("vbits2"), 6);
  TrainRun one = train(tmpdir("vm_one"), 1, 6, "");
  ASSERT_EQ(one.code, 0) << one.out;
  expect_moves(one.dir, "vmove", 2, "--pp 2 --pp-virtual 2", 3, "--pp 3");
}

TEST(PpCli, WhatDoesNotFitIsRefusedByName) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun mb = train(tmpdir("mb"), 2, 1, "--pp 2 --micro-batches 3");
  EXPECT_NE(mb.code, 0);
  EXPECT_NE(mb.out.find("--micro-batches 3 must divide --batch 8"), std::string::npos) << mb.out;
  // One process (no launcher) would train unsplit, as if --pp were not there.
  TrainRun alone = train(tmpdir("alone"), 1, 1, "--pp 2");
  EXPECT_NE(alone.code, 0);
  EXPECT_NE(alone.out.find("this is one process (no launcher's ranks in the environment)"),
            std::string::npos)
      << alone.out;
  EXPECT_NE(alone.out.find("--pp 2 must divide the job's 1 ranks"), std::string::npos) << alone.out;
  TrainRun ranks = train(tmpdir("ranks"), 3, 1, "--pp 2");
  EXPECT_NE(ranks.code, 0);
  EXPECT_NE(ranks.out.find("--pp 2 must divide the job's 3 ranks"), std::string::npos) << ranks.out;
  // Cuts 1 and 2 leave the middle stage reshapes and no parameter.
  TrainRun empty = train(tmpdir("empty"), 3, 1, "--pp 3 --pp-cuts 1,2");
  EXPECT_NE(empty.code, 0);
  EXPECT_NE(empty.out.find("stage 1 of 3 holds no parameter"), std::string::npos) << empty.out;
  TrainRun order = train(tmpdir("order"), 3, 1, "--pp 3 --pp-cuts 4,2");
  EXPECT_NE(order.code, 0);
  EXPECT_NE(order.out.find("cuts must be increasing indices below"), std::string::npos)
      << order.out;
  TrainRun z3 = train(tmpdir("z3"), 4, 1, "--pp 2 --zero 3");
  EXPECT_NE(z3.code, 0);
  EXPECT_NE(z3.out.find("--pp 2 with --zero 3: a stage would gather each parameter again for "
                        "every one of its --micro-batches"),
            std::string::npos)
      << z3.out;
  TrainRun bn = train(tmpdir("bn"), 2, 1, "--pp 2", 8, "--model cnn --limit-train 64");
  EXPECT_NE(bn.code, 0);
  EXPECT_NE(bn.out.find("--pp 2: the model keeps running statistics (batch norm: 4 buffers, the "
                        "first 'block1.bn.running_mean'), which a pipeline's stages do not carry"),
            std::string::npos)
      << bn.out;
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// `shoal run --bind layout`: with more ranks than CPUs (2, from taskset),
// each rank binds itself to CPU (data group + stage + tensor rank) mod 2:
// 2 pipelines of 2 stages put both first stages apart (0, 1, 1, 0; round
// the CPUs would give 0, 1, 0, 1), tensor peers apart too; an unknown
// SHOAL_BIND is refused by name.
TEST(PpCli, BindLayoutPutsRanksThatRunAtOnceOnDifferentCpus) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || testing::run_sh("taskset -c 0,1 true").code != 0)
    GTEST_SKIP() << "needs 2 CPUs and taskset";
  auto run = [&](const std::string& layout, const std::string& bind) {
    return testing::run_sh(fmt::format(
        "taskset -c 0,1 {} run -n 4 --timeout 120 {} -- {} train {} --batch 8 --max-steps 1 "
        "--threads 1 --no-plot --no-checkpoints --out {} {}",
        SHOAL_BINARY, bind, SHOAL_BINARY, gpt(2), tmpdir("bind"), layout));
  };
  auto pipes = run("--pp 2 --dp 2", "--bind layout");
  ASSERT_EQ(pipes.code, 0) << pipes.out;
  const std::vector<std::string> want = {
      "bound to CPU 0 of 0-1 (data group 0, stage 0, tensor rank 0)",
      "bound to CPU 1 of 0-1 (data group 0, stage 1, tensor rank 0)",
      "bound to CPU 1 of 0-1 (data group 1, stage 0, tensor rank 0)",
      "bound to CPU 0 of 0-1 (data group 1, stage 1, tensor rank 0)"};
  for (const auto& w : want) EXPECT_NE(pipes.out.find(w), std::string::npos) << w << pipes.out;
  auto tensors = run("--tp 2 --dp 2", "--bind layout");
  ASSERT_EQ(tensors.code, 0) << tensors.out;
  EXPECT_NE(tensors.out.find("bound to CPU 1 of 0-1 (data group 0, stage 0, tensor rank 1)"),
            std::string::npos)
      << tensors.out;
  EXPECT_NE(tensors.out.find("bound to CPU 1 of 0-1 (data group 1, stage 0, tensor rank 0)"),
            std::string::npos)
      << tensors.out;
  auto unbound = run("--pp 2 --dp 2", "");
  EXPECT_EQ(unbound.out.find("bound to CPU"), std::string::npos) << unbound.out;
  auto bad =
      testing::run_sh(fmt::format("SHOAL_BIND=sockets {} run -n 2 --timeout 120 -- {} train {} "
                                  "--max-steps 1 --no-plot --out {}",
                                  SHOAL_BINARY, SHOAL_BINARY, gpt(2), tmpdir("badbind")));
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("SHOAL_BIND=sockets is not layout or none"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace shoal
