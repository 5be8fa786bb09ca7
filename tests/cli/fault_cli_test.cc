// Faults beyond a dead rank, through the real launcher and `shoal train`:
// a frozen rank (SIGSTOP: alive, connections open, silent), the launcher
// itself killed, a rank started twice, and a disk that fills while a
// checkpoint is written. Each names what went wrong and leaves nothing
// behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/run_shoal.h"
#include "shoal/tensor/safetensors.h"
#include "temp_dir.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;
using testing::run_sh;
using testing::run_shoal;
using testing::TempDir;

bool has(const std::string& out, const std::string& s) { return out.find(s) != std::string::npos; }

const char* kTrain =
    "train --model mlp --batch 32 --limit-train 4096 --limit-test 256 --threads 1 --no-plot "
    "--optimizer momentum --lr 0.05";

// A process that is gone: no /proc entry, or a zombie nobody has reaped yet.
bool gone(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(f, line)) return true;
  std::size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

TEST(Faults, FrozenRankIsNamedAndTheRestartProceeds) {
  TempDir dir("frozen");
  const std::string out = dir.path() + "/run";
  // Rank 1 of the first attempt stops itself (SIGSTOP: alive, silent) once
  // a checkpoint exists; the second attempt resumes and finishes.
  auto r = run_shoal(fmt::format(
      "run -n 2 --max-restarts 1 --timeout 120 -- sh -c '"
      "if [ $SHOAL_RESTART_COUNT = 0 ] && [ $SHOAL_RANK = 1 ]; then "
      "(i=0; while [ $i -lt 1500 ] && ! ls {0}/checkpoints/*.safetensors >/dev/null 2>&1; do "
      "sleep 0.02; i=$((i+1)); done; kill -STOP $$) & fi; "
      "SHOAL_COMM_TIMEOUT=3 exec {1} {2} --epochs 40 --checkpoint-every 20 --quiet --out {0}'",
      out, SHOAL_BINARY, kTrain));
  ASSERT_EQ(r.code, 0) << r.out;
  // The survivor names the silent rank, within the collective deadline.
  EXPECT_TRUE(has(r.out, "rank 1 unresponsive: timed out after 3 s")) << r.out;
  // The launcher names it too, and restarts.
  EXPECT_TRUE(has(r.out, "rank 1 was unresponsive (stopped: state T)")) << r.out;
  EXPECT_TRUE(has(r.out, "restarting all 2 ranks from the latest checkpoint (restart 1 of 1)"))
      << r.out;
  EXPECT_TRUE(has(r.out, "resumed from")) << r.out;
  EXPECT_TRUE(has(r.out, "final: test accuracy")) << r.out;
}

