// The `shoal train` command line: --config files (YAML and JSON), flags
// winning over the file, and clear refusals of unknown or invalid options.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli/run_shoal.h"

namespace {
namespace fs = std::filesystem;

using Result = shoal::testing::ShoalRun;
Result shoal(const std::string& args) { return shoal::testing::run_shoal(args); }

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shoal_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(TrainCli, YamlConfigTrainsAndFlagsWin) {
  std::string out = (dir_ / "run").string();
  std::string cfg = file("c.yaml",
                         "model: mlp\nepochs: 3\nlimit_train: 512\nlimit-test: 200\nbatch: 32\n"
                         "optimizer: adam\nlr: 0.001\naugment: true\nno-plot: true\nout: " +
                             out + "\n");
  Result r = shoal("train --config " + cfg + " --epochs 1 --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("mlp on fashion-mnist (16 steps/epoch, batch 32), adam"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("after 1 epochs"), std::string::npos) << r.out;  // --epochs 1 won
  EXPECT_TRUE(fs::exists(out + "/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(out + "/checkpoints/ckpt-0000000016.safetensors"));
}

TEST_F(TrainCli, JsonConfigWorks) {
  std::string cfg = file("c.json",
                         R"({"model": "mlp", "epochs": 1, "limit_train": 256, "limit_test": 100,
                             "no_checkpoints": true, "no_plot": true, "quiet": true, "out": ")" +
                             (dir_ / "j").string() + "\"}");
  Result r = shoal("train --config " + cfg);
  EXPECT_EQ(r.code, 0) << r.out;
}

// --max-steps that ends inside an epoch still evaluates and reports, and
// --quiet keeps the final line (what scripts read).
TEST_F(TrainCli, MaxStepsInsideAnEpochEndsWithAResult) {
  std::string out = (dir_ / "short").string();
  Result r = shoal(
      "train --model mlp --max-steps 5 --limit-train 512 --limit-test 128 --batch 32 "
      "--threads 1 --no-plot --quiet --out " +
      out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("final: test accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("after 5 steps (epoch 1, partial)"), std::string::npos) << r.out;
  std::ifstream m(out + "/metrics.jsonl");
  std::string text((std::istreambuf_iterator<char>(m)), {});
  EXPECT_NE(text.find("\"kind\":\"epoch\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"partial\":true"), std::string::npos) << text;
}

// The README's resume line, `shoal train --out RUN --resume --epochs 8`:
// the run takes every flag it was started with (kept as RUN/options.yaml)
// unless the command line gives it again; one that disagrees with what the
// checkpoint records is refused by name. Before: "written with optimizer
// 'momentum', this run has 'sgd'" (the default) for the README's own line.
TEST_F(TrainCli, ResumeTakesTheFlagsTheRunStartedWith) {
  const std::string out = (dir_ / "run").string();
  Result r1 = shoal(
      "train --model mlp --limit-train 512 --limit-test 128 --batch 32 --optimizer momentum "
      "--lr 0.05 --schedule cosine --epochs 1 --threads 1 --no-plot --out " +
      out);
  ASSERT_EQ(r1.code, 0) << r1.out;
  ASSERT_TRUE(fs::exists(out + "/options.yaml"));
  Result r2 = shoal("train --out " + out + " --resume --epochs 2");
  ASSERT_EQ(r2.code, 0) << r2.out;
  EXPECT_NE(r2.out.find("mlp on fashion-mnist (16 steps/epoch, batch 32), momentum lr 0.05"),
            std::string::npos)
      << r2.out;
  EXPECT_NE(r2.out.find("resumed from"), std::string::npos) << r2.out;
  EXPECT_NE(r2.out.find("after 2 epochs"), std::string::npos) << r2.out;
  // Resumed again at its end: said so, and still a result line.
  Result done = shoal("train --out " + out + " --resume --epochs 2");
  EXPECT_EQ(done.code, 0) << done.out;
  EXPECT_NE(done.out.find("has already finished: step 32 of 32 (--epochs 2), nothing to train"),
            std::string::npos)
      << done.out;
  EXPECT_NE(done.out.find("final: test accuracy"), std::string::npos) << done.out;
  Result r3 = shoal("train --out " + out + " --resume --epochs 3 --optimizer sgd");
  EXPECT_NE(r3.code, 0) << r3.out;
  EXPECT_NE(r3.out.find("written with optimizer 'momentum', this run has 'sgd'"), std::string::npos)
      << r3.out;
}

// A checkpoint continues in another layout at the same global batch: one
// process of batch 32 goes on as 2 data-parallel ranks of 16; a different
// global batch is refused with both figures. Before: the per-rank batch
// was compared, so no layout change could resume.
TEST_F(TrainCli, AResumeInAnotherLayoutComparesTheGlobalBatch) {
  const std::string out = (dir_ / "layout").string();
  Result one = shoal(
      "train --model mlp --limit-train 512 --limit-test 128 --batch 32 --optimizer momentum "
      "--lr 0.05 --max-steps 4 --epochs 2 --threads 1 --no-plot --out " +
      out);
  ASSERT_EQ(one.code, 0) << one.out;
  Result two =
      shoal(fmt::format("run -n 2 --timeout 120 -- {} train --out {} --resume --batch 16 "
                        "--max-steps 8",
                        SHOAL_BINARY, out));
  EXPECT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("at step 4"), std::string::npos) << two.out;
  Result wrong = shoal("train --out " + out + " --resume --batch 16 --max-steps 12");
  EXPECT_NE(wrong.code, 0) << wrong.out;
  EXPECT_NE(wrong.out.find("global batch of 32 (per step, over all data-parallel ranks), this run "
                           "has 16 (--batch 16 x 1 data-parallel group)"),
            std::string::npos)
      << wrong.out;
}

// metrics.jsonl: each train record is the mean loss of the steps since the
// last one, with that count named (a running mean over the epoch drew a
// cliff at every epoch boundary); a resume from an earlier checkpoint than
// the last record drops the records past it, so steps never go backwards.
TEST_F(TrainCli, MetricsHoldWindowedLossesAndNeverGoBackwards) {
  const std::string out = (dir_ / "metrics").string();
  const std::string flags =
      "--model mlp --limit-train 512 --limit-test 64 --batch 32 --threads 1 --no-plot --quiet "
      "--checkpoint-every 10 --epochs 4 --out " +
      out;
  Result first = shoal("train " + flags + " --max-steps 40");
  ASSERT_EQ(first.code, 0) << first.out;
  // A crash after step 20's checkpoint: the records of 21-40 stay behind.
  fs::remove(out + "/checkpoints/ckpt-0000000040.safetensors");
  fs::remove(out + "/checkpoints/ckpt-0000000030.safetensors");
  Result again = shoal("train --out " + out + " --resume --max-steps 50");
  ASSERT_EQ(again.code, 0) << again.out;
  ASSERT_NE(again.out.find("at step 20"), std::string::npos) << again.out;
  std::ifstream in(out + "/metrics.jsonl");
  long last = -1, records = 0;
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("\"step\":");
    ASSERT_NE(at, std::string::npos) << line;
    const long step = std::atol(line.c_str() + at + 7);
    EXPECT_GE(step, last) << line;
    last = step;
    if (line.find("\"kind\":\"train\"") == std::string::npos) continue;
    ++records;
    EXPECT_NE(line.find("\"loss_steps\":1,"), std::string::npos) << line;  // 16 steps an epoch
    EXPECT_NE(line.find("\"images_per_s\""), std::string::npos) << line;
  }
  EXPECT_EQ(records, 50);
}

// OpenMP threads spin briefly, then sleep, unless the user says otherwise:
// libgomp's long default spin beside another busy process ran --threads 2
// below one thread's speed, sleeping at once cost idle hosts 20-37%
// (docs/BENCHMARKS.md, bench/omp_wait.sh). libgomp reads the setting when
// it loads, so the binary sets it and starts itself again.
TEST_F(TrainCli, OpenMpThreadsSpinBrieflyUnlessTold) {
  Result plain = shoal("info");
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_NE(plain.out.find("omp wait    spin 10000"), std::string::npos) << plain.out;
  auto told =
      shoal::testing::run_sh(std::string("OMP_WAIT_POLICY=active ") + SHOAL_BINARY + " info");
  EXPECT_NE(told.out.find("omp wait    active"), std::string::npos) << told.out;
}

TEST_F(TrainCli, BadOptionsAreNamed) {
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"train --config " + file("u.yaml", "model: mlp\nbogus: 3\n"), "unknown option 'bogus'"},
      {"train --config " + file("v.json", R"({"lr": "abc"})"), "--lr: expects a number, got 'abc'"},
      {"train --config " + file("w.yaml", "model: [mlp\n"), "not valid YAML/JSON at line 2"},
      {"train --config " + file("x.yaml", "augment: maybe\n"), "'augment' is a flag"},
      {"train --config " + (dir_ / "missing.yaml").string(), "cannot open"},
      {"train --model transformer", "--model: transformer is not one of"},
      {"train --epochs 0", "--epochs: must be > 0"},
      {"train --optimizer adagrad", "adagrad"},
      {"train --frobnicate", "frobnicate"},
      {"train --data /no/such/dir --quiet", "--data '/no/such/dir'"},
      {"train --tp 0", "--tp: must be >= 1, got 0"},
      {"trian --epochs 1", "'trian' is not a command of shoal: did you mean 'train'?"},
      {"train --epoch 1", "'--epoch' is not an option of shoal train: did you mean --epochs?"},
      {"ps sever", "'sever' is not a command of shoal ps: did you mean 'server'?"},
      {"train --micro-batches 0", "--micro-batches: must be >= 1, got 0"},
      {"train --model mlp --threads 100000 --max-steps 1 --limit-train 64 --no-plot",
       "--threads 100000 is more than the"},
  };
  for (const auto& c : cases) {
    Result r = shoal(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << "\n" << r.out;
  }
}

}  // namespace
