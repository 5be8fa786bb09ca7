// `shoal run` (local engine): environment and output prefixing, gang
// stop with a report naming the failed rank, no orphans, clear refusals,
// and real collectives through the launcher's store and job token.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
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
  EXPECT_TRUE(has(r, "[rank 0] # shoal allreduce f32 sum, 3 ranks, in place")) << r.out;
  EXPECT_TRUE(has(r, "4096")) << r.out;
  // nccl-tests' other two, at 2 ranks (the ring) and 3 (direct where the
  // ranks reach each other's memory); 3 ranks do not divide 4096 B evenly.
  for (const char* op : {"reduce_scatter", "allgather"})
    for (int n : {2, 3}) {
      Result c =
          shoal(fmt::format("run -n {} -- {} bench comm --op {} --max-bytes 65536 "
                            "--seconds 0.01",
                            n, SHOAL_BINARY, op));
      ASSERT_EQ(c.code, 0) << c.out;
      EXPECT_TRUE(has(c, fmt::format("[rank 0] # shoal {} f32", op))) << c.out;
      EXPECT_TRUE(has(c, "65536")) << c.out;
    }
  Result bad = shoal("bench comm --op alltoall");
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(has(bad, "alltoall")) << bad.out;
}

TEST(Run, PortInUseAndUnreachableStoreAreRefused) {
  // Hold a port, then ask the launcher for it.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  Result busy = shoal("run -n 2 --store-port " + std::to_string(port) + " -- true");
  close(fd);
  EXPECT_EQ(busy.code, 2);
  EXPECT_TRUE(has(busy, "cannot start the rendezvous store on 127.0.0.1:" + std::to_string(port)))
      << busy.out;
  EXPECT_TRUE(has(busy, "Address already in use")) << busy.out;
  // A rank told to use a store nobody serves fails at once, naming it.
  FILE* p = popen(("SHOAL_STORE_WAIT=0.5 SHOAL_RANK=1 SHOAL_WORLD_SIZE=2 SHOAL_STORE=127.0.0.1:" +
                   std::to_string(port) + " " + SHOAL_BINARY +
                   " train --model mlp --max-steps 1 --no-checkpoints --no-plot 2>&1")
                      .c_str(),
                  "r");
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  int st = pclose(p);
  EXPECT_NE(WEXITSTATUS(st), 0);
  EXPECT_NE(out.find("store at 127.0.0.1:" + std::to_string(port) + " is unreachable"),
            std::string::npos)
      << out;
}

TEST(Run, MaxRestartsStartsEveryRankAgain) {
  // Fails on the first attempt only.
  Result r = shoal(
      "run -n 2 --max-restarts 2 -- sh -c 'echo attempt $SHOAL_RESTART_COUNT job $SHOAL_JOB_ID; "
      "[ $SHOAL_RESTART_COUNT -ge 1 ] || [ $SHOAL_RANK = 0 ] || exit 3'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "rank 1 exited with code 3")) << r.out;
  EXPECT_TRUE(has(r, "restarting all 2 ranks from the latest checkpoint (restart 1 of 2)"))
      << r.out;
  EXPECT_TRUE(has(r, "[rank 1] attempt 1")) << r.out;
  EXPECT_FALSE(has(r, "restart 2 of 2")) << r.out;
  // Always failing: K restarts, then the failed rank's code.
  Result bad = shoal("run -n 2 --max-restarts 2 -- sh -c '[ $SHOAL_RANK = 0 ] || exit 4'");
  EXPECT_EQ(bad.code, 4) << bad.out;
  EXPECT_TRUE(has(bad, "(restart 2 of 2)")) << bad.out;
  // Each restart waits twice as long as the one before (--restart-delay).
  EXPECT_TRUE(has(bad, "(restart 1 of 2) in 1 s")) << bad.out;
  EXPECT_TRUE(has(bad, "(restart 2 of 2) in 2 s")) << bad.out;
  EXPECT_GE(bad.seconds, 3.0) << bad.out;
}

// A usage error (exit code 2: a flag shoal train does not have) would fail
// every attempt the same way: it is not restarted.
TEST(Run, AUsageErrorIsNotRestarted) {
  Result r =
      shoal(std::string("run -n 2 --max-restarts 3 -- ") + SHOAL_BINARY + " train --no-such-flag");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r, "'--no-such-flag' is not an option of shoal train")) << r.out;
  EXPECT_TRUE(has(r,
                  "exit code 2 is a usage or input error, which a restart would repeat: not "
                  "restarted"))
      << r.out;
  EXPECT_FALSE(has(r, "restarting all")) << r.out;
}

