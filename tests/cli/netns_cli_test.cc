// Training across hosts: a cluster of network namespaces made by
// tools/netns-cluster.sh (each host its own hostname, /dev/shm and /tmp,
// joined by 1 Gbit/s shaped links), ranks started on them as a user would
// start them by hand (SHOAL_RANK, SHOAL_STORE on the first host). Skips,
// saying so, when not root; as root, fails when namespaces cannot be made.
// The link's faults and shaping are netns_links_cli_test.cc's.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "cli/cli_results.h"
#include "cli/netns_fixture.h"
#include "cli/run_shoal.h"
#include "shoal/core/file.h"
#include "shoal/dist/plan.h"
#include "temp_dir.h"

namespace shoal {
namespace {

// 4 ranks, 2 on each of two hosts (and 3 + 1), reach the same weights as 4
// ranks on one host: bit for bit with the ring all-reduce (the same sums in
// the same order, whatever carries them), and within float rounding with
// the automatic choice (hierarchical where the tuner prices it cheapest).
TEST_F(NetnsCluster, DataParallelAcrossTwoHostsMatchesOneHost) {
  const std::string dir = testing::scratch_dir("netns_dp");
  auto one = train_on_one_host(dir, kTrain);
  ASSERT_EQ(one.code, 0) << one.out;
  auto ring = train_across(4, 2, "SHOAL_ALLREDUCE_ALGO=ring SHOAL_LOG_LEVEL=debug",
                           fmt::format("{} --out {}/ring", kTrain, dir), dir);
  ASSERT_EQ(ring.code, 0) << ring.out;
  // Ranks 2 and 3 are on the second host and reached the first over eth0.
  EXPECT_NE(ring.out.find("rank 2 listens on 198.18.1.2 (interface eth0, chosen by the route to "
                          "the store's host 198.18.1.1)"),
            std::string::npos)
      << ring.out;
  expect_one_host_weights(dir, "ring");
  auto hier = train_across(4, 2, "", fmt::format("{} --out {}/hier", kTrain, dir), dir);
  ASSERT_EQ(hier.code, 0) << hier.out;
  testing::expect_same_training(dir + "/one", dir + "/hier", 6, 1e-5);
  // 3 + 1: unequal hosts (the two levels through one leader per host, where
  // the tuner takes them).
  auto uneven = train_across(4, 3, "", fmt::format("{} --out {}/uneven", kTrain, dir), dir);
  ASSERT_EQ(uneven.code, 0) << uneven.out;
  testing::expect_same_training(dir + "/one", dir + "/uneven", 6, 1e-5);
}

// Two hosts that share a hostname (containers often do) share no memory:
// ranks group by IPC and PID namespaces and the /dev/shm mount, not by name.
// Before, the ranks of h2 looked for h1's shared-memory channels in their
// own /dev/shm ("shm_open /shoal-...: No such file or directory").
TEST_F(NetnsCluster, HostsThatShareAHostnameShareNoMemory) {
  for (const char* h : {"h1", "h2"})
    ASSERT_EQ(run_sh(fmt::format("{} --name {} exec {} hostname same", kTool, name_, h)).code, 0);
  const std::string dir = testing::scratch_dir("netns_samename");
  auto one = train_on_one_host(dir, kTrain);
  ASSERT_EQ(one.code, 0) << one.out;
  auto two = train_across(4, 2, "SHOAL_ALLREDUCE_ALGO=ring SHOAL_COMM_TIMEOUT=30",
                          fmt::format("{} --out {}/two", kTrain, dir), dir);
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("2 ranks on this host"), std::string::npos) << two.out;
  expect_one_host_weights(dir, "two");
}

// Every way of distributing a step spans the hosts with the weights of the
// same layout on one host (ring all-reduce, so the sums are the same): with
// 2 ranks per host, tensor-parallel groups stay within a host and
// data-parallel groups and pipeline stages cross the link.
// A small GPT for the layouts beyond data parallelism.
const char* kGpt =
    "--model gpt --data text:/usr/share/games/fortunes/fortunes --layers 2 --heads 4 --dim 16 "
    "--context 8 --limit-train 200 --limit-test 40 --batch 8 --max-steps 4 --threads 1 "
    "--optimizer adam --lr 0.01 --deterministic --no-plot --quiet";

TEST_F(NetnsCluster, EveryStrategySpansTheHostsWithTheOneHostWeights) {
  const std::string gpt = kGpt;
  for (const std::string layout :
       {"--zero 1", "--zero 3", "--tp 2 --dp 2", "--pp 2 --dp 2", "--tp 2 --pp 2"}) {
    SCOPED_TRACE(layout);
    const std::string dir = testing::scratch_dir("netns_layout");
    auto one = train_on_one_host(dir, gpt + " " + layout);
    ASSERT_EQ(one.code, 0) << one.out;
    auto two = train_across(4, 2, "SHOAL_ALLREDUCE_ALGO=ring",
                            fmt::format("{} {} --out {}/two", gpt, layout, dir), dir);
    ASSERT_EQ(two.code, 0) << two.out;
    expect_one_host_weights(dir, "two");
  }
}

// `shoal plan` started as a job's ranks on two hosts measures the groups in
// the ranks' places: a pair across the 1 Gbit/s link is priced well below
// a pair inside a host (shared memory), and the plan says the hosts.
// `--plan auto` then plans and trains across them over the communicator its
// calibration joined.
TEST_F(NetnsCluster, ThePlanMeasuresTheLinksBetweenTheHosts) {
  const std::string dir = testing::scratch_dir("netns_plan");
  const std::string model =
      "--model gpt --data text:/usr/share/games/fortunes/fortunes --layers 2 --heads 4 --dim 32 "
      "--context 16 --threads 1";
  auto plan = run_across(4, 2, "",
                         fmt::format("plan --hosts 2 {} --batch 32 --out {}/plan.yaml "
                                     "--save-calibration {}/cal.json",
                                     model, dir, dir),
                         dir);
  ASSERT_EQ(plan.code, 0) << plan.out;
  EXPECT_NE(plan.out.find("4 ranks x 1 threads on 2 hosts"), std::string::npos) << plan.out;
  EXPECT_NE(plan.out.find("run it on the same 2 hosts, 2 ranks each"), std::string::npos)
      << plan.out;
  auto text = read_file(dir + "/cal.json");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  auto cal = dist::parse_calibration(*text);
  ASSERT_TRUE(cal.ok()) << cal.status().to_string();
  EXPECT_EQ(cal->hosts, 2);
  // Ranks 0, 1 share h1: a pair 1 apart stays inside a host, a pair 2 apart
  // crosses (each MB: ~8 ms at 1 Gbit/s, well under 1 ms in memory).
  const dist::LinkFit inside = cal->allreduce.at({2, 1}), across = cal->allreduce.at({2, 2});
  EXPECT_GT(across.time(4 << 20), 3 * inside.time(4 << 20))
      << "inside " << inside.time(4 << 20) << " s, across " << across.time(4 << 20) << " s";
  auto fresh = run_sh(fmt::format("{} plan -n 4 --hosts 2 {}", SHOAL_BINARY, model));
  EXPECT_NE(fresh.code, 0);
  EXPECT_NE(fresh.out.find("start it as a job on them"), std::string::npos) << fresh.out;
  auto train = train_across(
      4, 2, "",
      fmt::format("{} --batch 8 --max-steps 6 --limit-train 400 --limit-test 40 --no-plot "
                  "--plan auto --out {}/auto",
                  model, dir),
      dir);
  ASSERT_EQ(train.code, 0) << train.out;
  EXPECT_NE(train.out.find("4 ranks on 2 hosts"), std::string::npos) << train.out;
  EXPECT_NE(train.out.find("plan check: step"), std::string::npos) << train.out;
}

// A parameter-server job started by hand as docs/ps.md says, one role per
// process: the scheduler on h1, a server and a worker on each host. Its
// servers publish the address that routes to the scheduler (their host
// names resolve to 127.0.1.1 there, as on Debian); each worker maps only its
// own host's server's memory; the weights are those of the same job on one
// host (sync: every push counted once).
TEST_F(NetnsCluster, AParameterServerJobStartedByHandSpansTheHosts) {
  const std::string dir = testing::scratch_dir("netns_ps");
  const std::string train = fmt::format("train --dist ps {}", kTrain);
  auto one = run_shoal(
      fmt::format("run --ps 2,2 --timeout 120 --ps-snapshots {}/snap -- {} {} --out {}/one", dir,
                  SHOAL_BINARY, train, dir));
  ASSERT_EQ(one.code, 0) << one.out;
  const std::string env = fmt::format(
      "{} --name {} exec h{{}} env SHOAL_JOB_TOKEN=netns DMLC_PS_ROOT_URI=198.18.1.1 "
      "DMLC_PS_ROOT_PORT=9000 DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=2 DMLC_ROLE={{}} timeout -s KILL "
      "120 {}",
      kTool, name_, SHOAL_BINARY);
  auto role = [&](int host, const std::string& r, const std::string& args, const std::string& log) {
    return fmt::format(fmt::runtime(env), host, r) + " " + args + " > " + dir + "/" + log +
           ".log 2>&1 & pids=\"$pids $!\"\n";
  };
  // Scheduler on h1, a server and a worker on each host.
  auto job = [&](const std::string& worker_args) {
    std::string line = role(1, "scheduler", "ps scheduler", "sched");
    for (int h : {1, 2}) line += role(h, "server", "ps server", fmt::format("server{}", h));
    for (int h : {1, 2})
      line +=
          role(h, "worker", fmt::format("{} {}", train, worker_args), fmt::format("worker{}", h));
    line += "rc=0; for p in $pids; do wait $p || rc=1; done; cat " + dir + "/*.log; exit $rc";
    return run_sh(line);
  };
  // Asynchronous: no two runs give the same weights; both workers train to
  // the end across the hosts.
  auto async = job(fmt::format("--ps-mode async --out {}/async", dir));
  ASSERT_EQ(async.code, 0) << async.out;
  int finals = 0;
  for (std::size_t at = 0; (at = async.out.find("final: test accuracy", at)) != std::string::npos;
       ++at)
    ++finals;
  EXPECT_EQ(finals, 2) << async.out;
  auto r = job(fmt::format("--out {}/two", dir));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ps server: publishing 198.18.1.2 (interface eth0"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("worker 0: push-pulls in shared memory with 1 of 2 parameter servers"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("worker 1: push-pulls in shared memory with 1 of 2 parameter servers"),
            std::string::npos)
      << r.out;
  expect_one_host_weights(dir, "two");
}

// Real launchers span the hosts, each started as its users start it, and
// every one trains to the same weights as `shoal run` on one host (ring).
TEST_F(NetnsCluster, TorchrunAndMpirunSpanTheHosts) {
  const std::string dir = testing::scratch_dir("netns_launch");
  auto one = train_on_one_host(dir, kTrain);
  ASSERT_EQ(one.code, 0) << one.out;
  const std::string exec = fmt::format("{} --name {} exec", kTool, name_);
  const std::string train =
      fmt::format("env SHOAL_ALLREDUCE_ALGO=ring {} train {}", SHOAL_BINARY, kTrain);
  // torchrun, static rendezvous (--master_addr) and c10d (--rdzv_endpoint):
  // one agent per host.
  for (const std::string rdzv :
       {"--master_addr 198.18.1.1 --master_port 29500 --node_rank {r}",
        "--rdzv_backend c10d --rdzv_endpoint 198.18.1.1:29501 --rdzv_id netns"}) {
    if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
      ADD_FAILURE() << "python3-torch is missing (tools/install-deps.sh installs it)";
      break;
    }
    const std::string out = rdzv.starts_with("--master") ? "static" : "c10d";
    std::string line;
    for (int r = 0; r < 2; ++r)
      line += fmt::format(
          "{} h{} timeout -s KILL 120 /usr/bin/python3 {}/tools/torchrun.py --nnodes 2 "
          "--nproc_per_node 2 {} --no_python {} --out {}/{} > {}/{}{}.log 2>&1 & p{}=$!\n",
          exec, r + 1, SHOAL_SOURCE_DIR, fmt::format(fmt::runtime(rdzv), fmt::arg("r", r)), train,
          dir, out, dir, out, r, r);
    line += fmt::format("wait $p0 && wait $p1 || {{ cat {}/{}*.log; exit 1; }}", dir, out);
    auto r = run_sh(line);
    ASSERT_EQ(r.code, 0) << out << "\n" << r.out;
    expect_one_host_weights(dir, out);
  }
  // mpirun.openmpi on h1 starting its daemons on h2 through the tool's
  // ssh stand-in, under `shoal run --engine mpirun` (Shoal's transport) and
  // bare with SHOAL_COMM_BACKEND=mpi (OpenMPI's own).
  const std::string agent = fmt::format("OMPI_MCA_plm_rsh_agent='{} --name {} rsh'", kTool, name_);
  // `shoal run --engine mpirun [run_args]` on h1, two ranks on each host,
  // running `rank_cmd`.
  auto shoal_mpirun = [&](const std::string& rank_cmd, const std::string& run_args = "") {
    return run_sh(fmt::format(
        "{} h1 env {} {} run --engine mpirun -n 4 --timeout 120 --store-host 198.18.1.1 "
        "--engine-arg=--host --engine-arg=h1:2,h2:2 {} -- {}",
        exec, agent, SHOAL_BINARY, run_args, rank_cmd));
  };
  // Traced: h2's ranks write their traces beside the merged file (a shared
  // directory), not into h1's private /tmp, which they cannot reach (they
  // failed with "writing trace: /tmp/shoal-trace-...: cannot create").
  auto dp = shoal_mpirun(fmt::format("{} --out {}/mpirun", train, dir),
                         fmt::format("--trace {}/trace.json", dir));
  ASSERT_EQ(dp.code, 0) << dp.out;
  expect_one_host_weights(dir, "mpirun");
  EXPECT_TRUE(std::filesystem::exists(dir + "/trace.json"));
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(dp.out.find(fmt::format("shoal run:   rank {}: ", r)), std::string::npos) << dp.out;
  // Beyond data parallelism under OpenMPI: ZeRO-2 across the hosts.
  auto zero_one = train_on_one_host(dir + "/zero", std::string(kGpt) + " --zero 2");
  ASSERT_EQ(zero_one.code, 0) << zero_one.out;
  auto zero = shoal_mpirun(
      fmt::format("env SHOAL_ALLREDUCE_ALGO=ring {} train {} --zero 2 --out {}/zero/two",
                  SHOAL_BINARY, kGpt, dir));
  ASSERT_EQ(zero.code, 0) << zero.out;
  expect_one_host_weights(dir + "/zero", "two");
  auto mpi = run_sh(fmt::format(
      "{} h1 env {} timeout -s KILL 120 mpirun.openmpi --allow-run-as-root -n 4 --host h1:2,h2:2 "
      "-x SHOAL_COMM_BACKEND=mpi {} train {} --out {}/mpi",
      exec, agent, SHOAL_BINARY, kTrain, dir));
  ASSERT_EQ(mpi.code, 0) << mpi.out;
  testing::expect_same_training(dir + "/one", dir + "/mpi", 6, 1e-5);
  // A parameter server job under OpenMPI, one program per role (docs/ps.md):
  // by slot the scheduler and both servers land on h1 and both workers on
  // h2, so every push and pull crosses the link; the weights are those of
  // `shoal run --ps 2,2` on one host.
  const std::string ps_train = fmt::format("train --dist ps {}", kTrain);
  auto ps_one =
      run_shoal(fmt::format("run --ps 2,2 --timeout 120 --ps-snapshots {}/snap -- {} {} "
                            "--out {}/ps/one",
                            dir, SHOAL_BINARY, ps_train, dir));
  ASSERT_EQ(ps_one.code, 0) << ps_one.out;
  // -x belongs to its program: each carries the job's variables to h2.
  const std::string x =
      "-x SHOAL_JOB_TOKEN=netns -x DMLC_PS_ROOT_URI=198.18.1.1 -x DMLC_PS_ROOT_PORT=9400 "
      "-x DMLC_NUM_SERVER=2 -x DMLC_NUM_WORKER=2";
  auto ps = run_sh(fmt::format(
      "{} h1 env {} timeout -s KILL 120 mpirun.openmpi --allow-run-as-root --host h1:3,h2:2 "
      "{x} -x DMLC_ROLE=scheduler -n 1 {bin} ps scheduler : {x} -x DMLC_ROLE=server -n 2 {bin} "
      "ps server : {x} -x DMLC_ROLE=worker -n 2 {bin} {train} --out {dir}/ps/two",
      exec, agent, fmt::arg("x", x), fmt::arg("bin", SHOAL_BINARY), fmt::arg("train", ps_train),
      fmt::arg("dir", dir)));
  ASSERT_EQ(ps.code, 0) << ps.out;
  EXPECT_NE(ps.out.find("publishing 198.18.1.1"), std::string::npos) << ps.out;
  expect_one_host_weights(dir + "/ps", "two");
}

