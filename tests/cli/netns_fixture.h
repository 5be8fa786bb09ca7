// The netns cluster a test trains across (tools/netns-cluster.sh, 2 hosts
// at 1 Gbit/s), and what the cross-host tests compare against: the weights
// of the same job on one host. Included by netns_cli_test.cc and
// netns_links_cli_test.cc.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cli/cli_results.h"
#include "cli/run_shoal.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::run_sh;
using testing::run_shoal;

const std::string kTool = SHOAL_SOURCE_DIR "/tools/netns-cluster.sh";

class NetnsCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "SKIP: network namespaces need root";
    name_ = fmt::format("t{}", getpid() % 10000000);
    // The hosts' /tmp is private but for the shared directory, where the
    // runs' files must be: the scratch root when the runner gives one
    // (tools/run-tests.sh sets TEST_TMPDIR), else one of this test's own.
    std::string share = ::testing::TempDir();
    while (share.size() > 1 && share.back() == '/') share.pop_back();
    if (share == "/tmp") {
      std::string own = "/tmp/shoal_netns_share_XXXXXX";
      ASSERT_NE(mkdtemp(own.data()), nullptr);
      setenv("TEST_TMPDIR", own.c_str(), 1);
      share = own_share_ = own;
    }
    auto r = run_sh(
        fmt::format("{} --name {} start --hosts 2 --link 1gbit --share {}", kTool, name_, share));
    // As root (CI), namespaces that cannot be made are a failure with the
    // reason, never a silent pass.
    ASSERT_EQ(r.code, 0) << "cannot make network namespaces here: " << r.out;
    started_ = true;
  }
  void TearDown() override {
    if (started_) run_sh(fmt::format("{} --name {} stop", kTool, name_));
    if (!own_share_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(own_share_, ec);
      unsetenv("TEST_TMPDIR");
    }
  }
  // Starts `world` ranks of `shoal train <args>`, `per_host` on each host,
  // rank 0 serving the store on h1; waits for all (each bounded by 120 s).
  // `during`: a shell line run in the background once they started.
  testing::ShoalRun train_across(int world, int per_host, const std::string& env,
                                 const std::string& args, const std::string& logs,
                                 const std::string& during = "") {
    return run_across(world, per_host, env, "train " + args, logs, during);
  }
  // The same for any command: `shoal <words>`.
  testing::ShoalRun run_across(int world, int per_host, const std::string& env,
                               const std::string& words, const std::string& logs,
                               const std::string& during = "") {
    std::string line;
    for (int r = 0; r < world; ++r)
      line += fmt::format(
          "{} --name {} exec h{} env SHOAL_RANK={} SHOAL_WORLD_SIZE={} SHOAL_LOCAL_RANK={} "
          "SHOAL_STORE=198.18.1.1:29500 SHOAL_STORE_SERVE=1 SHOAL_JOB_TOKEN=netns {} "
          "timeout -s KILL 120 {} {} > {}/r{}.log 2>&1 & pids=\"$pids $!\"\n",
          kTool, name_, r / per_host + 1, r, world, r % per_host, env, SHOAL_BINARY, words, logs,
          r);
    line += during + "\nrc=0; for p in $pids; do wait $p || rc=1; done; cat " + logs +
            "/r*.log; exit $rc";
    return run_sh(line);
  }
  // `fault` (the tool's words after `fault h2`) on h2, then 4 ranks, 2 a
  // host, train across with the ring all-reduce into dir/`out` and end with
  // the weights `train_on_one_host` reaches, bit for bit.
  void expect_one_host_weights_under(const std::string& dir, const std::string& fault,
                                     const std::string& out);
  std::string name_, own_share_;
  bool started_ = false;
};

const char* kTrain =
    "--model mlp --batch 16 --max-steps 12 --limit-train 2048 --limit-test 256 --threads 1 "
    "--optimizer momentum --lr 0.05 --deterministic --no-plot --quiet";

// `shoal run -n 4 -- shoal train <args>` on this host with the ring
// all-reduce, into dir/one: the weights each run across the hosts equals.
testing::ShoalRun train_on_one_host(const std::string& dir, const std::string& args) {
  return run_shoal(fmt::format(
      "run -n 4 --timeout 120 -- env SHOAL_ALLREDUCE_ALGO=ring {} train {} --out {}/one",
      SHOAL_BINARY, args, dir));
}

// The newest checkpoint in dir/`out` holds the bytes of dir/one's.
void expect_one_host_weights(const std::string& dir, const std::string& out) {
  auto a = testing::last_checkpoint(dir + "/one"), b = testing::last_checkpoint(dir + "/" + out);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << out << ": " << b.status().to_string();
  EXPECT_TRUE(testing::same_bits(*a, *b)) << out;
}

}  // namespace
}  // namespace shoal