// An engine argument that starts with dashes takes one word: before, `--`
// went with it and the command's own flags were refused as run's.
TEST(Run, EngineArgumentsThatLookLikeFlagsKeepTheCommandApart) {
  Result r = shoal(
      "run -n 2 --engine mpirun --engine-arg=-x --engine-arg=SHOAL_TRY=7 --engine-arg "
      "--display-map -- sh -c 'echo try=$SHOAL_TRY --out x'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "[rank 1] try=7 --out x")) << r.out;
}

TEST(Run, MpirunEngineNamesTheFailedRank) {
  Result ok = shoal(
      "run -n 2 --engine mpirun -- sh -c 'echo r=$OMPI_COMM_WORLD_RANK n=$OMPI_COMM_WORLD_SIZE "
      "store=${SHOAL_STORE%%:*} token=${#SHOAL_JOB_TOKEN}'");
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(has(ok, "[rank 1] r=1 n=2 store=127.0.0.1 token=32")) << ok.out;
  Result r = shoal(
      "run -n 3 --engine mpirun -- sh -c 'if [ $OMPI_COMM_WORLD_RANK = 1 ]; then echo last words; "
      "kill -9 $$; fi; sleep 31.5'");
  EXPECT_EQ(r.code, 128 + 9) << r.out;
  EXPECT_TRUE(has(r, "rank 1 was killed by signal 9")) << r.out;
  EXPECT_TRUE(has(r, "  | last words")) << r.out;
  EXPECT_LT(r.seconds, 15.0);
  FILE* p = popen("pgrep -f 'slee[p] 31.5' | wc -l", "r");
  char buf[32] = {0};
  ASSERT_NE(std::fgets(buf, sizeof buf, p), nullptr);
  pclose(p);
  EXPECT_EQ(std::stoi(buf), 0) << "orphaned processes remain";
}

}  // namespace

// --bind cores: ranks on their blocks of the launcher's CPUs (here the two
// `taskset` gives it), round the CPUs when ranks outnumber them;
// without it every rank may run anywhere the launcher may.
TEST(Run, BindCoresGivesEachRankItsBlockOfCpus) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  if (shoal::testing::run_sh("taskset -c 0,1 true").code != 0)
    GTEST_SKIP() << "taskset (util-linux) cannot run here";
  const std::string cpus = "sh -c 'grep Cpus_allowed_list /proc/self/status'";
  auto run = [&](const std::string& args) {
    return shoal::testing::run_sh("taskset -c 0,1 " + std::string(SHOAL_BINARY) + " run " + args +
                                  " -- " + cpus);
  };
  Result two = run("-n 2 --bind cores");
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_TRUE(has(two, "[rank 0] Cpus_allowed_list:\t0\n")) << two.out;
  EXPECT_TRUE(has(two, "[rank 1] Cpus_allowed_list:\t1\n")) << two.out;
  Result three = run("-n 3 --bind cores");
  ASSERT_EQ(three.code, 0) << three.out;
  EXPECT_TRUE(has(three, "3 ranks bound to 2 CPUs (0-1): rank 0: 0, rank 1: 1, rank 2: 0"))
      << three.out;
  EXPECT_TRUE(has(three, "[rank 1] Cpus_allowed_list:\t1\n")) << three.out;
  EXPECT_TRUE(has(three, "[rank 2] Cpus_allowed_list:\t0\n")) << three.out;
  Result one = run("-n 1 --bind cores");
  EXPECT_TRUE(has(one, "[rank 0] Cpus_allowed_list:\t0-1\n")) << one.out;
  Result free = run("-n 2");
  EXPECT_TRUE(has(free, "[rank 1] Cpus_allowed_list:\t0-1\n")) << free.out;
  Result bad = ::shoal::testing::run_shoal("run -n 2 --bind sockets -- true");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_TRUE(has(bad, "--bind 'sockets' is not one of none, cores")) << bad.out;
  Result srun = ::shoal::testing::run_shoal("run -n 2 --engine srun --bind cores -- true");
  EXPECT_TRUE(has(srun, "--engine srun binds its own: --engine-arg=--cpu-bind=cores")) << srun.out;
}
