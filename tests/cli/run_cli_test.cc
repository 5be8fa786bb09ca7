// `shoal run` (local engine): environment and output prefixing, gang
// stop with a report naming the failed rank, no orphans, clear refusals,
// and real collectives through the launcher's store and job token.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cli/run_shoal.h"

namespace {

using Result = shoal::testing::ShoalRun;
Result shoal(const std::string& args) { return shoal::testing::run_shoal(args); }

bool has(const Result& r, const std::string& s) { return r.out.find(s) != std::string::npos; }

TEST(Run, EveryRankGetsItsEnvironmentAndPrefix) {
  Result r = shoal(
      "run -n 3 -- sh -c 'echo rank=$SHOAL_RANK world=$SHOAL_WORLD_SIZE "
      "token=${#SHOAL_JOB_TOKEN} store=${SHOAL_STORE%%:*}'");
  ASSERT_EQ(r.code, 0) << r.out;
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(has(r, "[rank " + std::to_string(i) + "] rank=" + std::to_string(i) +
                           " world=3 token=32 store=127.0.0.1"))
        << r.out;
}

TEST(Run, OneFailingRankStopsAllWithAReport) {
  Result r = shoal(
      "run -n 3 -- sh -c 'echo up $SHOAL_RANK; if [ $SHOAL_RANK = 1 ]; then "
      "echo last words; exit 7; fi; sleep 30'");
  EXPECT_EQ(r.code, 7) << r.out;
  EXPECT_TRUE(has(r, "rank 1 exited with code 7; stopped all 3 ranks")) << r.out;
  EXPECT_TRUE(has(r, "  | last words")) << r.out;
  EXPECT_LT(r.seconds, 10.0);  // not the 30 s the others would sleep
}

TEST(Run, KilledRankIsNamedAndNothingIsOrphaned) {
  Result r = shoal(
      "run -n 3 -- sh -c 'if [ $SHOAL_RANK = 2 ]; then sleep 0.2; kill -9 $$; fi; "
      "sleep 31.25 & wait'");
  EXPECT_EQ(r.code, 128 + 9) << r.out;
  EXPECT_TRUE(has(r, "rank 2 was killed by signal 9")) << r.out;
  EXPECT_LT(r.seconds, 10.0);
  // The other ranks' background sleeps were in their process groups: gone.
  FILE* p = popen("pgrep -f 'slee[p] 31.25' | wc -l", "r");
  char buf[32] = {0};
  ASSERT_NE(std::fgets(buf, sizeof buf, p), nullptr);
  pclose(p);
  EXPECT_EQ(std::stoi(buf), 0) << "orphaned processes remain";
}

TEST(Run, BadInputIsRefusedClearly) {
  Result missing = shoal("run -n 2 -- no-such-command-xyz");
  EXPECT_EQ(missing.code, 127);
  EXPECT_TRUE(has(missing, "cannot start 'no-such-command-xyz'")) << missing.out;
  Result zero = shoal("run -n 0 -- true");
  EXPECT_NE(zero.code, 0);
  EXPECT_TRUE(has(zero, "--ranks")) << zero.out;
  Result timeout = shoal("run -n 2 --timeout 1 -- sleep 30");
  EXPECT_NE(timeout.code, 0);
  EXPECT_TRUE(has(timeout, "--timeout 1 s passed")) << timeout.out;
  EXPECT_LT(timeout.seconds, 10.0);
}

TEST(Run, CollectivesRunThroughTheLaunchersStoreAndToken) {
  Result r = shoal("run -n 3 -- " + std::string(SHOAL_BINARY) +
                   " bench comm --max-bytes 4096 --seconds 0.01");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "[rank 0] # shoal allreduce f32 sum, 3 ranks")) << r.out;
  EXPECT_TRUE(has(r, "4096")) << r.out;
}

}  // namespace
