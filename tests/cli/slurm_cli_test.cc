// Shoal under a real Slurm (munged, slurmctld, four slurmd on this host,
// started by tools/slurm-cluster.sh for this suite): `shoal run --engine
// srun`, a bare srun with no store named, an sbatch batch shell, engine
// arguments, a cancelled job that must not be restarted, and a
// parameter-server job with one job step per role.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "cli/local_slurm.h"
#include "cli/run_shoal.h"
#include "free_port.h"
#include "temp_dir.h"

namespace {

using Result = shoal::testing::ShoalRun;
using shoal::testing::run_sh;
Result shoal(const std::string& args) { return shoal::testing::run_shoal(args); }

bool has(const Result& r, const std::string& s) { return r.out.find(s) != std::string::npos; }

// Against a real Slurm (munged, slurmctld, four slurmd on this host) that
// tools/slurm-cluster.sh starts for this suite.
class Srun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!shoal::testing::have_slurm()) return;
    dir_ = ::testing::TempDir() + "/shoal-slurm-" + std::to_string(getpid());
    started_ = shoal::testing::start_local_slurm(dir_);
  }
  static void TearDownTestSuite() { shoal::testing::stop_local_slurm(started_, dir_); }
  void SetUp() override {
    if (!shoal::testing::have_slurm())
      GTEST_SKIP() << "slurm-wlm is not installed (tools/install-deps.sh installs it)";
    ASSERT_TRUE(started_) << "tools/slurm-cluster.sh start failed";
  }
  static std::string dir_;
  static bool started_;
};
std::string Srun::dir_;
bool Srun::started_ = false;

TEST_F(Srun, RanksRunAsASlurmJobStep) {
  Result r = shoal(
      "run -n 4 --engine srun --timeout 60 -- sh -c 'echo id=$SLURM_PROCID of $SLURM_NTASKS "
      "node=$SLURMD_NODENAME store=${SHOAL_STORE%%:*}'");
  ASSERT_EQ(r.code, 0) << r.out;
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(has(r, "[rank " + std::to_string(i) + "] id=" + std::to_string(i) + " of 4"))
        << r.out;
  EXPECT_TRUE(has(r, "node=n2")) << r.out;  // spread over the fake nodes
}

TEST_F(Srun, FailedRankStopsTheStepAndIsNamed) {
  Result r = shoal(
      "run -n 3 --engine srun --timeout 60 -- sh -c 'if [ $SLURM_PROCID = 2 ]; then "
      "echo last words; exit 6; fi; sleep 30'");
  EXPECT_EQ(r.code, 6) << r.out;
  EXPECT_TRUE(has(r, "rank 2 exited with exit code 6 (under srun)")) << r.out;
  EXPECT_TRUE(has(r, "  | last words")) << r.out;
  EXPECT_LT(r.seconds, 15.0);
}

TEST_F(Srun, DataParallelTrainingUnderSrun) {
  Result r = shoal("run -n 2 --engine srun --timeout 120 -- " + std::string(SHOAL_BINARY) +
                   " train --model mlp --max-steps 20 --limit-train 2048 --limit-test 256 "
                   "--threads 1 --no-checkpoints --no-plot");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "batch 64 per rank x 2 ranks")) << r.out;
  EXPECT_TRUE(has(r, "final: test accuracy")) << r.out;
}

// A bare srun, no store named: rank 0 serves one on a port derived from the
// job and step ids, and two ranks on one node split its two cores.
TEST_F(Srun, BareSrunFindsItsStoreAndSplitsTheCores) {
  shoal::testing::TempDir dir("bare_srun");
  Result r = run_sh("timeout 120 srun -N 1 -n 2 " + std::string(SHOAL_BINARY) +
                    " train --model mlp --max-steps 10 --limit-train 2048 --limit-test 256 "
                    "--no-checkpoints --no-plot --out " +
                    dir.path() + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "rank 0 serves one at 127.0.0.1:")) << r.out;
  EXPECT_TRUE(has(r, "launcher (Slurm)")) << r.out;
  EXPECT_TRUE(has(r, "2 ranks on this host x 1 thread on 2 cores")) << r.out;
  EXPECT_TRUE(has(r, "batch 64 per rank x 2 ranks")) << r.out;
  EXPECT_TRUE(has(r, "final: test accuracy")) << r.out;
}

