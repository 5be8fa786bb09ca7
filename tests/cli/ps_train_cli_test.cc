// Training through parameter servers end to end, on real Fashion-MNIST:
// `shoal run --ps S,W -- shoal train --dist ps`. Sync PS with W workers of
// batch B equals one process of batch W*B (same weights after k steps);
// async training survives a killed worker and reaches the CNN's accuracy; a
// sync job names a failed worker; a worker started by hand joins a running
// job and its pushes count; a frozen worker is dropped after its heartbeat
// deadline. The async CNN's accuracy is in ps_accuracy_cli_test.cc.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/cli_results.h"
#include "cli/run_shoal.h"
#include "free_port.h"
#include "shoal/tensor/safetensors.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::last_checkpoint;
using testing::numbers_after;
using testing::run_sh;
using testing::run_shoal;

std::string tmpdir(const std::string& name) { return testing::scratch_dir("ps_" + name) + "/run"; }

const std::string kMlp =
    "--model mlp --limit-train 2048 --limit-test 256 --threads 1 --optimizer momentum --lr 0.05 "
    "--no-plot --quiet";

// Async updates from two workers add to momentum (Mitliagkas et al. 2016,
// "Asynchrony begets momentum"): plain SGD for the async MLP runs.
const std::string kAsyncMlp =
    "--model mlp --limit-train 2048 --limit-test 256 --threads 1 --optimizer sgd --lr 0.05 "
    "--no-plot --quiet";

// The largest absolute difference over the parameters of two checkpoints.
double worst_param_diff(const SafetensorsFile& a, const SafetensorsFile& b, int* params) {
  double worst = 0;
  *params = 0;
  for (const auto& [name, t] : a.tensors) {
    if (name.rfind("param/", 0) != 0) continue;
    ++*params;
    const Tensor* u = b.find(name);
    if (u == nullptr) return 1e30;
    for (std::int64_t i = 0; i < t.numel(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(u->data<float>()[i]) -
                                       static_cast<double>(t.data<float>()[i])));
  }
  return worst;
}

TEST(PsTrainCli, SyncWorkersMatchOneProcessOnTheWholeBatch) {
  constexpr int kB = 16, kSteps = 8;
  // {servers, workers, slice bound}: with a bound of 1,000 elements the
  // three weight matrices are sliced over both servers (9 parts per step
  // instead of 6 keys), which must not change a single weight.
  // Servers on the workers' host read gradients from, and write values
  // into, the workers' arenas (shared memory) unless SHOAL_PS_SHM=0.
  struct Layout {
    int servers, workers, bound, parts;
    bool shm;
  };
  for (auto [servers, workers, bound, parts, shm] :
       {Layout{1, 2, 1000000, 6, true}, Layout{2, 3, 1000000, 6, true}, Layout{2, 2, 1000, 9, true},
        Layout{2, 2, 1000, 9, false}}) {
    SCOPED_TRACE(fmt::format("{} servers, {} workers, slice bound {}, shared memory {}", servers,
                             workers, bound, shm));
    const std::string one = tmpdir(fmt::format("one{}", workers));
    const std::string many = tmpdir(fmt::format("many{}{}{}{}", servers, workers, bound, shm));
    auto r1 = run_shoal(fmt::format("train {} --batch {} --max-steps {} --out {}", kMlp,
                                    workers * kB, kSteps, one));
    ASSERT_EQ(r1.code, 0) << r1.out;
    auto r2 = run_sh(fmt::format(
        "SHOAL_PS_SHM={} MXNET_KVSTORE_BIGARRAY_BOUND={} {} run --ps {},{} --timeout 120 "
        "--ps-snapshots {}.ps -- {} train --dist ps {} --batch {} --max-steps {} --out {}",
        shm ? 1 : 0, bound, SHOAL_BINARY, servers, workers, many, SHOAL_BINARY, kMlp, kB, kSteps,
        many));
    ASSERT_EQ(r2.code, 0) << r2.out;
    // What each server read from the workers' memory: every gradient, or none.
    const auto in_place = numbers_after(r2.out, "over sockets, ");
    ASSERT_EQ(in_place.size(), static_cast<std::size_t>(servers)) << r2.out;
    for (double b : in_place) EXPECT_EQ(b > 0, shm) << r2.out;
    const auto pushes = numbers_after(r2.out, "ps server: stopped; ");
    ASSERT_EQ(pushes.size(), static_cast<std::size_t>(servers)) << r2.out;
    double total = 0;
    for (double p : pushes) total += p;
    EXPECT_EQ(total, workers * kSteps * parts) << r2.out;
    // Every worker pushed every parameter once per step, and every round closed.
    EXPECT_NE(
        r2.out.find(fmt::format("every worker has finished; the {} parameter server", servers)),
        std::string::npos)
        << r2.out;
    auto a = last_checkpoint(one);
    auto b = last_checkpoint(many);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->metadata.at("step"), std::to_string(kSteps));
    int params = 0;
    EXPECT_LE(worst_param_diff(*a, *b, &params), 1e-5);
    EXPECT_EQ(params, 6);
  }
}

