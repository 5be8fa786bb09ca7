// Shoal started by other launchers, run for real where the machine has
// them (tools/install-deps.sh installs all three): torchrun from Debian's
// python3-torch (default static rendezvous through its agent's store, a
// restart, --standalone), MPICH's and OpenMPI's own mpirun with no store
// named, an MPI library that does not match its launcher, and a
// parameter-server job started the ps-lite way under both mpiruns.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "cli/run_shoal.h"
#include "free_port.h"
#include "temp_dir.h"

namespace {

using Result = shoal::testing::ShoalRun;
using shoal::testing::run_sh;

bool has(const Result& r, const std::string& s) { return r.out.find(s) != std::string::npos; }

const std::string kShoal = SHOAL_BINARY;
// A short data-parallel training run, in its own run directory.
std::string train(const std::string& dir) {
  return kShoal +
         " train --model mlp --max-steps 10 --limit-train 2048 --limit-test 256 "
         "--no-checkpoints --no-plot --out " +
         dir + "/run";
}

// Debian's own python3 (not another one earlier on PATH) with its torch,
// through the wrapper that fixes torch 1.13's start-up on Python 3.11.
std::string torchrun(const std::string& args) {
  return "timeout 120 /usr/bin/python3 " + std::string(SHOAL_SOURCE_DIR) +
         "/tools/torchrun.py --master_port " + std::to_string(shoal::testing::free_port()) + " " +
         args;
}
bool have_torch() { return run_sh("/usr/bin/python3 -c 'import torch'").code == 0; }

TEST(Torchrun, DefaultRendezvousGoesThroughTheAgentsStore) {
  if (!have_torch())
    GTEST_SKIP() << "Debian's python3-torch is not installed (tools/install-deps.sh installs it)";
  shoal::testing::TempDir dir("torchrun");
  Result r = run_sh(torchrun("--nproc_per_node 2 --no_python " + train(dir.path())));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "rendezvous through torchrun's store at 127.0.0.1:")) << r.out;
  EXPECT_TRUE(has(r, "2 ranks on this host x 1 thread on 2 cores")) << r.out;
  EXPECT_TRUE(has(r, "batch 64 per rank x 2 ranks")) << r.out;
  EXPECT_TRUE(has(r, "final: test accuracy")) << r.out;
  EXPECT_FALSE(has(r, "Address already in use")) << r.out;
}

// torchrun restarts its workers with the agent's store kept: each attempt
// meets under its own keys, so rank 0 of the first attempt does not hold
// its claim against the second.
// A rank that stops (SIGSTOP: alive, its sockets open, silent) under a
// launcher that watches only exits: its watcher names it within
// SHOAL_HEARTBEAT seconds and the job stops. Before, the others waited in
// their collective; resumed 8 s later, the job went on as if nothing
// happened (and a rank stopped for good cost SHOAL_COMM_TIMEOUT, 300 s).
TEST(Torchrun, AFrozenRankIsNamedWithinTheHeartbeatDeadline) {
  if (!have_torch())
    GTEST_SKIP() << "Debian's python3-torch is not installed (tools/install-deps.sh installs it)";
  shoal::testing::TempDir dir("torchrun_frozen");
  // A script, not sh -c: torchrun reads "$$" in its arguments as an escape.
  // 300 epochs: still training when rank 1 stops at 3 s on the fastest host
  // here (30 ended in 1.6 s on an EPYC); the heartbeat ends the job anyway.
  const std::string script = dir.path() + "/rank.sh";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\nif [ \"$RANK\" = 1 ]; then (sleep 3; kill -STOP $$; sleep 8; kill -CONT $$) "
         "& fi\nexec "
      << kShoal
      << " train --model mlp --epochs 300 --limit-train 8192 --limit-test 256 --no-checkpoints "
         "--no-plot --out "
      << dir.path() << "/run\n";
  }
  Result r = run_sh("chmod +x " + script + " && SHOAL_HEARTBEAT=3 " +
                    torchrun("--nproc_per_node 2 --no_python " + script));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "rank 1 (pid ")) << r.out;
  EXPECT_TRUE(has(r, ") sent no heartbeat for")) << r.out;
  EXPECT_TRUE(
      has(r, "(SHOAL_HEARTBEAT=3 s; noticed by rank 0): it is stopped, hung or unreachable"))
      << r.out;
  EXPECT_LT(r.seconds, 60) << r.out;
}