// Slurm with one slurmd on each host (tools/slurm-cluster.sh with
// SHOAL_SLURM_NETNS): `shoal run --engine srun` and a bare `srun -N 2`,
// whose rank 0 serves the store under the first node's name, which that
// node resolves to 127.0.1.1. Both give the one-host weights.
TEST_F(NetnsCluster, SrunSpansTheHostsOfItsSlurm) {
  if (std::system("command -v slurmctld >/dev/null && command -v munged >/dev/null") != 0)
    GTEST_SKIP() << "SKIP: slurm-wlm and munge are not installed (tools/install-deps.sh)";
  const std::string slurm =
      fmt::format("SHOAL_SLURM_NETNS={} {}/tools/slurm-cluster.sh", name_, SHOAL_SOURCE_DIR);
  auto up = run_sh(slurm + " start");
  ASSERT_EQ(up.code, 0) << up.out;
  const std::string dir = testing::scratch_dir("netns_srun");
  auto one = train_on_one_host(dir, kTrain);
  const std::string on_h1 = fmt::format(
      "{} --name {} exec h1 env SLURM_CONF=/run/shoal-netns/{}/slurm/slurm.conf "
      "SHOAL_ALLREDUCE_ALGO=ring timeout -s KILL 120",
      kTool, name_, name_);
  auto engine = run_sh(fmt::format(
      "{} {} run --engine srun -n 4 --store-host 198.18.1.1 --engine-arg=-N2 -- {} train {} "
      "--out {}/engine",
      on_h1, SHOAL_BINARY, SHOAL_BINARY, kTrain, dir));
  auto bare = run_sh(
      fmt::format("{} srun -N 2 -n 4 {} train {} --out {}/bare", on_h1, SHOAL_BINARY, kTrain, dir));
  // Beyond data parallelism under srun: TP within each host, DP across
  // (before the slurmd is killed: a node without one takes no new step).
  auto tp_one = train_on_one_host(dir + "/tp", std::string(kGpt) + " --tp 2 --dp 2");
  auto tp = run_sh(fmt::format("{} srun -N 2 -n 4 {} train {} --tp 2 --dp 2 --out {}/tp/two", on_h1,
                               SHOAL_BINARY, kGpt, dir));
  // h2's slurmd killed while the step runs: its slurmstepd holds the ranks,
  // which train on to the one-host weights; nothing of the step is lost.
  // (Found by its command line from this namespace: the pid file holds the
  // pid inside h2's own PID namespace.)
  const std::string slurmd_h2 =
      fmt::format("pgrep -f '^slurmd -f /run/shoal-netns/{}/slurm/slurm.conf -N h2$'", name_);
  // Killed once h2's ranks run (bounded wait), not before the step starts.
  auto killed = run_sh(fmt::format(
      "(for i in $(seq 200); do pgrep -f '^{} train .*--out {}/killed' >/dev/null && break; "
      "sleep 0.05; done; pid=$({}) && kill -KILL $pid && echo slurmd-h2-killed) & "
      "{} srun -N 2 -n 4 {} train {} --out {}/killed; rc=$?; wait; echo step-rc=$rc",
      SHOAL_BINARY, dir, slurmd_h2, on_h1, SHOAL_BINARY, kTrain, dir));
  const bool slurmd_gone = run_sh(slurmd_h2).code != 0;
  run_sh(slurm + " stop");
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(engine.code, 0) << engine.out;
  ASSERT_EQ(bare.code, 0) << bare.out;
  for (const char* out : {"engine", "bare"}) expect_one_host_weights(dir, out);
  EXPECT_NE(killed.out.find("slurmd-h2-killed"), std::string::npos) << killed.out;
  EXPECT_TRUE(slurmd_gone) << killed.out;
  EXPECT_NE(killed.out.find("step-rc=0"), std::string::npos) << killed.out;
  expect_one_host_weights(dir, "killed");
  ASSERT_EQ(tp_one.code, 0) << tp_one.out;
  ASSERT_EQ(tp.code, 0) << tp.out;
  expect_one_host_weights(dir + "/tp", "two");
}

