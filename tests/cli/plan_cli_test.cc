// `shoal plan` as a user runs it: calibrate a GPT on 2 ranks, write
// the plan, train it under `shoal run` with `shoal train --plan`, and read
// the check of the prediction; a memory budget nothing fits is refused with
// the least a rank would need, one that rules out plain data parallelism
// picks a layout that fits and trains; bad plan files and calibrations are
// named.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cli/run_shoal.h"
#include "shoal/core/file.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::run_shoal;

const std::string kText = "/usr/share/games/fortunes/fortunes";
// Steps of ~30 ms on 2 ranks: long enough that the fixed costs per step
// the model leaves out (the launcher, the loader) do not decide the check.
const std::string kModel = fmt::format(
    "--model gpt --data text:{} --layers 2 --heads 4 --dim 128 --context 64 --optimizer adam",
    kText);

bool have_text() { return std::filesystem::exists(kText); }

// `shoal plan -n 2` of the GPT, 32 samples a step; its calibration
// kept in `dir` for the next runs.
testing::ShoalRun plan(const std::string& dir, const std::string& extra = "") {
  const std::string cal = dir + "/calibration.json";
  const std::string source =
      std::filesystem::exists(cal) ? "--calibration " + cal : "--save-calibration " + cal;
  return run_shoal(
      fmt::format("plan -n 2 {} --batch 32 --out {}/plan.yaml --json {}/all.json {} {}", kModel,
                  dir, dir, source, extra));
}

testing::ShoalRun train(const std::string& dir, const std::string& plan_file) {
  return run_shoal(
      fmt::format("run -n 2 --timeout 300 -- {} train {} --plan {} --max-steps 30 --limit-test 32 "
                  "--no-checkpoints --no-plot --quiet --trace {}/t.json --out {}/run",
                  SHOAL_BINARY, kModel, plan_file, dir, dir));
}

// One calibration and one 30-step run of its plan: measured / predicted
// step time, or 0 when the run printed no check (the test then fails).
double planned_run_ratio(const std::string& dir, testing::ShoalRun& t) {
  std::filesystem::remove(dir + "/calibration.json");
  auto p = plan(dir);
  EXPECT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("compute ms"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("run it: shoal run -n 2 shoal train --plan"), std::string::npos) << p.out;
  auto text = read_file(dir + "/plan.yaml");
  EXPECT_TRUE(text.ok());
  if (p.code != 0 || !text.ok()) return 0;
  EXPECT_NE(text->find("plan-step-seconds:"), std::string::npos) << *text;
  t = train(dir, dir + "/plan.yaml");
  EXPECT_EQ(t.code, 0) << t.out;
  std::smatch m;
  const std::regex step(R"(plan check: step ([\d.]+) ms measured, ([\d.]+) ms predicted)");
  EXPECT_TRUE(std::regex_search(t.out, m, step)) << t.out;
  if (t.code != 0 || m.empty()) return 0;
  return std::stod(m[1]) / std::stod(m[2]);
}

TEST(PlanCli, PlansTrainsAndChecksItsPrediction) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  const std::string dir = testing::scratch_dir("plan_run");
  // The goal is 20% (bench/plan.py); a test on a loaded 2-core machine
  // allows twice that, and still fails a model that is wrong by a factor.
  // This VM's speed drifts by a third between runs of the same process
  // (one rank of the GPT, alone, 30 steps: 27.7k to 37.3k tokens/s), and
  // the calibration and the run are seconds apart; so the pair is tried
  // up to three times, and one within 40% passes. A model off by a factor
  // is off every time.
  testing::ShoalRun t{};
  std::vector<double> ratios;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const double r = planned_run_ratio(dir, t);
    if (r <= 0) return;  // said by the EXPECTs above
    ratios.push_back(r);
    if (std::abs(r - 1.0) <= 0.4) break;
  }
  EXPECT_LE(std::abs(ratios.back() - 1.0), 0.4) << "measured / predicted in " << ratios.size()
                                                << " tries: " << fmt::format("{}", ratios) << "\n"
                                                << t.out;
  const std::regex holds(R"(plan check: rank (\d) holds ([\d.]+) MB, ([\d.]+) MB predicted)");
  int ranks = 0;
  for (auto it = std::sregex_iterator(t.out.begin(), t.out.end(), holds);
       it != std::sregex_iterator(); ++it, ++ranks)
    EXPECT_NEAR(std::stod((*it)[2]) / std::stod((*it)[3]), 1.0, 0.25) << it->str();
  EXPECT_EQ(ranks, 2) << t.out;
}