// A rank stopped (state T) when another fails cannot act on SIGTERM until
// continued: the launcher kills it at once instead of waiting out its
// 5 s grace (before: the report came 5 s after the survivor exited).
TEST(Faults, AStoppedRankIsKilledAtOnceWhenTheJobFails) {
  auto r = run_shoal(
      "run -n 2 --timeout 60 -- sh -c 'if [ $SHOAL_RANK = 1 ]; then kill -STOP $$; fi; "
      "sleep 1; exit 3'");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(has(r.out, "rank 0 exited with code 3")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1 was unresponsive (stopped: state T)")) << r.out;
  EXPECT_LT(r.seconds, 3.5) << r.out;
}

// A launcher stopped by SIGTERM (a scheduler's cancel, `kill`) or Ctrl-C
// exits as a shell reports the signal, 143 or 130, like srun and mpirun
// (before: 1, which reads as a failed rank).
TEST(Faults, ALauncherStoppedBySignalExitsWith128PlusIt) {
  for (auto [sig, code] : {std::pair{"TERM", 143}, std::pair{"INT", 130}}) {
    auto r = run_sh(fmt::format(
        "{} run -n 2 --timeout 60 -- sleep 30 & L=$!; sleep 1; kill -{} $L; wait $L; echo rc=$?",
        SHOAL_BINARY, sig));
    EXPECT_TRUE(has(r.out, fmt::format("rc={}", code))) << sig << ": " << r.out;
    EXPECT_TRUE(has(r.out, "launcher received signal")) << r.out;
    EXPECT_LT(r.seconds, 10) << r.out;
  }
}

// Ctrl-C (SIGINT) or SIGTERM during training: the run stops at the next
// step boundary with a checkpoint of that step, says so, and exits as the
// signal (130, 143); --resume continues from there. Before: no word and no
// checkpoint (186 steps lost in one run). Under the launcher every rank
// stops after the same step (a vote rides on the step's loss sum).
TEST(Faults, AStopSignalWritesACheckpointAtTheStepBoundary) {
  struct Case {
    const char* sig;
    const char* launcher;
    int code;
  };
  for (const Case& c : {Case{"INT", "", 130}, Case{"TERM", "run -n 2 --timeout 120 --", 143}}) {
    SCOPED_TRACE(c.sig);
    TempDir dir(fmt::format("stop{}", c.sig));
    const std::string run = dir.path() + "/run";
    // Full epochs of 1,875 steps: the stop lands inside one, past any
    // epoch's checkpoint, once the metrics show training under way.
    const std::string launcher =
        *c.launcher ? fmt::format("{} {} ", SHOAL_BINARY, c.launcher) : std::string();
    auto r = run_sh(fmt::format(
        "{1}{0} train --model mlp --batch 32 --limit-test 256 --threads 1 --no-plot "
        "--epochs 50 --out {2} & P=$!; i=0; while [ $i -lt 1500 ] && ! grep -qs '\"train\"' "
        "{2}/metrics.jsonl; do sleep 0.02; i=$((i+1)); done; kill -{3} $P; wait $P; echo rc=$?",
        SHOAL_BINARY, launcher, run, c.sig));
    EXPECT_TRUE(has(r.out, fmt::format("rc={}", c.code))) << r.out;
    const auto at = r.out.find(fmt::format("stopped by SIG{} after step ", c.sig));
    ASSERT_NE(at, std::string::npos) << r.out;
    const long step = std::atol(r.out.c_str() + r.out.find("after step ", at) + 11);
    ASSERT_GT(step, 0) << r.out;
    EXPECT_NE(step % 1875, 0) << r.out;
    const std::string ckpt = fmt::format("{}/checkpoints/ckpt-{:010d}.safetensors", run, step);
    ASSERT_TRUE(fs::exists(ckpt)) << r.out;
    auto resumed = run_sh(fmt::format("{}{} train --out {} --resume --max-steps {}", launcher,
                                      SHOAL_BINARY, run, step + 5));
    EXPECT_EQ(resumed.code, 0) << resumed.out;
    EXPECT_TRUE(has(resumed.out, fmt::format("at step {}", step))) << resumed.out;
  }
}

// A writer killed between creating its temporary and renaming it leaves
// "<file>.tmp.<pid>"; the next run removes those whose writer is dead and
// that nobody wrote to lately, and keeps a live writer's (before: they
// stayed forever, --keep-checkpoints never counted them).
TEST(Faults, TemporariesOfDeadCheckpointWritersAreRemoved) {
  TempDir dir("deadtmp");
  const std::string ck = dir.path() + "/run/checkpoints";
  fs::create_directories(ck);
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);  // reaped: no process has this pid now
  auto make = [&](const std::string& name, bool old) {
    const std::string p = ck + "/" + name;
    std::ofstream(p) << "half a checkpoint";
    if (old) fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::minutes(5));
    return p;
  };
  const std::string stale = make(fmt::format("ckpt-0000000007.safetensors.tmp.{}", dead), true);
  const std::string live = make(fmt::format("ckpt-0000000008.safetensors.tmp.{}", getpid()), true);
  const std::string fresh = make(fmt::format("ckpt-0000000009.safetensors.tmp.{}", dead), false);
  auto r = run_shoal(fmt::format("{} --max-steps 3 --quiet --out {}/run", kTrain, dir.path()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(stale)) << r.out;
  EXPECT_TRUE(fs::exists(live)) << "a live writer's file was removed";
  EXPECT_TRUE(fs::exists(fresh)) << "a file written to seconds ago was removed";
  EXPECT_TRUE(has(r.out, "removed 1 temporary file of checkpoint writers that died")) << r.out;
}