// The shell of `sbatch -n 2` has SLURM_PROCID=0 and SLURM_NTASKS=2 but is
// no job step: a plain `shoal train` there is one process, not rank 0 of 2
// waiting for a peer nobody started.
TEST_F(Srun, ABatchShellIsOneProcess) {
  shoal::testing::TempDir dir("sbatch");
  const std::string script = dir.path() + "/job.sh";
  FILE* f = std::fopen(script.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f,
               "#!/bin/sh\necho ntasks=$SLURM_NTASKS procid=$SLURM_PROCID\n"
               "%s train --model mlp --max-steps 5 --limit-train 1024 --limit-test 256 "
               "--no-checkpoints --no-plot --quiet --out %s/run\necho train-exit=$?\n",
               SHOAL_BINARY, dir.path().c_str());
  std::fclose(f);
  Result r = run_sh("cd " + dir.path() + " && timeout 60 sbatch -n 2 --wait -o " + dir.path() +
                    "/out.txt " + script);
  Result out = run_sh("cat " + dir.path() + "/out.txt");
  EXPECT_EQ(r.code, 0) << r.out << out.out;
  EXPECT_TRUE(has(out, "ntasks=2 procid=0")) << out.out;
  EXPECT_TRUE(has(out, "final: test accuracy")) << out.out;
  EXPECT_TRUE(has(out, "train-exit=0")) << out.out;
  EXPECT_FALSE(has(out, "rank 0 of 2")) << out.out;
  EXPECT_LT(r.seconds, 60.0) << out.out;
}

// Engine arguments go before `--`, in both spellings (issue: "--engine-arg
// swallows --").
TEST_F(Srun, EngineArgumentsBeforeTheDoubleDash) {
  for (const char* form : {"--engine-arg=-N2", "--engine-arg -N2"}) {
    Result r = shoal(std::string("run -n 2 --engine srun ") + form +
                     " --timeout 60 -- sh -c 'echo nodes=$SLURM_NNODES'");
    ASSERT_EQ(r.code, 0) << form << "\n" << r.out;
    EXPECT_TRUE(has(r, "[rank 0] nodes=2")) << form << "\n" << r.out;
    EXPECT_TRUE(has(r, "[rank 1] nodes=2")) << form << "\n" << r.out;
  }
}

// scancel is not a rank failure: with --max-restarts the job is not
// started again (it would take a new allocation each time), and the report
// says why.
TEST_F(Srun, ACancelledJobIsNotRestarted) {
  shoal::testing::TempDir dir("scancel");
  Result r = run_sh(
      "(" + std::string(SHOAL_BINARY) +
      " run -n 2 --engine srun --max-restarts 2 --timeout 60 -- sh -c 'echo up; sleep 30' > " +
      dir.path() + "/run.txt 2>&1; echo exit=$? >> " + dir.path() +
      "/run.txt) & "
      "for i in $(seq 1 100); do grep -q up " +
      dir.path() +
      "/run.txt 2>/dev/null && break; sleep 0.1; done; "
      "timeout 10 scancel $(timeout 10 squeue -h -o %i); wait; cat " +
      dir.path() + "/run.txt");
  EXPECT_TRUE(has(r, "exit=")) << r.out;
  EXPECT_FALSE(has(r, "exit=0")) << r.out;
  EXPECT_TRUE(has(r, "was stopped by srun from outside")) << r.out;
  EXPECT_TRUE(has(r, "CANCELLED AT")) << r.out;
  EXPECT_FALSE(has(r, "restarting all")) << r.out;
  EXPECT_LT(r.seconds, 30.0) << r.out;
}