// The GPT's untied token embedding is pushed as the rows each step uses,
// not as a dense table: a sync job of two
// workers still equals one process on the whole batch, momentum included
// (the servers update densely), and the servers count the row pushes.
TEST(PsTrainCli, EmbeddingTablesGoAsRowsAndMatchOneProcess) {
  const std::string text = "/usr/share/games/fortunes/cookie";
  if (!std::filesystem::exists(text))
    GTEST_SKIP() << "Debian's fortunes package is not installed (tools/install-deps.sh does)";
  constexpr int kB = 6, kSteps = 5;
  const std::string gpt = "--model gpt --data text:" + text +
                          " --untied --layers 1 --heads 2 --dim 12 --context 9 --limit-train 400 "
                          "--threads 1 --optimizer momentum --lr 0.05 --no-plot --quiet";
  const std::string one = tmpdir("gpt_one");
  auto r1 = run_shoal(
      fmt::format("train {} --batch {} --max-steps {} --out {}", gpt, 2 * kB, kSteps, one));
  ASSERT_EQ(r1.code, 0) << r1.out;
  auto a = last_checkpoint(one);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  // One server; then two with the table sliced over both (a slice bound of
  // 100 elements): each worker's rows go to the block that holds them.
  for (auto [servers, bound] : {std::pair{1, 1000000}, std::pair{2, 100}}) {
    SCOPED_TRACE(fmt::format("{} servers, slice bound {}", servers, bound));
    const std::string many = tmpdir(fmt::format("gpt_many{}", servers));
    auto r2 = run_sh(fmt::format(
        "MXNET_KVSTORE_BIGARRAY_BOUND={} {} run --ps {},2 --timeout 120 --ps-snapshots {}.ps -- "
        "{} train --dist ps {} --batch {} --max-steps {} --out {}",
        bound, SHOAL_BINARY, servers, many, SHOAL_BINARY, gpt, kB, kSteps, many));
    ASSERT_EQ(r2.code, 0) << r2.out;
    EXPECT_NE(r2.out.find("is pushed as the rows each step uses"), std::string::npos) << r2.out;
    double rows = 0;
    for (double n : numbers_after(r2.out, "pushes (")) rows += n;
    // The token table: 2 workers x 5 steps, to each server holding a block.
    EXPECT_EQ(rows, kSteps * 2 * servers) << r2.out;
    auto b = last_checkpoint(many);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    int params = 0;
    EXPECT_LE(worst_param_diff(*a, *b, &params), 1e-5);
    EXPECT_GT(params, 8);
  }
}