TEST(Torchrun, ARestartMeetsUnderFreshKeys) {
  if (!have_torch())
    GTEST_SKIP() << "Debian's python3-torch is not installed (tools/install-deps.sh installs it)";
  Result r =
      run_sh(torchrun("--nproc_per_node 2 --max_restarts 1 --no_python sh -c 'if [ "
                      "$TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 3; fi; exec " +
                      kShoal + " bench comm --max-bytes 4096 --seconds 0.01'"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "(keys under shoal/none/1)")) << r.out;
  EXPECT_TRUE(has(r, "recursive-doubling")) << r.out;
}

TEST(Torchrun, StandaloneRendezvous) {
  if (!have_torch())
    GTEST_SKIP() << "Debian's python3-torch is not installed (tools/install-deps.sh installs it)";
  Result r = run_sh(torchrun("--standalone --nproc_per_node 2 --no_python " + kShoal +
                             " bench comm --max-bytes 4096 --seconds 0.01"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "2 ranks, in place")) << r.out;
}

bool have_mpich() { return run_sh("command -v mpirun.mpich").code == 0; }

// MPICH exports neither a store nor a local thread count Shoal used to
// read: the ranks find a store rank 0 derives from the job, and split the
// cores between them.
TEST(Mpich, BareMpirunTrainsWithoutAStoreNamed) {
  if (!have_mpich()) GTEST_SKIP() << "mpich is not installed (tools/install-deps.sh installs it)";
  shoal::testing::TempDir dir("mpich");
  Result r = run_sh("timeout 120 mpirun.mpich -n 2 " + train(dir.path()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "rank 0 serves one at 127.0.0.1:")) << r.out;
  EXPECT_TRUE(has(r, "launcher (PMI)")) << r.out;
  EXPECT_TRUE(has(r, "2 ranks on this host x 1 thread on 2 cores")) << r.out;
  EXPECT_TRUE(has(r, "final: test accuracy")) << r.out;
}

// OpenMPI's libmpi under MPICH's Hydra sees a world of one in each process:
// refused, naming both worlds, instead of two independent jobs.
TEST(Mpich, AnMpiLibraryThatDisagreesWithItsLauncherIsRefused) {
  if (!have_mpich()) GTEST_SKIP() << "mpich is not installed (tools/install-deps.sh installs it)";
  Result r = run_sh("timeout 60 mpirun.mpich -n 2 env SHOAL_COMM_BACKEND=mpi " + kShoal +
                    " bench comm --max-bytes 4096 --seconds 0.01");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "MPI says rank 0 of 1, but the launcher (PMI) says rank 1 of 2")) << r.out;
  EXPECT_TRUE(has(r, "Open MPI")) << r.out;
}

TEST(OpenMpi, BareMpirunTrainsWithoutAStoreNamed) {
  if (run_sh("command -v mpirun.openmpi").code != 0)
    GTEST_SKIP() << "openmpi-bin is not installed (tools/install-deps.sh installs it)";
  shoal::testing::TempDir dir("ompi");
  Result r = run_sh("timeout 120 mpirun.openmpi --allow-run-as-root -n 2 " + train(dir.path()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "launcher (OpenMPI)")) << r.out;
  // OpenMPI binds each of 2 ranks to a core: each sees one, and says so
  // (before: "x 1 threads on 1 cores" on a 2-core host).
  EXPECT_TRUE(has(r, "2 ranks on this host x 1 thread bound to 1 core of 2")) << r.out;
  EXPECT_TRUE(has(r, "final: test accuracy")) << r.out;
}

// A parameter-server job the ps-lite way under an MPI launcher: one program
// per role (MPMD: scheduler, server, two workers), each told its role by
// DMLC_ROLE, all finding the scheduler through DMLC_PS_ROOT_URI/PORT.
// `per_role` gives the launcher's flag that sets a variable for one program.
Result ps_under(const std::string& mpirun, const std::string& dir,
                const std::function<std::string(const char*)>& per_role) {
  const std::string env = "env DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=" +
                          std::to_string(shoal::testing::free_port()) +
                          " DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=2 SHOAL_JOB_TOKEN=launcher-test ";
  const std::string worker = kShoal +
                             " train --dist ps --model mlp --limit-train 2048 --limit-test 256 "
                             "--threads 1 --batch 32 --max-steps 20 --no-plot --quiet --out " +
                             dir + "/run";
  return run_sh(env + "timeout 120 " + mpirun + " " + per_role("scheduler") + " -n 1 " + kShoal +
                " ps scheduler : " + per_role("server") + " -n 1 " + kShoal +
                " ps server : " + per_role("worker") + " -n 2 " + worker);
}

void expect_ps_job(const Result& r) {
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "ps scheduler: every worker has left; done")) << r.out;
  // Every push of both workers reached the server: 20 steps x 6 keys.
  EXPECT_TRUE(has(r, "pushes by worker: worker 0: 120, worker 1: 120")) << r.out;
  std::size_t finals = 0;
  for (std::size_t at = 0; (at = r.out.find("final: test accuracy", at)) != std::string::npos; ++at)
    ++finals;
  EXPECT_EQ(finals, 2u) << r.out;
}