// A parameter-server job under Slurm the ps-lite way: one job step per role
// (scheduler, two servers, two workers), the role in DMLC_ROLE, the
// scheduler's address in DMLC_PS_ROOT_URI/PORT; servers and workers take
// their indices from the scheduler.
TEST_F(Srun, AParameterServerJobOneStepPerRole) {
  shoal::testing::TempDir dir("srun_ps");
  const std::string d = dir.path(), b = SHOAL_BINARY;
  const int port = shoal::testing::free_port();  // tests run in parallel: not a guessed one
  Result r = run_sh(
      "export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=" + std::to_string(port) +
      " DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=2 SHOAL_JOB_TOKEN=srun-test; "
      "DMLC_ROLE=scheduler timeout 120 srun -N1 -n1 " +
      b + " ps scheduler > " + d + "/sched.log 2>&1 & DMLC_ROLE=server timeout 120 srun -N1 -n2 " +
      b + " ps server > " + d + "/servers.log 2>&1 & DMLC_ROLE=worker timeout 120 srun -N1 -n2 " +
      b +
      " train --dist ps --model mlp --limit-train 2048 --limit-test 256 --threads 1 --batch 32 "
      "--max-steps 20 --no-plot --quiet --out " +
      d + "/run; code=$?; wait; cat " + d + "/sched.log " + d + "/servers.log; exit $code");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "ps scheduler: every worker has left; done")) << r.out;
  EXPECT_TRUE(has(r, "server 1 at 127.0.0.1:")) << r.out;
  // Six keys over two servers: each server's pushes from both workers, and
  // all 20 x 6 x 2 of them in sum.
  int pushes = 0;
  for (std::size_t at = 0; (at = r.out.find("ps server: stopped; ", at)) != std::string::npos; ++at)
    pushes += std::atoi(r.out.c_str() + at + 20);
  EXPECT_EQ(pushes, 240) << r.out;
  EXPECT_TRUE(has(r, "final: test accuracy")) << r.out;
}

// The same job from `shoal run --ps 2,2 --engine srun`: every server and
// worker a one-task job step of its own, the launcher the scheduler.
TEST_F(Srun, ShoalRunPsPutsEveryRoleInAJobStep) {
  shoal::testing::TempDir dir("srun_run_ps");
  const std::string d = dir.path();
  Result r = shoal("run --ps 2,2 --engine srun --timeout 120 --ps-snapshots " + d +
                   "/ps -- sh -c 'echo slurm-job=$SLURM_JOB_ID; exec " + SHOAL_BINARY +
                   " train --dist ps --model mlp --limit-train 2048 --limit-test 256 --threads 1 "
                   "--batch 32 --max-steps 20 --no-plot --quiet --out " +
                   d + "/run'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "final: test accuracy")) << r.out;
  int pushes = 0;
  for (std::size_t at = 0; (at = r.out.find("ps server: stopped; ", at)) != std::string::npos; ++at)
    pushes += std::atoi(r.out.c_str() + at + 20);
  EXPECT_EQ(pushes, 240) << r.out;  // 20 steps x 6 keys x 2 workers, over both servers
  // Slurm ran them: each worker in a job of its own, and two servers beside.
  int workers = 0;
  for (std::size_t at = 0; (at = r.out.find("slurm-job=", at)) != std::string::npos; ++at)
    workers += std::isdigit(static_cast<unsigned char>(r.out[at + 10])) ? 1 : 0;
  EXPECT_EQ(workers, 2) << r.out;
  Result jobs = run_sh("timeout 5 squeue -h --states=all -o %j | grep -c '^shoal-ps-'");
  EXPECT_EQ(jobs.out, "4\n") << jobs.out;
}

}  // namespace
