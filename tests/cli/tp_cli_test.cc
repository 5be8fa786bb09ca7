// Tensor parallelism in `shoal train --tp T` under `shoal run -n T`: every
// rank trains its slices of the GPT's attention and MLP on the same
// batches, and the checkpoint (whole tensors, gathered) equals one process
// after k steps, parameters and optimizer state, at T = 2 and 4; the MLP's
// fc1 -> fc2 pair splits the same way; a checkpoint moves from one process
// to T ranks and back; wrong sizes are refused by name.
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

const std::string kText = "/usr/share/games/fortunes/fortunes";

std::string gpt() {
  return "--model gpt --data text:" + kText +
         " --layers 2 --heads 4 --dim 16 --context 8 --limit-train 200 --limit-test 40";
}

using testing::TrainRun;

TrainRun train(const std::string& dir, int ranks, int steps, const std::string& extra,
               const std::string& model = gpt()) {
  auto r = run_shoal(fmt::format(
      "run -n {} --timeout 120 -- {} train {} --batch 8 --max-steps {} --threads 1 --optimizer "
      "momentum --lr 0.05 --deterministic --no-plot --quiet --out {} {}",
      ranks, SHOAL_BINARY, model, steps, dir, extra));
  return {dir, r.out, r.code};
}

std::string tmpdir(const std::string& name) { return testing::scratch_dir("tp_" + name) + "/run"; }

// One process on a batch of `batch` (the whole batch of several data-parallel groups).
TrainRun one_process(const std::string& name, int batch, int steps) {
  const std::string dir = tmpdir(name);
  auto r = run_shoal(
      fmt::format("train {} --batch {} --max-steps {} --threads 1 --optimizer momentum --lr 0.05 "
                  "--deterministic --no-plot --quiet --out {}",
                  gpt(), batch, steps, dir));
  return {dir, r.out, r.code};
}

void expect_same(const std::string& a_dir, const std::string& b_dir, int params) {
  testing::expect_same_training(a_dir, b_dir, params);
}

bool have_text() { return std::filesystem::exists(kText); }

TEST(TpCli, TRanksEqualOneProcessOnTheGpt) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = train(tmpdir("one"), 1, 6, "");
  ASSERT_EQ(one.code, 0) << one.out;
  for (int t : {2, 4}) {
    SCOPED_TRACE(fmt::format("--tp {}", t));
    TrainRun tp = train(tmpdir("tp"), t, 6, fmt::format("--tp {}", t));
    ASSERT_EQ(tp.code, 0) << tp.out;
    EXPECT_NE(tp.out.find("tensor parallel over " + std::to_string(t) +
                          " ranks: 4 regions, 21 "
                          "tensors split"),
              std::string::npos)
        << tp.out;
    // 2 blocks x 16 tensors + wte, wpe, ln_f (2).
    expect_same(one.dir, tp.dir, 36);
  }
}

// An untied token table is split by vocabulary rows, in any number of
// ranks: the fortunes file's 91 characters over 2 and 3 ranks (46 + 45,
// 30 + 30 + 31 rows), each rank looking up the ids it holds and the group
// summing; K steps equal one process, and so does the table in the
// checkpoint, gathered from uneven slices.
// The output head (untied here, tied in the tests above) likewise.
TEST(TpCli, AnUntiedTableSplitsByVocabularyInAnyNumberOfRanks) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  const std::string model = "--model gpt --data text:" + kText +
                            " --layers 1 --heads 6 --dim 12 --context 8 --untied --limit-train 200 "
                            "--limit-test 40";
  TrainRun one = train(tmpdir("vocab1"), 1, 5, "", model);
  ASSERT_EQ(one.code, 0) << one.out;
  for (int t : {2, 3}) {
    SCOPED_TRACE(fmt::format("--tp {}", t));
    TrainRun tp = train(tmpdir(fmt::format("vocab{}", t)), t, 5, fmt::format("--tp {}", t), model);
    ASSERT_EQ(tp.code, 0) << tp.out;
    EXPECT_NE(tp.out.find("vocabulary-parallel embedding param/wte"), std::string::npos) << tp.out;
    // The untied head's weight by the same rows: each rank its columns of the logits.
    EXPECT_NE(tp.out.find("vocabulary-parallel output head param/lm_head.weight"),
              std::string::npos)
        << tp.out;
    expect_same(one.dir, tp.dir, 21);
  }
}