// Pushes over all servers, from their last lines.
double total_pushes(const std::string& out) {
  double n = 0;
  for (double x : numbers_after(out, "ps server: stopped; ")) n += x;
  return n;
}

// Bounded staleness counts every push once. A push answered "wait" goes
// again as a new push; before, it went with its old number, which a later
// accepted push of the same worker had passed, and the server dropped it as
// a duplicate (43 of 5,616 pushes lost in one epoch). One step of slack
// makes waits frequent; with two servers each sees every worker's keys
// interleaved with the other server's answers.
TEST(PsTrainCli, BoundedStalenessCountsEveryPushOnce) {
  constexpr int kSteps = 500;
  for (int servers : {1, 2}) {
    SCOPED_TRACE(fmt::format("{} servers", servers));
    const std::string dir = testing::scratch_dir(fmt::format("ps_bounded{}", servers));
    auto r = run_sh(fmt::format(
        "{0} run --ps {1},2 --timeout 120 -- {0} train --dist ps --ps-mode bounded --staleness 1 "
        "{2} --batch 16 --epochs 100 --max-steps {3} --out {4}/run",
        SHOAL_BINARY, servers, kAsyncMlp, kSteps, dir));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(total_pushes(r.out), 2 * kSteps * 6) << r.out;  // 6 keys a step
    const auto dups = numbers_after(r.out, "sync rounds, ");
    ASSERT_EQ(dups.size(), static_cast<std::size_t>(servers)) << r.out;
    for (double d : dups) EXPECT_EQ(d, 0) << r.out;
  }
}

// Bounded staleness 0 would let no worker move (each counts as ahead of the
// other): refused by name at once, not a 300 s hang blaming a key.
TEST(PsTrainCli, BoundedStalenessZeroIsRefusedByName) {
  const std::string dir = testing::scratch_dir("ps_stale0");
  auto r = run_sh(fmt::format(
      "{0} run --ps 1,2 --timeout 120 -- {0} train --dist ps --ps-mode bounded --staleness 0 "
      "{1} --batch 16 --max-steps 20 --out {2}/run",
      SHOAL_BINARY, kMlp, dir));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--staleness 0 under --ps-mode bounded"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 30) << r.out;
}

// A worker that waits for a late peer to join its sync job is waiting,
// not silent: its heartbeats run from the moment it is a member. Before,
// they started only once every worker had joined, so worker 0 was dropped
// as frozen after the heartbeat deadline and the job blamed it.
TEST(PsTrainCli, AWorkerWaitingForALatePeerIsNotDroppedAsSilent) {
  constexpr int kSteps = 20;
  const std::string dir = testing::scratch_dir("ps_late");
  auto r = run_sh(fmt::format(
      "SHOAL_PS_HEARTBEAT=2 {0} run --ps 1,2 --timeout 120 -- sh -c 'if [ "
      "\"$SHOAL_PS_WORKER_ID\" = 1 ]; then sleep 6; fi; exec {0} train --dist ps {1} --batch 16 "
      "--max-steps {2} --out {3}/run'",
      SHOAL_BINARY, kMlp, kSteps, dir));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("sent nothing for"), std::string::npos) << r.out;
  EXPECT_EQ(total_pushes(r.out), 2 * kSteps * 6) << r.out;
}

TEST(PsTrainCli, ASyncJobNamesAFailedWorkerAndStops) {
  const std::string dir = testing::scratch_dir("ps_syncfail");
  // The first worker to take the lock dies (exit 3) once training runs.
  auto r = run_shoal(fmt::format(
      "run --ps 1,2 --timeout 120 --ps-snapshots {0}/ps -- sh -c 'if mkdir {0}/victim "
      "2>/dev/null; then {1} train "
      "--dist ps {2} --batch 16 --max-steps 100000 --out {0}/run & p=$!; sleep 2; kill -9 $p; "
      "exit 3; else exec {1} train --dist ps {2} --batch 16 --max-steps 100000 --out {0}/run; fi'",
      dir, SHOAL_BINARY, kMlp));
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("exited with code 3 (a sync job needs every worker)"), std::string::npos)
      << r.out;
  EXPECT_LT(r.seconds, 60) << r.out;
}

