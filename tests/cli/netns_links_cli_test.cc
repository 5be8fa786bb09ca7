// Training across hosts when the link misbehaves: a host's link down (the
// rank named within the heartbeat deadline), 1% loss and 10 +- 10 ms of
// delay (the one-host weights, bit for bit), a link that comes back under
// a restarting launcher; and the links' token bucket (--burst).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>

#include "cli/netns_fixture.h"
#include "cli/run_shoal.h"
#include "temp_dir.h"

namespace shoal {
namespace {

// h2's link goes down mid-training: every rank stops within the heartbeat
// deadline (5 s here) and a tick, those on h1 naming the rank and host that
// went silent, those on h2 the store they can no longer reach; none waits
// out a collective's 300 s.
TEST_F(NetnsCluster, AHostWhoseLinkGoesDownIsNamedWithinTheHeartbeatDeadline) {
  const std::string dir = testing::scratch_dir("netns_down");
  const auto t0 = std::chrono::steady_clock::now();
  auto run = train_across(
      4, 2, "SHOAL_HEARTBEAT=5",
      "--model mlp --batch 16 --epochs 50 --limit-train 8192 --limit-test 256 --threads 1 "
      "--no-plot --quiet --out " +
          dir + "/run",
      dir, fmt::format("(sleep 3; {} --name {} fault h2 down) >/dev/null 2>&1 &", kTool, name_));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(run.code, 0);
  EXPECT_LT(took, 3 + 5 + 4) << run.out;  // down at 3 s, a 5 s deadline, ticks and exits
  // Which of h2's two ranks is named first, and which of them notices the
  // store rather than its host peer's exit, is a race; that one of each is
  // named is not.
  EXPECT_TRUE(std::regex_search(
      run.out, std::regex(R"(stopping: rank [23] \(pid \d+ on h2\) sent no heartbeat)")))
      << run.out;
  EXPECT_TRUE(std::regex_search(
      run.out, std::regex(R"(the job's store at 198\.18\.1\.1:29500 \(served by rank 0\) )"
                          R"(answered no heartbeat of rank [23])")))
      << run.out;
}

void NetnsCluster::expect_one_host_weights_under(const std::string& dir, const std::string& fault,
                                                 const std::string& out) {
  auto one = train_on_one_host(dir, kTrain);
  ASSERT_EQ(one.code, 0) << one.out;
  auto f = run_sh(fmt::format("{} --name {} fault h2 {}", kTool, name_, fault));
  ASSERT_EQ(f.code, 0) << f.out;
  auto run = train_across(4, 2, "SHOAL_ALLREDUCE_ALGO=ring",
                          fmt::format("{} --out {}/{}", kTrain, dir, out), dir);
  ASSERT_EQ(run.code, 0) << run.out;
  expect_one_host_weights(dir, out);
}

// 1% of h2's packets dropped at random, both ways, while 4 ranks train
// across the hosts: TCP sends them again and the job ends with the weights
// it has on one host, bit for bit with the ring all-reduce. The drops are
// counted (nftables), so a fault that dropped nothing fails the test.
TEST_F(NetnsCluster, OnePercentLossChangesOnlyTheTime) {
  const std::string dir = testing::scratch_dir("netns_loss");
  ASSERT_NO_FATAL_FAILURE(expect_one_host_weights_under(dir, "loss 1", "lossy"));
  auto counted =
      run_sh(fmt::format("{} --name {} exec h2 nft list table inet shoalfault", kTool, name_));
  const std::regex counter(R"(counter packets (\d+))");
  long dropped = 0, counters = 0;
  for (auto it = std::sregex_iterator(counted.out.begin(), counted.out.end(), counter);
       it != std::sregex_iterator(); ++it, ++counters)
    dropped += std::stol((*it)[1]);
  EXPECT_EQ(counters, 2) << counted.out;  // in and out
  EXPECT_GT(dropped, 0) << counted.out;
  std::printf("packets dropped on h2: %ld\n", dropped);
}

// The mean RTT `measure` reports from h2 to h1 (iperf3), in ms.
double measured_rtt_ms(const testing::ShoalRun& m) {
  std::smatch x;
  return std::regex_search(m.out, x, std::regex(R"(mean RTT ([0-9.]+) ms)")) ? std::stod(x[1]) : -1;
}

// 10 +- 10 ms on every frame h2 sends (netem where the kernel has it, else
// the tool's user-space relay, tools/netns_delay.py): 4 ranks train across
// the hosts to the one-host weights bit for bit (ring all-reduce), iperf3's
// RTT is up by about the delay, and `delay 0` gives the link back.
TEST_F(NetnsCluster, DelayAndJitterChangeOnlyTheTime) {
  const std::string dir = testing::scratch_dir("netns_delay");
  ASSERT_NO_FATAL_FAILURE(expect_one_host_weights_under(dir, "delay 10 10", "delayed"));
  auto slow = run_sh(fmt::format("{} --name {} measure h2 h1", kTool, name_));
  ASSERT_EQ(slow.code, 0) << slow.out;
  EXPECT_GT(measured_rtt_ms(slow), 8) << slow.out;
  auto back = run_sh(
      fmt::format("{0} --name {1} fault h2 delay 0 && {0} --name {1} measure h2 h1", kTool, name_));
  ASSERT_EQ(back.code, 0) << back.out;
  const double rtt = measured_rtt_ms(back);
  EXPECT_GE(rtt, 0) << back.out;
  EXPECT_LT(rtt, 5) << back.out;
  std::printf("RTT h2 -> h1: %.2f ms delayed, %.2f ms after\n", measured_rtt_ms(slow), rtt);
}

// h2's link goes down mid-training (once a checkpoint is written) and
// comes back 12 s later, under
// `shoal run --engine mpirun --max-restarts 4` on h1: the ranks name h2
// within the heartbeat deadline, the launcher restarts the job with a
// growing delay (1, 2, 4 s: a restart while the link is down fails at
// once, as OpenMPI's daemon on h2 cannot call back), and once the link is
// back a restart resumes from the newest checkpoint and finishes.
TEST_F(NetnsCluster, ALinkThatComesBackIsRestartedInto) {
  const std::string dir = testing::scratch_dir("netns_back");
  const std::string exec = fmt::format("{} --name {} exec", kTool, name_);
  const std::string agent = fmt::format("OMPI_MCA_plm_rsh_agent='{} --name {} rsh'", kTool, name_);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_sh(fmt::format(
      "(for i in $(seq 300); do ls {dir}/run/checkpoints/ckpt-* >/dev/null 2>&1 && break; "
      "sleep 0.1; done; {tool} --name {n} fault h2 down; sleep 12; {tool} --name {n} fault h2 "
      "up) "
      ">/dev/null 2>&1 & {exec} h1 env {agent} {bin} run --engine mpirun -n 4 --timeout 120 "
      "--max-restarts 4 --store-host 198.18.1.1 --engine-arg=--host --engine-arg=h1:2,h2:2 -- "
      "env SHOAL_HEARTBEAT=5 {bin} train --model mlp --batch 16 --epochs 3 --limit-train 8192 "
      "--limit-test 256 --threads 1 --no-plot --quiet --checkpoint-every 20 --out {dir}/run; "
      "rc=$?; wait; exit $rc",
      fmt::arg("tool", kTool), fmt::arg("n", name_), fmt::arg("exec", exec),
      fmt::arg("agent", agent), fmt::arg("bin", SHOAL_BINARY), fmt::arg("dir", dir)));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex(R"(rank [23] \(pid \d+ on h2\) sent no heartbeat)")))
      << r.out;
  EXPECT_NE(r.out.find("restarting all 4 ranks from the latest checkpoint (restart 1 of 4) in 1 s"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex(R"(resumed from \S+ckpt-\d+\.safetensors at step [1-9])")))
      << r.out;
  EXPECT_NE(r.out.find("final: test accuracy"), std::string::npos) << r.out;
  EXPECT_LT(took, 100) << r.out;
}