TEST(PlanCli, AMemoryBudgetPicksALayoutThatFitsOrNamesTheLeastNeeded) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  const std::string dir = testing::scratch_dir("plan_budget");
  auto p = plan(dir);
  ASSERT_EQ(p.code, 0) << p.out;
  auto all = nlohmann::json::parse(*read_file(dir + "/all.json"));
  double plain = 0, least = 1e18;
  for (const auto& c : all) {
    least = std::min(least, c["memory_bytes"].get<double>());
    if (c["dp"] == 2 && c["zero"] == 0 && c["micro_batches"] == 1 && c["recompute"] == "none")
      plain = c["memory_bytes"].get<double>();
  }
  ASSERT_GT(plain, least);
  // Below plain data parallelism's need: another layout, and it trains.
  const double budget = (plain + least) / 2;
  auto fit = plan(dir, fmt::format("--mem-per-rank {}", budget / 1e9));
  ASSERT_EQ(fit.code, 0) << fit.out;
  auto chosen = read_file(dir + "/plan.yaml");
  ASSERT_TRUE(chosen.ok());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*chosen, m, std::regex(R"(plan-memory-bytes: (\d+))")));
  EXPECT_LE(std::stod(m[1]), budget) << *chosen;
  auto t = train(dir, dir + "/plan.yaml");
  EXPECT_EQ(t.code, 0) << t.out;
  // Below every layout's: refused, with the least a rank needs.
  auto none = plan(dir, fmt::format("--mem-per-rank {}", least / 2 / 1e9));
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_NE(none.out.find(fmt::format("the smallest needs {:.3f} GB per rank", least / 1e9)),
            std::string::npos)
      << none.out;
}

TEST(PlanCli, AutoPlansForTheJobItRunsIn) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  const std::string dir = testing::scratch_dir("plan_auto");
  // --batch 16 per rank: 32 samples a step over the 2 ranks, whatever the
  // layout; rank 0 plans while rank 1 waits for the plan in the store.
  auto t = run_shoal(
      fmt::format("run -n 2 --timeout 300 -- {} train {} --batch 16 --plan auto --max-steps 20 "
                  "--limit-test 32 --no-checkpoints --no-plot --quiet --out {}/run",
                  SHOAL_BINARY, kModel, dir));
  ASSERT_EQ(t.code, 0) << t.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      t.out, m, std::regex(R"(plan auto: --dp (\d) --tp (\d) --pp (\d).* --batch (\d+))")))
      << t.out;
  EXPECT_EQ(std::stoi(m[1]) * std::stoi(m[4]), 32) << m[0];  // the global batch kept
  EXPECT_NE(t.out.find("plan check: step"), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("plan auto:", m.position(0) + 1), std::string::npos)
      << "planned more than once: " << t.out;
}

// The value of a plan-* key in a plan file's text (-1 if absent).
double plan_value(const std::string& text, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(key + R"(: ([\d.]+))"))) return -1;
  return std::stod(m[1]);
}

// A plan whose products were misjudged (set here to a tenth of what the
// calibration said, the step to half): the run's check names the products,
// not "compute" or "communication" at large.
TEST(PlanCli, AStepOffItsPlanNamesTheClassThatWasOff) {
  if (!have_text()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  const std::string dir = testing::scratch_dir("plan_off");
  auto p = plan(dir);
  ASSERT_EQ(p.code, 0) << p.out;
  auto text = read_file(dir + "/plan.yaml");
  ASSERT_TRUE(text.ok());
  const double step = plan_value(*text, "plan-step-seconds");
  const double products = plan_value(*text, "plan-products-seconds");
  ASSERT_GT(products, 0.3 * step) << *text;  // the GPT's step is mostly products
  // Products said 10x too slow: their error (9x their time) outweighs any
  // wait for a core that a loaded machine adds to the rest of the step (a
  // plan that said them 10x too fast erred by 0.9x, which such waits beat).
  std::string off = std::regex_replace(*text, std::regex(R"(plan-step-seconds: [\d.]+)"),
                                       fmt::format("plan-step-seconds: {:.6f}", step * 4));
  off = std::regex_replace(off, std::regex(R"(plan-products-seconds: [\d.]+)"),
                           fmt::format("plan-products-seconds: {:.6f}", products * 10));
  ASSERT_TRUE(write_file_atomic(dir + "/off.yaml", off).ok());
  auto t = train(dir, dir + "/off.yaml");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("the estimate most off is products (matmul, convolution)"),
            std::string::npos)
      << t.out;
}

TEST(PlanCli, BadPlansAndCalibrationsAreNamed) {
  const std::string dir = testing::scratch_dir("plan_bad");
  auto missing = run_shoal(fmt::format("train --plan {}/none.yaml", dir));
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("--plan " + dir + "/none.yaml: cannot open the file"),
            std::string::npos)
      << missing.out;
  ASSERT_TRUE(write_file_atomic(dir + "/bad.yaml", "tp: 2\nplan-step-seconds: fast\n").ok());
  auto bad = run_shoal(fmt::format("train --plan {}/bad.yaml", dir));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("a plan-* value is not a number"), std::string::npos) << bad.out;
  ASSERT_TRUE(write_file_atomic(dir + "/odd.yaml", "tensor-split: 2\n").ok());
  auto odd = run_shoal(fmt::format("train --plan {}/odd.yaml", dir));
  EXPECT_EQ(odd.code, 2);
  EXPECT_NE(odd.out.find("unknown option 'tensor-split'"), std::string::npos) << odd.out;
  ASSERT_TRUE(write_file_atomic(dir + "/cal.json",
                                "{\"ranks\": 4, \"threads\": 1, "
                                "\"overlap\": false, \"precision\": \"f32\", "
                                "\"steps\": [{\"rows\": 8}]}")
                  .ok());
  auto cal = run_shoal(fmt::format("plan -n 2 --calibration {}/cal.json", dir));
  EXPECT_EQ(cal.code, 1);
  EXPECT_NE(cal.out.find("plan calibration"), std::string::npos) << cal.out;
}

}  // namespace
}  // namespace shoal