TEST(TpCli, TheMlpSplitsItsFirstPairToo) {
  const std::string mlp = "--model mlp --limit-train 512 --limit-test 64";
  TrainRun one = train(tmpdir("mlp1"), 1, 4, "", mlp);
  TrainRun tp = train(tmpdir("mlp2"), 2, 4, "--tp 2", mlp);
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(tp.code, 0) << tp.out;
  EXPECT_NE(tp.out.find("columns [param/fc1.weight] -> rows [param/fc2.weight]"), std::string::npos)
      << tp.out;
  expect_same(one.dir, tp.dir, 6);
}

TEST(TpCli, CheckpointsMoveBetweenOneProcessAndTRanks) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun ref = train(tmpdir("ref"), 1, 6, "");
  ASSERT_EQ(ref.code, 0) << ref.out;
  std::string dir;
  for (bool tp_first : {true, false}) {
    SCOPED_TRACE(tp_first ? "--tp 2, then one process" : "one process, then --tp 2");
    dir = tmpdir("move");
    TrainRun a = train(dir, tp_first ? 2 : 1, 3, tp_first ? "--tp 2" : "");
    ASSERT_EQ(a.code, 0) << a.out;
    TrainRun b = train(dir, tp_first ? 1 : 2, 6, tp_first ? "--resume" : "--resume --tp 2");
    ASSERT_EQ(b.code, 0) << b.out;
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    expect_same(ref.dir, dir, 36);
  }
  // The whole weights serve `shoal sample` as any checkpoint does.
  auto s = run_shoal("sample --weights " + dir + " --chars 20");
  EXPECT_EQ(s.code, 0) << s.out;
}

// 4 ranks: 2 data-parallel groups of 2 tensor-parallel ranks, each group
// on its half of the global batch of 16, against one process on all 16.
TEST(TpCli, DataParallelGroupsOfTensorParallelRanksEqualOneProcess) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = one_process("dp1", 16, 5);
  ASSERT_EQ(one.code, 0) << one.out;
  const std::string one_dir = one.dir;
  // --batch 8 per rank: each group of 2 TP ranks trains on 8 of the 16.
  TrainRun both = train(tmpdir("dp2tp2"), 4, 5, "--tp 2 --dp 2");
  ASSERT_EQ(both.code, 0) << both.out;
  EXPECT_NE(both.out.find("2 data-parallel groups x 2 tensor-parallel ranks"), std::string::npos)
      << both.out;
  expect_same(one_dir, both.dir, 36);
  TrainRun bad = train(tmpdir("dp3"), 4, 1, "--tp 2 --dp 3");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--dp 3 x --tp 2 is 6 ranks, the job has 4"), std::string::npos)
      << bad.out;
}

