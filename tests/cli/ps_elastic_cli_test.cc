// Elastic parameter-server jobs: `shoal run --ps S,W --ps-elastic MIN:MAX`.
// A worker asked for with `shoal ps join` starts, takes the servers'
// weights and its pushes count; a failed worker is replaced while fewer
// than MIN train; requests beyond MAX are refused by count; an elastic sync
// job is refused by name; `shoal ps join` on a job that is not elastic
// says so.
#include <gtest/gtest.h>

#include <string>

#include "cli/cli_results.h"
#include "cli/run_shoal.h"
#include "free_port.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::numbers_after;
using testing::run_shoal;

// Each worker runs `before` (sh), then trains an async MLP for 2 epochs of
// 12,288 images: long enough (several seconds) that a worker asked for by
// `shoal ps join` starts before the others finish.
testing::ShoalRun elastic_job(const std::string& dir, const std::string& elastic,
                              const std::string& before, const std::string& mode = "async",
                              const std::string& extra = "") {
  return run_shoal(fmt::format(
      "run --ps 1,2 --ps-elastic {2} --timeout 120 --ps-snapshots {0}/ps -- sh -c '{3} exec {1} "
      "train --dist ps --ps-mode {4} --model mlp --limit-train 12288 --limit-test 256 --threads 1 "
      "--optimizer sgd --lr 0.05 --batch 32 --epochs 2 --no-plot --quiet --out {0}/run {5}'",
      dir, SHOAL_BINARY, elastic, before, mode, extra));
}

// Waits (bounded) until the job's first checkpoint is written.
std::string until_checkpoint(const std::string& dir) {
  return fmt::format(
      "i=0; while [ $i -lt 600 ] && ! ls {}/run/checkpoints/ckpt-*.safetensors >/dev/null 2>&1; "
      "do sleep 0.05; i=$((i+1)); done;",
      dir);
}

std::string join_once(const std::string& dir, int workers) {
  return fmt::format(
      "if mkdir {0}/once 2>/dev/null; then {1} ps join --job {0}/ps --workers {2}; "
      "fi;",
      dir, SHOAL_BINARY, workers);
}

TEST(PsElasticCli, AWorkerAskedForByPsJoinStartsAndItsPushesCount) {
  const std::string dir = testing::scratch_dir("ps_elastic_join");
  auto r = elastic_job(dir, "1:3", join_once(dir, 1));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("starting worker 2 (asked for by shoal ps join)"), std::string::npos)
      << r.out;
  EXPECT_EQ(numbers_after(r.out, "final: test accuracy ").size(), 3u) << r.out;
  // The servers count pushes from all three workers.
  EXPECT_NE(r.out.find("worker 2: "), std::string::npos) << r.out;
  const auto pushes = numbers_after(r.out, "ps server: stopped; ");
  ASSERT_EQ(pushes.size(), 1u) << r.out;
  EXPECT_GT(pushes[0], 0);
}