TEST(Faults, KilledLauncherTakesEveryRankWithIt) {
  TempDir dir("orphans");
  const std::string d = dir.path();
  // Each rank writes its pid, then trains for far longer than the test,
  // quietly (a write to the dead launcher's pipe would end it by SIGPIPE).
  // Once a checkpoint shows both train, the launcher gets SIGKILL: it can
  // forward nothing.
  auto r = run_sh(fmt::format(
      "{1} run -n 2 -- sh -c 'echo $$ > {0}/pid.$SHOAL_RANK; exec {1} {2} --epochs 10000 "
      "--quiet --checkpoint-every 20 --out {0}/run' > {0}/launcher.log 2>&1 & L=$!; "
      "i=0; while [ $i -lt 1500 ] && ! ls {0}/run/checkpoints/*.safetensors >/dev/null 2>&1; "
      "do "
      "sleep 0.02; i=$((i+1)); done; "
      "cat /proc/$(cat {0}/pid.0)/maps /proc/$(cat {0}/pid.1)/maps | grep -o '/dev/shm/[^ ]*' "
      "> {0}/shm.txt; kill -9 $L; echo killed",
      d, SHOAL_BINARY, kTrain));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream log(d + "/launcher.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  ASSERT_TRUE(fs::exists(d + "/run/checkpoints")) << text;
  std::vector<pid_t> ranks;
  for (int k = 0; k < 2; ++k) {
    std::ifstream f(fmt::format("{}/pid.{}", d, k));
    pid_t p = 0;
    ASSERT_TRUE(f >> p) << "rank " << k << " wrote no pid";
    ranks.push_back(p);
  }
  // Every rank exits within seconds of its launcher.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (pid_t p : ranks) {
    while (!gone(p) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(gone(p)) << "rank pid " << p << " outlived its launcher by 5 s";
    if (!gone(p)) kill(p, SIGKILL);
  }
  // Nothing the ranks had mapped from /dev/shm is left there.
  std::ifstream shm(d + "/shm.txt");
  for (std::string path; std::getline(shm, path);)
    EXPECT_FALSE(fs::exists(path)) << path << " was left behind";
}

// Two jobs, one after the other, rendezvous through the same
// SHOAL_STORE_DIR (no launcher): the second must not read the first's keys
// (before, it failed on a stale shared-memory name).
TEST(Faults, ASecondJobInTheSameStoreDirectoryRuns) {
  TempDir dir("storedir");
  for (const char* job : {"first", "second"}) {
    auto r = run_sh(fmt::format(
        "for r in 0 1; do SHOAL_STORE_DIR={0} SHOAL_JOB_ID={1} SHOAL_RANK=$r SHOAL_WORLD_SIZE=2 "
        "SHOAL_COMM_TIMEOUT=20 {2} bench comm --max-bytes 4096 --seconds 0.01 > {0}/{1}.$r.log "
        "2>&1 & done; wait %1; a=$?; wait %2; b=$?; cat {0}/{1}.*.log; exit $((a + b))",
        dir.path(), job, SHOAL_BINARY));
    EXPECT_EQ(r.code, 0) << job << " job:\n" << r.out;
  }
}

// Two processes both claim rank 0 of a 2-rank job: the second is refused
// by name at once, and the job (the first rank 0 with rank 1) still runs.
TEST(Faults, ARankStartedTwiceIsRefusedByName) {
  TempDir dir("twice");
  auto r = run_sh(fmt::format(
      "export SHOAL_STORE_DIR={0} SHOAL_JOB_ID=twice SHOAL_WORLD_SIZE=2 SHOAL_COMM_TIMEOUT=20; "
      "SHOAL_RANK=0 {1} bench comm --max-bytes 4096 --seconds 0.01 > {0}/a.log 2>&1 & "
      "sleep 1; SHOAL_RANK=0 {1} bench comm --max-bytes 4096 --seconds 0.01 > {0}/b.log 2>&1; "
      "echo dup-exit=$?; cat {0}/b.log; "
      "SHOAL_RANK=1 {1} bench comm --max-bytes 4096 --seconds 0.01 > {0}/c.log 2>&1; "
      "echo rank1-exit=$?; wait %1; echo first-exit=$?",
      dir.path(), SHOAL_BINARY));
  EXPECT_TRUE(has(r.out, "rank 0 of 2 is already taken by pid ")) << r.out;
  EXPECT_FALSE(has(r.out, "dup-exit=0")) << r.out;
  EXPECT_TRUE(has(r.out, "rank1-exit=0")) << r.out;
  EXPECT_TRUE(has(r.out, "first-exit=0")) << r.out;
  EXPECT_LT(r.seconds, 15.0) << r.out;
}

// One rank's wall clock an hour behind (libfaketime, Debian's faketime,
// monotonic clocks left real so deadlines still work; under ASan its
// preload comes before the ASan runtime, which ASan then must be told is
// fine): refused at start-up, naming the rank and both clocks. Rank 0
// sees the skew too, but its report races the launcher, which stops every
// rank as soon as rank 1 exits (seen once in 4 runs here): either is fine.
TEST(Faults, ARankWhoseClockDiffersIsRefusedByName) {
  if (run_sh("command -v faketime").code != 0)
    GTEST_SKIP() << "faketime is not installed (tools/install-deps.sh installs it)";
  auto r = run_shoal(fmt::format(
      "run -n 2 --timeout 60 -- sh -c 'if [ $SHOAL_RANK = 1 ]; then "
      "FAKETIME_DONT_FAKE_MONOTONIC=1 ASAN_OPTIONS=$ASAN_OPTIONS:verify_asan_link_order=0 exec "
      "faketime -f -1h {0} bench comm --max-bytes 4096 "
      "--seconds 0.01; fi; exec {0} bench comm --max-bytes 4096 --seconds 0.01'",
      SHOAL_BINARY));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 0] ") || has(r.out, "rank 0 was killed by signal 15")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1's clock is 3600")) << r.out;
  EXPECT_TRUE(has(r.out, "s behind rank 0's (rank 1: ")) << r.out;
  EXPECT_TRUE(has(r.out, "SHOAL_MAX_CLOCK_SKEW=60 s")) << r.out;
}

