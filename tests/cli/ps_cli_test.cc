// `shoal ps server` as a process: a worker (ps::Worker) pushes to it over
// loopback, SIGTERM stops it with its counts printed and its snapshot
// written, and a restarted server serves the same value and version.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "cli/run_shoal.h"
#include "free_port.h"
#include "shoal/core/status.h"
#include "shoal/ps/worker.h"
#include "temp_dir.h"

namespace {

using shoal::Deadline;
using shoal::Tensor;

struct ServerProc {
  pid_t pid = -1;
  int port = 0;
  std::string log;
};

// Starts `shoal ps server ARGS` with its output in `log`; waits (bounded)
// for the port it prints.
ServerProc start(const std::string& args, const std::string& log) {
  ServerProc p;
  p.log = log;
  p.pid = fork();
  if (p.pid == 0) {
    setenv("SHOAL_JOB_TOKEN", "ps-cli-token", 1);
    execl("/bin/sh", "sh", "-c",
          (std::string("exec ") + SHOAL_BINARY + " ps server " + args + " > " + log + " 2>&1")
              .c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 200 && p.port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line))
      if (auto at = line.find("listening on 127.0.0.1:"); at != std::string::npos)
        p.port = std::atoi(line.c_str() + at + 23);
  }
  return p;
}
std::string stop(ServerProc& p) {
  kill(p.pid, SIGTERM);
  int st = 0;
  waitpid(p.pid, &st, 0);
  std::ifstream in(p.log);
  return std::string((std::istreambuf_iterator<char>(in)), {}) +
         "\nexit=" + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

TEST(PsCli, AServerProcessServesStopsAndRestartsFromItsSnapshot) {
  shoal::testing::TempDir dir("ps_cli");
  const std::string args = "--mode async --optimizer sgd --lr 1 --snapshot " + dir.path() +
                           "/server.safetensors --snapshot-every 1";
  ServerProc s = start(args, dir.path() + "/a.log");
  ASSERT_GT(s.port, 0) << stop(s);
  {
    auto w = shoal::ps::Worker::connect({"127.0.0.1:" + std::to_string(s.port)}, "ps-cli-token", 0,
                                        Deadline::after_seconds(20));
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_TRUE((*w)->init("k", Tensor::from_vector(std::vector<float>{5, 6}, {2})).ok());
    auto pr = (*w)->push("k", 0, Tensor::from_vector(std::vector<float>{1, 2}, {2}),
                         Deadline::after_seconds(20));
    ASSERT_TRUE(pr.ok()) << pr.status().to_string();
  }
  const std::string out = stop(s);
  EXPECT_NE(out.find("1 pushes, 1 updates"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=0"), std::string::npos) << out;
  ServerProc again = start(args, dir.path() + "/b.log");
  ASSERT_GT(again.port, 0) << stop(again);
  auto w = shoal::ps::Worker::connect({"127.0.0.1:" + std::to_string(again.port)}, "ps-cli-token",
                                      0, Deadline::after_seconds(20));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto p = (*w)->pull("k", 1, Deadline::after_seconds(20));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->first, 1u);
  EXPECT_EQ(p->second.data<float>()[0], 4.f);
  EXPECT_EQ(p->second.data<float>()[1], 4.f);
  w->reset();
  const std::string out2 = stop(again);
  EXPECT_NE(out2.find("restored from"), std::string::npos) << out2;
}

// docs/ps.md: a server started again on its snapshot continues where it
// stopped. Inside a job started by hand (DMLC_* variables, no `shoal run`)
// it takes back the slot it had; before, it was refused ("server index 1
// is beyond DMLC_NUM_SERVER=1") unless an undocumented variable was set.
TEST(PsCli, AHandStartedServerRestartedOnItsSnapshotTakesItsSlotBack) {
  shoal::testing::TempDir dir("ps_cli_slot");
  const std::string d = dir.path();
  auto r = shoal::testing::run_sh(fmt::format(
      "export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT={1} DMLC_NUM_SERVER=1 "
      "DMLC_NUM_WORKER=1 SHOAL_JOB_TOKEN=slot; "
      "DMLC_ROLE=scheduler {0} ps scheduler > {2}/sched.log 2>&1 & S=$!; "
      "for run in a b; do "
      "DMLC_ROLE=server {0} ps server --snapshot {2}/server.safetensors > {2}/$run.log 2>&1 & "
      "P=$!; i=0; while [ $i -lt 500 ] && ! grep -qs 'registered as\\|rror' {2}/$run.log; do "
      "sleep 0.02; i=$((i+1)); done; kill -TERM $P; wait $P; echo \"$run exit=$?\"; done; "
      "kill -TERM $S; wait $S; cat {2}/a.log {2}/b.log",
      SHOAL_BINARY, shoal::testing::free_port(), d));
  EXPECT_NE(r.out.find("a exit=0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("b exit=0"), std::string::npos) << r.out;
  const auto first = r.out.find("registered as server 0 of 1");
  ASSERT_NE(first, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("registered as server 0 of 1", first + 1), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("is beyond DMLC_NUM_SERVER"), std::string::npos) << r.out;
}

// Roles started by hand with different counts are refused by name with
// both values at join (before: the scheduler and the server waited
// forever); the scheduler refuses a count of 0 or none as workers do.
TEST(PsCli, RolesThatCountDifferentlyAreRefusedByName) {
  shoal::testing::TempDir dir("ps_cli_counts");
  const std::string d = dir.path();
  auto r = shoal::testing::run_sh(fmt::format(
      "export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT={1} DMLC_NUM_SERVER=1 "
      "DMLC_NUM_WORKER=2 SHOAL_JOB_TOKEN=counts SHOAL_COMM_TIMEOUT=20; "
      "DMLC_ROLE=scheduler {0} ps scheduler > {2}/sched.log 2>&1 & S=$!; i=0; "
      "while [ $i -lt 500 ] && ! grep -qs listening {2}/sched.log; do sleep 0.02; i=$((i+1)); "
      "done; DMLC_ROLE=server DMLC_NUM_WORKER=3 {0} ps server; echo server rc=$?; "
      "DMLC_ROLE=scheduler DMLC_NUM_WORKER=0 {0} ps scheduler --port 0; echo zero rc=$?; "
      "unset DMLC_NUM_SERVER; DMLC_ROLE=scheduler {0} ps scheduler --port 0; echo unset rc=$?; "
      "kill -TERM $S; wait $S",
      SHOAL_BINARY, shoal::testing::free_port(), d));
  EXPECT_NE(r.out.find("this server has DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=3, but the job's first "
                       "role (the scheduler) has DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=2"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("server rc=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DMLC_NUM_WORKER=0 must be a number >= 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zero rc=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DMLC_NUM_SERVER=(unset) must be a number >= 1"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("unset rc=2"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 30) << r.out;
}

// A sync job started by hand whose worker dies: before, the servers
// closed rounds with the one worker left (it trained alone on half the
// batch, the math changed unseen), then it hung on its peer's loss vote
// until SHOAL_COMM_TIMEOUT, and the server and scheduler never exited.
// Now no round closes without every worker: the survivor is refused
// naming the lost worker, and every role ends within seconds.
TEST(PsCli, ASyncJobThatLosesAWorkerEndsNamedAndNoRoundClosesWithoutIt) {
  shoal::testing::TempDir dir("ps_cli_lost");
  const std::string d = dir.path();
  auto r = shoal::testing::run_sh(fmt::format(
      "export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT={1} DMLC_NUM_SERVER=1 "
      "DMLC_NUM_WORKER=2 SHOAL_JOB_TOKEN=lost SHOAL_COMM_TIMEOUT=100; cd {2}; "
      "T='train --dist ps --model mlp --limit-train 2048 --limit-test 256 --threads 1 --epochs 100 "
      "--no-plot'; R='timeout -s KILL 90 {0}'; "
      "DMLC_ROLE=scheduler $R ps scheduler > sched.log 2>&1 & S=$!; "
      "DMLC_ROLE=server $R ps server --metrics m.jsonl > server.log 2>&1 & P=$!; "
      "DMLC_ROLE=worker $R $T --out a > a.log 2>&1 & A=$!; "
      "DMLC_ROLE=worker $R $T --out b > b.log 2>&1 & B=$!; i=0; "
      "while [ $i -lt 600 ] && ! grep -qs '\"pushes\":[1-9]' m.jsonl; do sleep 0.05; "
      "i=$((i+1)); done; "
      "pkill -9 -P $A; t0=$(date +%s); wait $B; echo survivor rc=$?; wait $P; echo server rc=$?; "
      "wait $S; echo scheduler rc=$?; echo ended in $(( $(date +%s) - t0 )) s; "
      "cat b.log server.log sched.log",
      SHOAL_BINARY, shoal::testing::free_port(), d));
  EXPECT_NE(r.out.find("survivor rc=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("server rc=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("scheduler rc=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("connection closed before it left (did its process die?): a sync round "
                       "needs all 2 workers of the job"),
            std::string::npos)
      << r.out;
  EXPECT_LT(r.seconds, 60) << r.out;
  // Every round the server closed had both workers' pushes: as many rounds
  // as the worker with fewer pushes made (the survivor's pushes of the
  // round the dead worker never reached are counted, and refused).
  const auto at = r.out.find("updates, ");
  const auto by = r.out.find("pushes by worker: worker 0: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_NE(by, std::string::npos) << r.out;
  int rounds = -1, w0 = -1, w1 = -1;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "updates, %d sync rounds", &rounds), 1) << r.out;
  ASSERT_EQ(
      std::sscanf(r.out.c_str() + by, "pushes by worker: worker 0: %d, worker 1: %d", &w0, &w1), 2)
      << r.out;
  EXPECT_GT(rounds, 0) << r.out;
  EXPECT_EQ(rounds, std::min(w0, w1)) << r.out;
}

// A server of a job started by hand is stopped (SIGSTOP: alive, its
// connections open, silent). Before, its workers waited out the 300 s
// wait of a push-pull (SHOAL_COMM_TIMEOUT did not reach it) and the other
// servers, starved of heartbeats, blamed a worker. Now the workers name
// the server once it answers no heartbeat for SHOAL_PS_HEARTBEAT seconds.
TEST(PsCli, AFrozenServerOfAHandStartedJobIsNamedWithinItsHeartbeatDeadline) {
  shoal::testing::TempDir dir("ps_cli_frozen_server");
  const std::string d = dir.path();
  auto r = shoal::testing::run_sh(fmt::format(
      "export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT={1} DMLC_NUM_SERVER=2 "
      "DMLC_NUM_WORKER=2 SHOAL_JOB_TOKEN=frozen SHOAL_PS_HEARTBEAT=2; cd {2}; "
      "T='train --dist ps --model mlp --limit-train 2048 --limit-test 256 --threads 1 --epochs 100 "
      "--no-plot'; R='timeout -s KILL 90 {0}'; "
      "DMLC_ROLE=scheduler $R ps scheduler > sched.log 2>&1 & S=$!; "
      "DMLC_ROLE=server {0} ps server --metrics m.jsonl > s0.log 2>&1 & P=$!; "
      "DMLC_ROLE=server $R ps server > s1.log 2>&1 & Q=$!; "
      "DMLC_ROLE=worker $R $T --out a > a.log 2>&1 & A=$!; "
      "DMLC_ROLE=worker $R $T --out b > b.log 2>&1 & B=$!; i=0; "
      "while [ $i -lt 600 ] && ! grep -qs '\"pushes\":[1-9]' m.jsonl; do sleep 0.05; "
      "i=$((i+1)); done; kill -STOP $P; t0=$(date +%s); wait $A; echo a rc=$?; wait $B; "
      "echo b rc=$?; echo named in $(( $(date +%s) - t0 )) s; kill -CONT $P; kill $P $Q $S; "
      "wait; cat a.log b.log s1.log",
      SHOAL_BINARY, shoal::testing::free_port(), d));
  EXPECT_NE(r.out.find("a rc=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("b rc=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("answered no heartbeat for"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(SHOAL_PS_HEARTBEAT=2 s): it is stopped or hung"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("sent nothing for"), std::string::npos) << r.out;  // no worker blamed
  int named = 999;
  const auto at = r.out.find("named in ");
  ASSERT_NE(at, std::string::npos) << r.out;
  named = std::atoi(r.out.c_str() + at + 9);
  EXPECT_LE(named, 10) << r.out;
}

TEST(PsCli, AnUnknownOptimizerIsRefusedByName) {
  auto r = shoal::testing::run_shoal("ps server --optimizer adagrad");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("adagrad"), std::string::npos) << r.out;
}

}  // namespace