// An elastic asynchronous parameter-server job started on h1 (scheduler,
// server and its own worker) takes workers started by hand on h2 with the
// job's variables (its job.env): one trains to the end from the server's
// weights across the link, long after the job's own worker is done; one is
// killed (SIGKILL) while it trains; the job ends when the last has gone.
TEST_F(NetnsCluster, AnElasticParameterServerJobTakesAndLosesWorkersOnAnotherHost) {
  const std::string dir = testing::scratch_dir("netns_ps_elastic");
  const std::string ps = fmt::format(
      "--dist ps --ps-mode async --model mlp --limit-train 6144 --epochs 3 --limit-test 256 "
      "--threads 1 --optimizer sgd --lr 0.05 --batch 32 --no-plot --quiet");
  const std::string hand = fmt::format(
      "{tool} --name {n} exec h2 sh -c '. {dir}/ps/job.env; export SHOAL_STORE SHOAL_JOB_TOKEN "
      "SHOAL_JOB_ID; DMLC_ROLE=worker DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1 exec timeout -s KILL "
      "{{}} {bin} train {ps} {{}}'",
      fmt::arg("tool", kTool), fmt::arg("n", name_), fmt::arg("dir", dir),
      fmt::arg("bin", SHOAL_BINARY), fmt::arg("ps", ps));
  auto r = run_sh(fmt::format(
      "{tool} --name {n} exec h1 timeout -s KILL 150 {bin} run --ps 1,1 --ps-elastic 1:3 "
      "--store-host 198.18.1.1 --timeout 120 --ps-snapshots {dir}/ps -- {bin} train {ps} "
      "--out {dir}/run > {dir}/job.log 2>&1 & job=$!\n"
      "i=0; while [ $i -lt 600 ] && [ ! -s {dir}/ps/job.env ]; do sleep 0.05; i=$((i+1)); done\n"
      "{trains} > {dir}/h2a.log 2>&1 & a=$!\n"
      "{killed} > {dir}/h2b.log 2>&1; b=$?\n"
      "wait $a; a=$?; wait $job; j=$?\n"
      "cat {dir}/job.log; echo \"== h2a $a\"; cat {dir}/h2a.log; echo \"== h2b $b\"; "
      "cat {dir}/h2b.log; echo \"== job $j\"",
      fmt::arg("tool", kTool), fmt::arg("n", name_), fmt::arg("dir", dir),
      fmt::arg("bin", SHOAL_BINARY), fmt::arg("ps", ps),
      fmt::arg("trains", fmt::format(fmt::runtime(hand), 120, "--out " + dir + "/h2a")),
      fmt::arg("killed", fmt::format(fmt::runtime(hand), 3, "--out " + dir + "/h2b"))));
  ASSERT_NE(r.out.find("== job 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("== h2a 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("== h2b 137"), std::string::npos) << r.out;  // killed while training
  const auto finals = testing::numbers_after(r.out, "final: test accuracy ");
  ASSERT_EQ(finals.size(), 2u) << r.out;  // the job's worker and h2's first
  for (double acc : finals) EXPECT_GT(acc, 0.5) << r.out;
  // The server counted the pushes of all three.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m, std::regex(R"(pushes by worker: worker 0: \d+, worker 1: (\d+), worker 2: (\d+))")))
      << r.out;
  EXPECT_GT(std::stoi(m[1]), 0) << r.out;
  EXPECT_GT(std::stoi(m[2]), 0) << r.out;
  // The server ended by itself once the last left, not cut off by `shoal
  // run` 10 s after its own worker (h2's first trains ~12 s longer).
  EXPECT_NE(r.out.find("ps server: stopping: all 3 workers have left (1 by a closed connection)"),
            std::string::npos)
      << r.out;
}

// An elastic job under srun across the hosts (one slurmd on each): h2's
// link goes down mid-training. Its two ranks renew no lease, the two on h1
// name them by heartbeat, end the step in flight and go on as a job of two
// from the state they kept; the job ends well, with the weights of one
// that ran 4 ranks to that step and resumed on 2 from a checkpoint (the
// same global batch). The step, with h2 unreachable, is cancelled in the
// end, within the launcher's bound. (Before Communicator::cut reached the
// two-level all-reduce's groups, h1's two ranks hung in them: one in its
// host group's shared memory, one on the socket to h2.)
TEST_F(NetnsCluster, AnElasticJobUnderSrunLosesAHostAndGoesOn) {
  if (std::system("command -v slurmctld >/dev/null && command -v munged >/dev/null") != 0)
    GTEST_SKIP() << "SKIP: slurm-wlm and munge are not installed (tools/install-deps.sh)";
  const std::string slurm =
      fmt::format("SHOAL_SLURM_NETNS={} {}/tools/slurm-cluster.sh", name_, SHOAL_SOURCE_DIR);
  auto up = run_sh(slurm + " start");
  ASSERT_EQ(up.code, 0) << up.out;
  const std::string dir = testing::scratch_dir("netns_elastic");
  const std::string train =
      "train --model mlp --limit-train 12000 --limit-test 256 --threads 1 --no-plot --quiet "
      "--optimizer momentum --lr 0.05 --epochs 2";
  // The ring all-reduce on both: the same sums in the same order across the
  // hosts and on one (the two-level one's rounding, grown over 476 steps of
  // momentum, ended 0.14 away).
  const std::string env =
      "SHOAL_DETERMINISTIC=1 SHOAL_ELASTIC_COMMIT_EVERY=4 SHOAL_ALLREDUCE_ALGO=ring ";
  auto r = run_sh(fmt::format(
      "(i=0; while [ $i -lt 600 ] && ! grep -q 'kind\":\"train' {dir}/el/metrics.jsonl "
      "2>/dev/null; do sleep 0.05; i=$((i+1)); done; {tool} --name {n} fault h2 down) & "
      "{tool} --name {n} exec h1 env SLURM_CONF=/run/shoal-netns/{n}/slurm/slurm.conf "
      "SHOAL_HEARTBEAT=3 {env} timeout -s KILL 200 {bin} run --engine srun -n 4 --elastic 2 "
      "--store-host 198.18.1.1 --engine-arg=-N2 --timeout 150 -- {bin} {train} --batch 12 "
      "--out {dir}/el; rc=$?; wait; echo job-rc=$rc",
      fmt::arg("dir", dir), fmt::arg("tool", kTool), fmt::arg("n", name_), fmt::arg("env", env),
      fmt::arg("bin", SHOAL_BINARY), fmt::arg("train", train)));
  run_sh(fmt::format("{} --name {} fault h2 up", kTool, name_));
  run_sh(slurm + " stop");
  ASSERT_NE(r.out.find("job-rc=0"), std::string::npos) << r.out;
  for (const char* s : {"sent no heartbeat", "rank 2 renewed no lease", "rank 3 renewed no lease",
                        "generation 1: 2 ranks go on from step",
                        "the job ended on 2 ranks (it started on 4; generation 1)"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(2 ranks go on from step (\d+))"))) << r.out;
  const std::string step = m[1];
  // The same membership change made on purpose, on one host.
  for (const std::string& leg :
       {"-n 4 -- " + std::string(SHOAL_BINARY) + " " + train + " --batch 12 --max-steps " + step,
        "-n 2 -- " + std::string(SHOAL_BINARY) + " " + train +
            " --batch 24 --max-steps 0 --resume"}) {
    auto a = run_sh(fmt::format("{}{} run {} --out {}/ref", env, SHOAL_BINARY, leg, dir));
    ASSERT_EQ(a.code, 0) << a.out;
  }
  auto x = testing::last_checkpoint(dir + "/el"), y = testing::last_checkpoint(dir + "/ref");
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->metadata.at("step"), "500");
  EXPECT_EQ(y->metadata.at("step"), "500");
  int np = 0, ns = 0;
  EXPECT_LE(testing::max_abs_diff(*x, *y, "param/", &np), 1e-5);
  EXPECT_LE(testing::max_abs_diff(*x, *y, "opt/", &ns), 1e-5);
  EXPECT_GT(np, 0);
  EXPECT_GE(ns, np);
}

// A rank told to advertise loopback while the store is on another host is
// refused by name at start-up, not left for its peers to time out on.
TEST_F(NetnsCluster, LoopbackIsNotAdvertisedToAnotherHost) {
  const std::string dir = testing::scratch_dir("netns_lo");
  auto r = train_across(2, 1, "SHOAL_SOCKET_IFNAME=lo SHOAL_STORE_WAIT=5",
                        fmt::format("{} --out {}/lo", kTrain, dir), dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("SHOAL_SOCKET_IFNAME=lo selects the loopback interface lo (127.0.0.1)"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace shoal