// Sequence parallelism (--sequence-parallel): the residual stream, its
// layer norms and adds on 1/T of the rows between reduce-scatters and
// all-gathers. T = 2 and 4, 2 x 2 with data parallelism and 2 stages of
// 2 tensor ranks equal one process; a batch whose rows T does not divide leaves the stream whole,
// says why, and still equals one process.
TEST(TpCli, SequenceParallelismEqualsOneProcess) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = train(tmpdir("sp1"), 1, 6, "");
  ASSERT_EQ(one.code, 0) << one.out;
  for (int t : {2, 4}) {
    SCOPED_TRACE(fmt::format("--tp {}", t));
    TrainRun r = train(tmpdir("sp"), t, 6, fmt::format("--tp {} --sequence-parallel", t));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(fmt::format("sequence parallel: 1 region(s) of row-wise ops on 1/{} of "
                                     "the rows; 15 parameters' gradients summed in one all-reduce",
                                     t)),
              std::string::npos)
        << r.out;
    expect_same(one.dir, r.dir, 36);
  }
  // Stages of sequence-parallel tensor ranks (4 micro-batches of 2 rows),
  // also interleaved: 6 pieces of this 2-layer model, each holding the
  // norms' scales it reads (their tp_copy placed beside the norm, not where
  // a topological order left it: "stage 1 of 6 holds no parameter").
  for (const char* pp_flags : {"", " --pp-virtual 3"}) {
    SCOPED_TRACE(pp_flags);
    TrainRun pp =
        train(tmpdir("sppp"), 4, 6, std::string("--tp 2 --pp 2 --sequence-parallel") + pp_flags);
    ASSERT_EQ(pp.code, 0) << pp.out;
    expect_same(one.dir, pp.dir, 36);
  }
  TrainRun o16 = one_process("sp16", 16, 6);
  ASSERT_EQ(o16.code, 0) << o16.out;
  const std::string one16 = o16.dir;
  TrainRun dp = train(tmpdir("spdp"), 4, 6, "--tp 2 --dp 2 --sequence-parallel");
  ASSERT_EQ(dp.code, 0) << dp.out;
  expect_same(one16, dp.dir, 36);
  TrainRun o6 = one_process("sp6", 6, 6);
  ASSERT_EQ(o6.code, 0) << o6.out;
  const std::string one6 = o6.dir;
  const std::string odd_dir = tmpdir("spodd");
  auto odd = run_shoal(fmt::format(
      "run -n 4 --timeout 120 -- {} train {} --batch 6 --max-steps 6 --threads 1 --optimizer "
      "momentum --lr 0.05 --deterministic --no-plot --quiet --out {} --tp 4 --sequence-parallel",
      SHOAL_BINARY, gpt(), odd_dir));
  ASSERT_EQ(odd.code, 0) << odd.out;
  EXPECT_NE(odd.out.find("sequence parallel: 0 region(s)"), std::string::npos) << odd.out;
  EXPECT_NE(odd.out.find("rows, not a multiple of 4"), std::string::npos) << odd.out;
  expect_same(one6, odd_dir, 36);
}

// ZeRO over the data-parallel groups of tensor-parallel ranks: the ranks
// holding the same slices shard their gradients and optimizer state (3:
// the slices too, FSDP with TP). 2 x 2 ranks equal one process on the
// whole batch at stages 1, 2 and 3; the
// checkpoint (whole tensors: state gathered over the group, then over the
// slices) resumes without ZeRO and the reverse, landing on one process;
// a resume in the same layout is bit-identical.
TEST(TpCli, ZeroShardsEachSliceOverItsDataParallelGroup) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = one_process("z1", 16, 6);
  ASSERT_EQ(one.code, 0) << one.out;
  const std::string one_dir = one.dir;
  TrainRun tp_only = train(tmpdir("z0"), 4, 1, "--tp 2 --dp 2");
  ASSERT_EQ(tp_only.code, 0) << tp_only.out;
  const double slices = testing::numbers_after(tp_only.out, "memory on rank 0: parameters ").at(0);
  for (const char* zero : {"--zero 1", "--zero 2 --zero-bucket-mb 0.001", "--zero 3"}) {
    SCOPED_TRACE(zero);
    TrainRun r = train(tmpdir("z4"), 4, 6, std::string("--tp 2 --dp 2 ") + zero);
    ASSERT_EQ(r.code, 0) << r.out;
    auto params = testing::numbers_after(r.out, "memory on rank 0: parameters ");
    auto state = testing::numbers_after(r.out, ", optimizer state ");
    ASSERT_EQ(state.size(), 1u) << r.out;
    ASSERT_EQ(params.size(), 1u) << r.out;
    if (std::string(zero) == "--zero 3") {
      // The slices themselves held as row blocks over the group: rank 0
      // keeps about half of its slices, and the momentum of those.
      EXPECT_LT(params[0], slices * 0.6) << r.out;
      EXPECT_EQ(state[0], params[0]) << r.out;
    } else {
      // Rank 0's momentum: half its slices' elements (plus at most one per
      // bucket where a bucket does not split evenly).
      EXPECT_EQ(params[0], slices);
      EXPECT_GE(state[0], params[0] / 2) << r.out;
      EXPECT_LE(state[0], params[0] / 2 + 4 * 32) << r.out;
    }
    expect_same(one_dir, r.dir, 36);
  }
  for (auto [first, then] :
       {std::pair{"--zero 1", ""}, std::pair{"", "--zero 2"}, std::pair{"--zero 3", "--zero 1"}}) {
    SCOPED_TRACE(fmt::format("'{}', then '{}'", first, then));
    const std::string dir = tmpdir("zmove");
    TrainRun a = train(dir, 4, 3, std::string("--tp 2 --dp 2 ") + first);
    ASSERT_EQ(a.code, 0) << a.out;
    TrainRun b = train(dir, 4, 6, std::string("--tp 2 --dp 2 --resume ") + then);
    ASSERT_EQ(b.code, 0) << b.out;
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    expect_same(one_dir, dir, 36);
  }
  testing::expect_resume_bit_identical(
      [](const std::string& dir, int steps, const std::string& extra) {
        return train(dir, 4, steps, "--tp 2 --dp 2 --zero 1 " + extra);
      },
      tmpdir("zbits1"), tmpdir("zbits2"), 6);
  TrainRun alone = train(tmpdir("zalone"), 2, 1, "--tp 2 --zero 1");
  EXPECT_NE(alone.code, 0);
  EXPECT_NE(alone.out.find("--zero 1 with --tp 2 on 2 ranks: no data-parallel group"),
            std::string::npos)
      << alone.out;
}