TEST(OpenMpi, AParameterServerJobOneProgramPerRole) {
  if (run_sh("command -v mpirun.openmpi").code != 0)
    GTEST_SKIP() << "openmpi-bin is not installed (tools/install-deps.sh installs it)";
  shoal::testing::TempDir dir("ompi_ps");
  expect_ps_job(ps_under("mpirun.openmpi --allow-run-as-root --oversubscribe", dir.path(),
                         [](const char* role) { return std::string("-x DMLC_ROLE=") + role; }));
}

TEST(Mpich, AParameterServerJobOneProgramPerRole) {
  if (!have_mpich()) GTEST_SKIP() << "mpich is not installed (tools/install-deps.sh installs it)";
  shoal::testing::TempDir dir("mpich_ps");
  expect_ps_job(ps_under("mpirun.mpich", dir.path(),
                         [](const char* role) { return std::string("-env DMLC_ROLE ") + role; }));
}

// `shoal run --ps S,W --engine mpirun`: each server and worker is its own
// one-process mpirun launch (the launcher stays the scheduler), with the
// same flags under OpenMPI and MPICH. `mpirun` is the one first on PATH:
// `flavor` is put there.
void ps_through_shoal_run(const std::string& flavor) {
  const bool mpich = flavor.find("mpich") != std::string::npos;
  shoal::testing::TempDir dir("run_ps_mpirun");
  const std::string d = dir.path();
  std::filesystem::create_directories(d + "/bin");
  {
    std::ofstream f(d + "/bin/mpirun");
    f << "#!/bin/sh\nexec " << flavor << " \"$@\"\n";
  }
  std::filesystem::permissions(d + "/bin/mpirun", std::filesystem::perms::owner_all);
  const std::string path = "PATH=" + d + "/bin:$PATH ";
  Result r = run_sh(path + "timeout 150 " + kShoal +
                    " run --ps 2,2 --engine mpirun --timeout 120 --ps-snapshots " + d +
                    "/ps -- sh -c 'echo mpi=${OMPI_COMM_WORLD_SIZE:-$PMI_SIZE}; exec " + kShoal +
                    " train --dist ps --model mlp --limit-train 2048 --limit-test 256 --threads 1 "
                    "--batch 32 --max-steps 20 --no-plot --quiet --out " +
                    d + "/run'");
  ASSERT_EQ(r.code, 0) << r.out;
  int pushes = 0;
  for (std::size_t at = 0; (at = r.out.find("ps server: stopped; ", at)) != std::string::npos; ++at)
    pushes += std::atoi(r.out.c_str() + at + 20);
  EXPECT_EQ(pushes, 240) << r.out;  // 20 steps x 6 keys x 2 workers, over both servers
  // mpirun started each worker, as a world of one.
  std::size_t worlds = 0;
  for (std::size_t at = 0; (at = r.out.find("mpi=1\n", at)) != std::string::npos; ++at) ++worlds;
  EXPECT_EQ(worlds, 2u) << r.out;
  EXPECT_TRUE(has(r, "every worker has finished; the 2 parameter servers stopped")) << r.out;
  // A worker's exit code comes through mpirun, and the worker is named.
  Result bad = run_sh(path + "timeout 100 " + kShoal +
                      " run --ps 1,1 --engine mpirun --timeout 60 --ps-snapshots " + d +
                      "/ps2 -- sh -c 'exit 3'");
  EXPECT_NE(bad.code, 0) << bad.out;
  // MPICH's mpiexec, under load, at times dies of SIGPIPE (its proxy closed
  // first) instead of passing the code on: the worker is named either way.
  EXPECT_TRUE(has(bad, "worker 0 exited with code 3") ||
              (mpich && has(bad, "worker 0 was killed by signal 13")))
      << bad.out;
}

TEST(OpenMpi, ShoalRunPsLaunchesEveryRoleThroughMpirun) {
  if (run_sh("command -v mpirun.openmpi").code != 0)
    GTEST_SKIP() << "openmpi-bin is not installed (tools/install-deps.sh installs it)";
  ps_through_shoal_run("/usr/bin/mpirun.openmpi");
}

TEST(Mpich, ShoalRunPsLaunchesEveryRoleThroughMpirun) {
  if (!have_mpich()) GTEST_SKIP() << "mpich is not installed (tools/install-deps.sh installs it)";
  ps_through_shoal_run("/usr/bin/mpirun.mpich");
}

}  // namespace