// A rank of the local engine whose hostname differs (its own UTS
// namespace) is not on "this host" as the launcher promised: refused.
TEST(Faults, ARankOnAnotherHostnameIsRefusedByName) {
  if (run_sh("unshare -u true").code != 0)
    GTEST_SKIP() << "cannot make a UTS namespace here (unshare -u needs root)";
  auto r = run_shoal(fmt::format(
      "run -n 2 --timeout 60 -- sh -c 'if [ $SHOAL_RANK = 1 ]; then exec unshare -u sh -c "
      "\"hostname shoal-elsewhere && exec {0} bench comm --max-bytes 4096 --seconds 0.01\"; "
      "fi; exec {0} bench comm --max-bytes 4096 --seconds 0.01'",
      SHOAL_BINARY));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1 runs on host 'shoal-elsewhere' but rank 0 runs on")) << r.out;
  EXPECT_TRUE(has(r.out, "the launcher started all 2 ranks on one host")) << r.out;
}

// The disk fills while a checkpoint is written (a 6 MiB tmpfs in a private
// mount namespace: the MLP's checkpoint with momentum is ~4.3 MB, so the
// first fits and the second does not). Training stops with an error naming
// the file and ENOSPC, no partial file is left, and the previous
// checkpoint still loads.
TEST(Faults, DiskFullWhileCheckpointingKeepsThePreviousOne) {
  if (run_sh("unshare -m true").code != 0)
    GTEST_SKIP() << "cannot make a private mount namespace here (unshare -m needs root or "
                    "user namespaces)";
  TempDir dir("diskfull");
  const std::string d = dir.path();
  fs::create_directories(d + "/small");
  auto r = run_sh(fmt::format(
      "unshare -m sh -c 'mount -t tmpfs -o size=6m shoal-test {0}/small || exit 90; "
      "{1} {2} --max-steps 10 --checkpoint-every 5 --out {0}/small/run; echo train-exit=$?; "
      "ls {0}/small/run/checkpoints; cp {0}/small/run/checkpoints/*.safetensors {0}/ 2>/dev/null; "
      "true'",
      d, SHOAL_BINARY, kTrain));
  if (r.code == 90) GTEST_SKIP() << "mounting a tmpfs was refused: " << r.out;
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "train-exit=1")) << r.out;
  EXPECT_TRUE(has(r.out, "ckpt-0000000010.safetensors.tmp")) << r.out;  // the file it was writing
  EXPECT_TRUE(has(r.out, "No space left on device")) << r.out;
  // Only the complete checkpoint is there: no partial file.
  const std::size_t listing = r.out.find("train-exit=1\n");
  ASSERT_NE(listing, std::string::npos) << r.out;
  EXPECT_EQ(r.out.substr(listing + 13), "ckpt-0000000005.safetensors\n") << r.out;
  auto ck = read_safetensors(d + "/ckpt-0000000005.safetensors");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->metadata.at("step"), "5");

  // Two ranks: rank 1 names rank 0's failed write, not a mismatch of the
  // ranks' calls (before: "the ranks' call sequences differ").
  fs::create_directories(d + "/small2");
  auto two = run_sh(
      fmt::format("unshare -m sh -c 'mount -t tmpfs -o size=6m shoal-test {0}/small2 || exit 90; "
                  "{1} run -n 2 --timeout 120 -- {1} {2} --max-steps 10 --checkpoint-every 5 --out "
                  "{0}/small2/run; echo run-exit=$?'",
                  d, SHOAL_BINARY, kTrain));
  EXPECT_TRUE(has(two.out, "run-exit=1")) << two.out;
  EXPECT_TRUE(has(two.out, "No space left on device")) << two.out;
  EXPECT_TRUE(has(two.out, "checkpoint at step 10: rank 0 could not write it")) << two.out;
  EXPECT_FALSE(has(two.out, "call sequences differ")) << two.out;
}

}  // namespace
}  // namespace shoal