// The same layout resumed: the same bits as the uninterrupted run.
TEST(TpCli, AResumeInTheSameLayoutIsBitIdentical) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  testing::expect_resume_bit_identical(
      [](const std::string& dir, int steps, const std::string& extra) {
        return train(dir, 2, steps, "--tp 2 " + extra);
      },
      tmpdir("bits1"), tmpdir("bits2"), 6);
}

TEST(TpCli, SizesThatDoNotFitAreRefusedByName) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun ranks = train(tmpdir("bad1"), 3, 1, "--tp 2");
  EXPECT_NE(ranks.code, 0);
  EXPECT_NE(ranks.out.find("--tp 2 must divide the job's 3 ranks"), std::string::npos) << ranks.out;
  auto ps = run_shoal("train --dist ps --tp 2 --max-steps 1 --no-checkpoints --quiet");
  EXPECT_NE(ps.code, 0);
  EXPECT_NE(ps.out.find("a parameter-server job (--dist ps) shards it over its servers"),
            std::string::npos)
      << ps.out;
  TrainRun sp = train(tmpdir("bad3"), 2, 1, "--sequence-parallel");
  EXPECT_NE(sp.code, 0);
  EXPECT_NE(sp.out.find("--sequence-parallel splits what tensor-parallel ranks repeat: it needs "
                        "--tp > 1, got --tp 1"),
            std::string::npos)
      << sp.out;
  // 2 heads cannot go to 3 ranks whole.
  TrainRun heads = train(tmpdir("bad2"), 3, 1, "--tp 3",
                         "--model gpt --data text:" + kText +
                             " --layers 2 --heads 2 --dim 16 --context 8 --limit-train 200");
  EXPECT_NE(heads.code, 0);
  EXPECT_NE(heads.out.find("2 units that are fewer than the ranks"), std::string::npos)
      << heads.out;
}

// Heads that T does not divide: 4 heads over 3 ranks (1, 1, 2) and the
// MLP's 64 hidden units (21, 21, 22), end to end: 6 momentum steps equal one
// process, and the checkpoint (gathered from slices of unequal length)
// resumes in one process onto it.
TEST(TpCli, HeadsThatTDoesNotDivideGoAsWholeHeads) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TrainRun one = train(tmpdir("h1"), 1, 6, "");
  ASSERT_EQ(one.code, 0) << one.out;
  TrainRun three = train(tmpdir("h3"), 3, 6, "--tp 3");
  ASSERT_EQ(three.code, 0) << three.out;
  expect_same(one.dir, three.dir, 36);
  const std::string dir = tmpdir("hmove");
  TrainRun a = train(dir, 3, 3, "--tp 3");
  ASSERT_EQ(a.code, 0) << a.out;
  TrainRun b = train(dir, 1, 6, "--resume");
  ASSERT_EQ(b.code, 0) << b.out;
  expect_same(one.dir, dir, 36);
}

}  // namespace
}  // namespace shoal
