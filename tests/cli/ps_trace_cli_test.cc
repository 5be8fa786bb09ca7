// `shoal run --ps S,W --trace FILE`: one Chrome trace with every worker's
// step (named by its id) and each parameter server's counters (traffic,
// answers waiting, round-close time, each worker's lag) on the same clock.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cli/run_shoal.h"
#include "shoal/core/file.h"
#include "temp_dir.h"

namespace shoal {
namespace {

// The servers write a metrics line a second, and traffic is a rate between
// two lines: the job must run for more than two seconds (24,576 images).
TEST(PsTraceCli, WorkersAndServersShareOneTrace) {
  const std::string dir = testing::scratch_dir("ps_trace");
  auto r = testing::run_shoal(fmt::format(
      "run --ps 2,2 --timeout 120 --ps-snapshots {0}/ps --trace {0}/trace.json -- {1} train "
      "--dist ps --model mlp --limit-train 24576 --limit-test 256 --threads 1 --batch 32 "
      "--epochs 1 --no-plot --quiet --out {0}/run",
      dir, SHOAL_BINARY));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("merged trace of 2 workers and 2 servers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("worker 1: 10 steps"), std::string::npos) << r.out;
  auto text = read_file(dir + "/trace.json");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  auto j = nlohmann::json::parse(*text);
  std::set<std::string> names, counters;
  double first_step = 1e300, last_step = 0, last_counter = 0;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e.value("ph", "");
    if (ph == "M" && e.value("name", "") == "process_name")
      names.insert(e["args"].value("name", ""));
    if (ph == "X") {
      first_step = std::min(first_step, e.value("ts", 0.0));
      last_step = std::max(last_step, e.value("ts", 0.0));
    }
    if (ph == "C") {
      counters.insert(e.value("name", ""));
      last_counter = std::max(last_counter, e.value("ts", 0.0));
      if (e.value("name", "") == "lag (steps)") {
        EXPECT_TRUE(e["args"].contains("worker 0")) << e;
      }
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"worker 0", "worker 1", "ps server 0", "ps server 1"}));
  for (const char* c : {"traffic MB/s", "answers waiting", "round close ms", "lag (steps)"})
    EXPECT_TRUE(counters.count(c)) << c;
  // One clock: the servers' last second falls within the workers' trace.
  EXPECT_GT(last_counter, first_step - 2e6);
  EXPECT_LT(last_counter, last_step + 2e6);
}

}  // namespace
}  // namespace shoal