// The links' token bucket: 10 ms of traffic by default (1 Gbit/s: 1.25
// MB), as deep as --burst asks (0.5 ms: 62,500 bytes, a NIC-like link), on
// both ends of a host's link (tc rounds it to its clock: within 1%); a
// depth that is no number is refused.
TEST_F(NetnsCluster, TheLinksBucketIsAsDeepAsAsked) {
  const auto bucket = [](const std::string& ns, const std::string& dev) -> double {
    const std::string out =
        run_sh(fmt::format("ip netns exec {} tc qdisc show dev {}", ns, dev)).out;
    const auto at = out.find(" burst ");
    return at == std::string::npos ? -1 : std::atof(out.c_str() + at + 7);
  };
  EXPECT_NEAR(bucket(name_ + "-h1", "eth0"), 1.25e6, 1.25e4);
  const std::string other = fmt::format("u{}", getpid() % 10000000);
  auto r =
      run_sh(fmt::format("{} --name {} start --hosts 1 --link 1gbit --burst 0.5", kTool, other));
  ASSERT_EQ(r.code, 0) << r.out;
  const double h1 = bucket(other + "-h1", "eth0"), fab = bucket(other + "-fab", "h1");
  run_sh(fmt::format("{} --name {} stop", kTool, other));
  EXPECT_NEAR(h1, 62500, 625);
  EXPECT_NEAR(fab, 62500, 625);
  r = run_sh(fmt::format("{} --name {} start --hosts 1 --burst 1ms", kTool, other));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--burst 1ms: milliseconds of the link's traffic"), std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace shoal
