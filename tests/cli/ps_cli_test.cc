// `shoal ps server` as a process: a worker (ps::Worker) pushes to it over
// loopback, SIGTERM stops it with its counts printed and its snapshot
// written, and a restarted server serves the same value and version.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "cli/run_shoal.h"
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

TEST(PsCli, AnUnknownOptimizerIsRefusedByName) {
  auto r = shoal::testing::run_shoal("ps server --optimizer adagrad");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("adagrad"), std::string::npos) << r.out;
}

}  // namespace