// 40 epochs: the victim is killed after the server's first metrics line (a
// line a second); 8 epochs ended before it on a fast host.
TEST(PsTrainCli, AnAsyncJobGoesOnWithoutAKilledWorker) {
  const std::string dir = testing::scratch_dir("ps_asynckill");
  const std::string train =
      fmt::format("{} train --dist ps --ps-mode async {} --batch 16 --epochs 40 --out {}/run",
                  SHOAL_BINARY, kAsyncMlp, dir);
  auto r = run_shoal(
      fmt::format("run --ps 1,2 --timeout 120 --ps-snapshots {0}/ps -- sh -c 'if mkdir {0}/victim "
                  "2>/dev/null; then {1} & p=$!; i=0; while [ $i -lt 600 ] && ! grep -qs "
                  "\\\"pushes\\\":[1-9] {0}/ps/server0.metrics.jsonl; do sleep 0.1; i=$((i+1)); "
                  "done; kill -9 $p; wait $p; else exec {1}; fi'",
                  dir, train));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("exited with code 137"), std::string::npos) << r.out;  // sh: 128 + 9
  EXPECT_NE(r.out.find("the job is async: it goes on without it"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("left: its connection closed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("final: test accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 of 2 workers failed on the way"), std::string::npos) << r.out;
  EXPECT_GT(total_pushes(r.out), 0) << r.out;
  // The server's metrics: a line per second with its traffic and lags.
  std::ifstream in(dir + "/ps/server0.metrics.jsonl");
  std::string line, last;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    last = line;
  }
  EXPECT_GE(lines, 2);
  EXPECT_NE(last.find("\"kind\":\"ps_server\""), std::string::npos) << last;
  EXPECT_GT(numbers_after(last, "\"bytes_in\":").at(0), 1e6) << last;
  EXPECT_NE(last.find("\"lag\":{"), std::string::npos) << last;
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// The roles started by hand, the ps-lite way: a scheduler, a server and a
// worker with DMLC_* set; a second worker joins the running async job
// (beyond DMLC_NUM_WORKER), starts from the servers' current weights, and
// its pushes count. Both use staleness-aware rates (--ps-stale-lr), which
// the server takes with the job's options.
TEST(PsTrainCli, AWorkerJoinsARunningAsyncJobAndItsPushesCount) {
  const std::string dir = testing::scratch_dir("ps_join");
  const std::string env = fmt::format(
      "export SHOAL_JOB_TOKEN=join-token DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT={} "
      "DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1 SHOAL_COMM_TIMEOUT=30",
      testing::free_port());  // tests run in parallel: not a guessed one
  const std::string train =
      fmt::format("{} train --dist ps --ps-mode async --ps-stale-lr {} --batch 16 --epochs 4",
                  SHOAL_BINARY, kAsyncMlp);
  auto r = run_sh(fmt::format(
      "{0}; cd {1}; DMLC_ROLE=scheduler timeout 180 {2} ps scheduler > sched.log 2>&1 & "
      "DMLC_ROLE=server timeout 180 {2} ps server > server.log 2>&1 & "
      "DMLC_ROLE=worker timeout 180 {3} --out {1}/a > a.log 2>&1 & a=$!; "
      "i=0; while [ $i -lt 100 ] && ! grep -q 'joined' a.log; do sleep 0.1; i=$((i+1)); done; "
      "sleep 0.5; DMLC_ROLE=worker timeout 180 {3} --out {1}/b > b.log 2>&1; echo b=$?; "
      "wait $a; echo a=$?; wait; cat sched.log server.log a.log b.log",
      env, dir, SHOAL_BINARY, train));
  EXPECT_NE(r.out.find("b=0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a=0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("worker 1 joined 1 parameter server (async, beyond the first"),
            std::string::npos)
      << r.out;
  const auto by0 = numbers_after(r.out, "pushes by worker: worker 0: ");
  const auto by1 = numbers_after(r.out, ", worker 1: ");
  ASSERT_EQ(by0.size(), 1u) << r.out;
  ASSERT_EQ(by1.size(), 1u) << r.out;
  EXPECT_GT(by0[0], 0) << r.out;
  // The joiner trained its 4 epochs: 128 steps each x 6 parameters.
  EXPECT_EQ(by1[0], 4 * 128 * 6) << r.out;
  EXPECT_NE(r.out.find("ps scheduler: every worker has left; done"), std::string::npos) << r.out;
  // The workers' --ps-stale-lr reached the server as one of the job's options.
  EXPECT_NE(r.out.find("slice_bound=1000000 stale_lr=1"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// A worker frozen mid-run (SIGSTOP: alive, connections open, silent) is
// dropped by the server after the heartbeat deadline and named: a sync job
// stops; an async job finishes without it and the launcher stops it.
TEST(PsTrainCli, AFrozenWorkerIsDroppedAfterItsHeartbeatDeadline) {
  for (std::string mode : {"sync", "async"}) {
    SCOPED_TRACE(mode);
    const std::string dir = testing::scratch_dir("ps_frozen_" + mode);
    // Epochs enough to train past the freeze at 1 s and, async, past the
    // deadline (sync 6 ended in 0.5 s on a fast host; the freeze ends sync).
    const std::string train =
        fmt::format("{} train --dist ps --ps-mode {} {} --batch 16 --epochs {} --out {}/run",
                    SHOAL_BINARY, mode, kAsyncMlp, mode == "sync" ? 60 : 100, dir);
    auto r = run_sh(fmt::format(
        "SHOAL_PS_HEARTBEAT=2 {2} run --ps 1,2 --timeout 100 --ps-snapshots {0}/ps -- sh -c 'if "
        "mkdir {0}/victim "
        "2>/dev/null; then (sleep 1; kill -STOP $$) & exec {1}; else exec {1}; fi'",
        dir, train, SHOAL_BINARY));
    EXPECT_NE(r.out.find("sent nothing for"), std::string::npos) << r.out;
    // Sync: no round closes without it; async: the job goes on without it.
    EXPECT_NE(r.out.find(mode == "sync" ? "(heartbeat deadline 2 s): a sync round needs all 2 "
                                          "workers of the job"
                                        : "(heartbeat deadline 2 s): dropped from the quorum"),
              std::string::npos)
        << r.out;
    if (mode == "sync") {
      EXPECT_NE(r.code, 0) << r.out;
      EXPECT_NE(r.out.find("(a sync job needs every worker)"), std::string::npos) << r.out;
    } else {
      EXPECT_EQ(r.code, 0) << r.out;
      EXPECT_NE(r.out.find("is unresponsive (stopped: state T); stopping it"), std::string::npos)
          << r.out;
      EXPECT_NE(r.out.find("1 of 2 workers failed on the way"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("final: test accuracy"), std::string::npos) << r.out;
    }
    EXPECT_LT(r.seconds, 60) << r.out;
  }
}

// A server stopped mid-run (SIGSTOP: alive, connections open, silent) is
// named by the launcher within seconds and the job stops; before, the
// launcher watched only workers, and a worker was blamed after 311 s.
TEST(PsTrainCli, AFrozenServerIsNamedWithinSeconds) {
  const std::string dir = testing::scratch_dir("ps_frozen_server");
  auto r = run_sh(fmt::format(
      "{0} run --ps 1,2 --timeout 100 --ps-snapshots {1}/ps -- {0} train --dist ps {2} --batch 16 "
      "--epochs 50 --out {1}/run & L=$!; i=0; while [ $i -lt 1500 ] && ! grep -qs "
      "'\"pushes\":[1-9]' {1}/ps/server0.metrics.jsonl; do sleep 0.02; i=$((i+1)); done; "
      "pkill -STOP -f '^{0} ps server .*{1}/ps/server0'; wait $L; echo rc=$?",
      SHOAL_BINARY, dir, kMlp));
  EXPECT_NE(r.out.find("server 0 is unresponsive (stopped: state T)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rc=0"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 40) << r.out;
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// kill -9 the server mid-run: the launcher restarts it from its snapshot,
// the workers reconnect and resend what was unanswered, and the job ends
// with the weights of a run where nothing was killed (sync, within 1e-5):
// no push lost, none applied twice.
TEST(PsTrainCli, AKilledServerRestartsFromItsSnapshotAndNothingIsLostOrDoubled) {
  constexpr int kSteps = 80;
  const std::string dir = testing::scratch_dir("ps_server_kill");
  const std::string train =
      fmt::format("{} train --dist ps {} --batch 16 --max-steps {}", SHOAL_BINARY, kMlp, kSteps);
  auto clean = run_shoal(
      fmt::format("run --ps 1,2 --timeout 120 --ps-snapshot-every 1 --ps-snapshots {0}/s1 -- {1} "
                  "--out {0}/clean",
                  dir, train));
  ASSERT_EQ(clean.code, 0) << clean.out;
  auto killed = run_sh(fmt::format(
      "{1} run --ps 1,2 --timeout 120 --ps-snapshot-every 1 --ps-snapshots {0}/s2 -- {2} --out "
      "{0}/killed & l=$!; "
      "i=0; while [ $i -lt 200 ] && ! [ -f {0}/s2/server0.safetensors ]; do sleep 0.05; "
      "i=$((i+1)); done; sleep 0.5; pkill -9 -f '{0}/s2/[s]erver0.safetensors --snapshot-every'; "
      "wait $l",
      dir, SHOAL_BINARY, train));
  ASSERT_EQ(killed.code, 0) << killed.out;
  EXPECT_NE(killed.out.find("was killed by signal 9 (Killed); restarting it from its snapshot"),
            std::string::npos)
      << killed.out;
  EXPECT_NE(killed.out.find("restored from"), std::string::npos) << killed.out;
  EXPECT_NE(killed.out.find("reconnected to parameter server 0"), std::string::npos) << killed.out;
  auto a = last_checkpoint(dir + "/clean");
  auto b = last_checkpoint(dir + "/killed");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  int params = 0;
  EXPECT_LE(worst_param_diff(*a, *b, &params), 1e-5) << killed.out;
  EXPECT_EQ(params, 6);
}

// Without snapshots (the default) a dead server stops the job, named. The
// epochs are many so the job still trains when the server's first metrics
// line (a line a second) says it updated and the server is killed.
TEST(PsTrainCli, WithoutSnapshotsADeadServerStopsTheJobNamed) {
  const std::string dir = testing::scratch_dir("ps_server_dies");
  auto r = run_sh(fmt::format(
      "{1} run --ps 1,2 --timeout 120 --ps-snapshots {0}/ps -- {1} train --dist ps {2} --batch 16 "
      "--epochs 1000 --max-steps 100000 --out {0}/run & l=$!; i=0; while [ $i -lt 200 ] && ! grep "
      "-qs "
      "'\"updates\":[1-9]' {0}/ps/server0.metrics.jsonl; do sleep 0.05; i=$((i+1)); done; "
      "pkill -9 -f '{0}/ps/[s]erver0.metrics.jsonl'; wait $l",
      dir, SHOAL_BINARY, kMlp));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("server 0 was killed by signal 9 (Killed) while workers were training"),
            std::string::npos)
      << r.out;
  EXPECT_LT(r.seconds, 60) << r.out;
}

}  // namespace
}  // namespace shoal