TEST(PsElasticCli, AFailedWorkerIsReplacedWhileFewerThanMinTrain) {
  const std::string dir = testing::scratch_dir("ps_elastic_replace");
  auto r =
      elastic_job(dir, "2:2", fmt::format("if mkdir {}/victim 2>/dev/null; then exit 3; fi;", dir));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("exited with code 3; the job is "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("starting worker 2 (a replacement: 1 of at least 2 training)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(numbers_after(r.out, "final: test accuracy ").size(), 2u) << r.out;
}

// One writer of checkpoints per job, whoever joins: a worker asked for
// once checkpoints exist takes a rank that is not 0 and trains; before, its
// id came out as rank 0, and it refused the job's own --out ("holds
// checkpoints of an earlier run") and died, or wrote beside worker 0.
TEST(PsElasticCli, AWorkerJoinedAfterACheckpointTrainsAndDoesNotWriteOne) {
  const std::string dir = testing::scratch_dir("ps_elastic_ckpt_join");
  auto r = elastic_job(dir, "1:3",
                       fmt::format("if mkdir {0}/once 2>/dev/null; then ({1} {2} ps join --job "
                                   "{0}/ps --workers 1) & fi;",
                                   dir, until_checkpoint(dir), SHOAL_BINARY),
                       "async", "--checkpoint-every 40");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("starting worker 2 (asked for by shoal ps join)"), std::string::npos)
      << r.out;
  EXPECT_EQ(numbers_after(r.out, "final: test accuracy ").size(), 3u) << r.out;
  EXPECT_EQ(r.out.find("holds checkpoints of an earlier run"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("writes the job's checkpoints"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("failed"), std::string::npos) << r.out;
}

// The writer (worker 0) dies after a checkpoint: its replacement takes the
// duty and continues the job's checkpoints from the newest one.
TEST(PsElasticCli, TheReplacementOfTheCheckpointWriterContinuesItsCheckpoints) {
  const std::string dir = testing::scratch_dir("ps_elastic_ckpt_writer");
  const std::string train = fmt::format(
      "{} train --dist ps --ps-mode async --model mlp --limit-train 12288 --limit-test 256 "
      "--threads 1 --optimizer sgd --lr 0.05 --batch 32 --epochs 2 --no-plot --quiet --out "
      "{}/run --checkpoint-every 40",
      SHOAL_BINARY, dir);
  auto r = run_shoal(fmt::format(
      "run --ps 1,2 --ps-elastic 2:2 --timeout 120 --ps-snapshots {0}/ps -- sh -c 'if [ "
      "\"$SHOAL_PS_WORKER_ID\" = 0 ]; then {1} & p=$!; {2} kill -9 $p; exit 3; fi; exec {1}'",
      dir, train, until_checkpoint(dir)));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("worker 0 exited with code 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("starting worker 2 (a replacement"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("worker 2: writes the job's checkpoints"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("holds checkpoints of an earlier run"), std::string::npos) << r.out;
  EXPECT_EQ(numbers_after(r.out, "final: test accuracy ").size(), 2u) << r.out;
}

TEST(PsElasticCli, LimitsAndMisuseAreNamed) {
  const std::string dir = testing::scratch_dir("ps_elastic_limits");
  // Asking for 3 more when MAX is 3 and 2 train: one starts, two refused.
  auto r = elastic_job(dir + "/max", "2:3", join_once(dir + "/max", 3));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 more worker(s) asked for, but 3 train (--ps-elastic max 3)"),
            std::string::npos)
      << r.out;
  auto s = elastic_job(dir + "/sync", "2:3", "", "sync");
  EXPECT_NE(s.code, 0) << s.out;
  EXPECT_NE(s.out.find("--ps-elastic needs an async or bounded job"), std::string::npos) << s.out;
  auto bad = run_shoal(fmt::format("run --ps 1,2 --ps-elastic 3:4 -- true"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--ps-elastic 3:4: expected MIN:MAX with 1 <= MIN <= 2"),
            std::string::npos)
      << bad.out;
  auto nojob = run_shoal(fmt::format("ps join --job {}/nowhere", dir));
  EXPECT_EQ(nojob.code, 2);
  EXPECT_NE(nojob.out.find("job.env is not there"), std::string::npos) << nojob.out;
}

// A flood of silent connections fills the store's handshake slots for
// 127.0.0.1; `shoal ps join` retries with backoff until they are dropped
// and reaches the job (before: "Broken pipe" at once).
TEST(PsElasticCli, PsJoinRidesOutAConnectionFlood) {
  testing::TempDir dir("ps_join_flood");
  const std::string d = dir.path();
  const int port = testing::free_port();
  auto r = testing::run_sh(fmt::format(
      "bash -c 'export DMLC_PS_ROOT_PORT={1} DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1 "
      "SHOAL_JOB_TOKEN=flood; DMLC_ROLE=scheduler {0} ps scheduler > {2}/sched.log 2>&1 & S=$!; "
      "i=0; while [ $i -lt 500 ] && ! grep -qs listening {2}/sched.log; do sleep 0.02; "
      "i=$((i+1)); done; printf \"SHOAL_STORE=127.0.0.1:{1}\\nSHOAL_JOB_TOKEN=flood\\n\" > "
      "{2}/job.env; for i in $(seq 80); do exec {{fd}}<>/dev/tcp/127.0.0.1/{1}; done; "
      "{0} ps join --job {2}; echo rc=$?; kill $S; wait $S'",
      SHOAL_BINARY, port, d));
  // It reached the store: the job answers that it is not elastic.
  EXPECT_NE(r.out.find("was not started with --ps-elastic"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Broken pipe"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 40) << r.out;
}

}  // namespace
}  // namespace shoal
