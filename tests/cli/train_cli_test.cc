// The `shoal train` command line: --config files (YAML and JSON), flags
// winning over the file, and clear refusals of unknown or invalid options.
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
  };
  for (const auto& c : cases) {
    Result r = shoal(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << "\n" << r.out;
  }
}

}  // namespace
