// The parameter server over its real transport (authenticated frames on
// loopback): two worker threads in sync mode equal one process stepping
// on the mean gradient; a worker whose process dies releases its rounds;
// bad requests are refused by name while the server serves on; a server
// restarted from its snapshot keeps its values and versions.
#include "shoal/ps/server.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <latch>
#include <mutex>
#include <thread>
#include <vector>

#include "ps/heartbeat.h"
#include "ps/wire.h"
#include "shoal/net/frame_server.h"
#include "shoal/ps/worker.h"
#include "shoal/train/checkpoint.h"
#include "temp_dir.h"

namespace shoal::ps {
namespace {

const std::string kToken = "ps-test-token";

ServerOptions options(Mode mode, double lr, const std::string& snapshot) {
  ServerOptions o;
  o.shard.mode = mode;
  o.shard.lr = lr;
  o.snapshot = snapshot;
  o.snapshot_every = snapshot.empty() ? 0 : 1;
  return o;
}
std::unique_ptr<Server> serve(Mode mode, double lr, const std::string& snapshot = "") {
  auto s = Server::start("127.0.0.1", 0, kToken, options(mode, lr, snapshot));
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(s).value();
}
std::string addr(const Server& s) { return "127.0.0.1:" + std::to_string(s.port()); }
Deadline soon() { return Deadline::after_seconds(20); }

// Worker w's least-squares gradient on its own 5 rows: X^T (X v - y) / 5.
std::vector<float> grad(int w, const std::vector<float>& v) {
  const int n = static_cast<int>(v.size());
  std::vector<float> g(v.size(), 0.f);
  for (int r = 0; r < 5; ++r) {
    float pred = 0, y = static_cast<float>((r + 3 * w) % 4) - 1.5f;
    for (int j = 0; j < n; ++j) pred += static_cast<float>((r * 7 + j * 3 + w) % 5) * 0.2f * v[j];
    for (int j = 0; j < n; ++j)
      g[j] += static_cast<float>((r * 7 + j * 3 + w) % 5) * 0.2f * (pred - y) / 5.f;
  }
  return g;
}
Tensor tensor(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())});
}
std::vector<float> floats(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(PsServer, SyncWorkersEqualOneProcessOnTheMeanGradient) {
  auto server = serve(Mode::kSync, 0.3);
  const std::vector<float> w0 = {0.5f, -1, 0.25f, 2, 0, 1, -0.5f};  // 7: no even split anywhere
  constexpr int kSteps = 20;
  std::vector<std::vector<float>> got(2);
  std::latch joined(2);  // a sync job starts once every worker is in (the launcher's gang)
  auto work = [&](int id) {
    auto w = Worker::connect({addr(*server)}, kToken, id, soon());
    const Status init = w.ok() ? (*w)->init("w", tensor(w0)) : w.status();
    joined.arrive_and_wait();  // also on failure: the other thread must not wait forever
    ASSERT_TRUE(init.ok()) << init.to_string();
    std::vector<float> v = w0;
    for (int step = 0; step < kSteps; ++step) {
      auto pr = (*w)->push("w", step, tensor(grad(id, v)), soon());
      ASSERT_TRUE(pr.ok()) << pr.status().to_string();
      auto p = (*w)->pull("w", static_cast<std::uint64_t>(step + 1), soon());
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      ASSERT_EQ(p->first, static_cast<std::uint64_t>(step + 1));
      v = floats(p->second);
    }
    got[static_cast<std::size_t>(id)] = v;
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  std::vector<float> ref = w0;  // one process, the mean of both workers' gradients
  for (int step = 0; step < kSteps; ++step) {
    auto g0 = grad(0, ref), g1 = grad(1, ref);
    for (std::size_t j = 0; j < ref.size(); ++j) ref[j] -= 0.3f * ((g0[j] + g1[j]) * 0.5f);
  }
  for (int id : {0, 1})
    for (std::size_t j = 0; j < ref.size(); ++j)
      EXPECT_NEAR(got[static_cast<std::size_t>(id)][j], ref[j], 1e-5f * (1 + std::fabs(ref[j])))
          << "worker " << id << " element " << j;
  EXPECT_EQ(server->stats().rounds, static_cast<std::uint64_t>(kSteps));
  EXPECT_EQ(server->stats().duplicates, 0u);
}

// A key of over 2^20 elements goes in blocks of at most 2^20, as many on
// every server, all in flight at once; on one server too. Sync push-pulls of
// two workers over 1 and 2 servers equal one process on the mean gradient.
TEST(PsServer, ABigKeyGoesInBlocksAndEqualsOneProcess) {
  const std::int64_t n = 3 * (std::int64_t{1} << 20) + 5;  // no even split
  constexpr int kSteps = 3;
  constexpr float kLr = 0.5f;
  auto g = [](int w, std::int64_t i, int step) {
    return 0.001f * static_cast<float>((i * 7 + w * 3 + step) % 11) - 0.005f;
  };
  for (int servers : {1, 2}) {
    SCOPED_TRACE(fmt::format("{} servers", servers));
    ServerOptions o;
    o.shard.lr = kLr;
    std::vector<std::unique_ptr<Server>> ss;
    std::vector<std::string> addrs;
    for (int i = 0; i < servers; ++i) {
      ss.push_back(serve(Mode::kSync, kLr));
      addrs.push_back(addr(*ss.back()));
    }
    std::vector<Tensor> got(2);
    std::latch joined(2);
    auto work = [&](int id) {
      auto w = Worker::connect(addrs, kToken, id, soon(), &o.shard);
      const Status init = w.ok() ? (*w)->init("big", Tensor::zeros({n}, DType::kF32)) : w.status();
      joined.arrive_and_wait();
      ASSERT_TRUE(init.ok()) << init.to_string();
      Tensor into = Tensor::zeros({n}, DType::kF32), grad = Tensor::empty({n}, DType::kF32);
      for (int step = 0; step < kSteps; ++step) {
        for (std::int64_t i = 0; i < n; ++i) grad.data<float>()[i] = g(id, i, step);
        auto p = (*w)->push_pull("big", step, grad, 0, soon(), &into);
        ASSERT_TRUE(p.ok()) << p.status().to_string();
        ASSERT_EQ(p->version, static_cast<std::uint64_t>(step + 1));
      }
      got[static_cast<std::size_t>(id)] = into;
    };
    std::thread a(work, 0), b(work, 1);
    a.join();
    b.join();
    for (int id : {0, 1}) {
      ASSERT_TRUE(got[static_cast<std::size_t>(id)].defined());
      const float* v = got[static_cast<std::size_t>(id)].data<float>();
      for (std::int64_t i = 0; i < n; i += 4099) {  // one process: SGD on the mean
        float ref = 0;
        for (int step = 0; step < kSteps; ++step)
          ref -= kLr * ((g(0, i, step) + g(1, i, step)) * 0.5f);
        ASSERT_NEAR(v[i], ref, 1e-6f) << "worker " << id << " element " << i;
      }
    }
    // 4 blocks of at most 2^20: all on the one server, or 2 on each of two.
    for (const auto& s : ss)
      EXPECT_EQ(s->stats().rounds, static_cast<std::uint64_t>(kSteps * 4 / servers));
  }
}

// A worker process that joins and dies (no leave) must not hold the sync
// round: its connection closes and the server drops it from the quorum.
TEST(PsServer, AWorkerWhoseProcessDiesReleasesItsRounds) {
  auto server = serve(Mode::kSync, 1.0);
  auto w = Worker::connect({addr(*server)}, kToken, 0, soon());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE((*w)->init("b", tensor({4})).ok());
  pid_t child = fork();
  if (child == 0) {
    auto c = Worker::connect({addr(*server)}, kToken, 1, soon());
    _exit(c.ok() ? 0 : 1);  // dies joined: no leave
  }
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_EQ(WEXITSTATUS(st), 0);
  ASSERT_TRUE((*w)->push("b", 0, tensor({1}), soon()).ok());
  auto p = (*w)->pull("b", 1, Deadline::after_seconds(10));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(floats(p->second), std::vector<float>{3});
}

TEST(PsServer, BadRequestsAreRefusedByNameAndTheServerServesOn) {
  auto server = serve(Mode::kAsync, 1.0);
  auto impostor = Worker::connect({addr(*server)}, "another-token", 9, soon());
  ASSERT_FALSE(impostor.ok());
  EXPECT_NE(impostor.status().message().find("does not hold this job's token"), std::string::npos)
      << impostor.status().to_string();
  auto w = Worker::connect({addr(*server)}, kToken, 0, soon());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE((*w)->init("k", tensor({1, 2})).ok());
  auto unknown = (*w)->push("nope", 0, tensor({1, 2}), soon());
  EXPECT_NE(unknown.status().message().find("key 'nope', which this server does not hold"),
            std::string::npos)
      << unknown.status().to_string();
  auto wrong = (*w)->push("k", 0, tensor({1, 2, 3}), soon());
  EXPECT_NE(wrong.status().message().find("as f32 [3]; the key is f32 [2]"), std::string::npos)
      << wrong.status().to_string();
  // A malformed message on an authenticated connection: refused, named.
  auto raw = net::connect_authenticated("127.0.0.1", server->port(), soon(), kToken, "ps server");
  ASSERT_TRUE(raw.ok());
  const std::string junk = std::string("P") + "\x01\x00";
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kPsRequest);
  h.length = junk.size();
  ASSERT_TRUE(raw->send_frame(h, junk.data(), soon()).ok());
  auto rep =
      net::recv_reply(*raw, net::FrameType::kPsReply, net::FrameType::kStoreError, 4096, soon());
  EXPECT_NE(rep.status().message().find("field 'worker' at byte 1"), std::string::npos)
      << rep.status().to_string();
  // And it serves on.
  ASSERT_EQ(*(*w)->push("k", 0, tensor({1, 1}), soon()), PushResult::kApplied);
  auto p = (*w)->pull("k", 1, soon());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(floats(p->second), (std::vector<float>{0, 1}));
}

// An async server (lr 1) on `snap` whose key k, (10, 20), took `pushes`
// pushes of (1, 2); stopped, so its last snapshot is written.
void push_then_stop(const std::string& snap, int pushes) {
  auto server = serve(Mode::kAsync, 1.0, snap);
  auto w = Worker::connect({addr(*server)}, kToken, 0, soon());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->init("k", tensor({10, 20})).ok());
  for (int s = 0; s < pushes; ++s) ASSERT_TRUE((*w)->push("k", s, tensor({1, 2}), soon()).ok());
}

// Key k's value on `server` once it has `version` updates.
void expect_k(const Server& server, std::uint64_t version, const std::vector<float>& want) {
  auto w = Worker::connect({addr(server)}, kToken, 0, soon());
  ASSERT_TRUE(w.ok());
  auto p = (*w)->pull("k", version, soon());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->first, version);
  EXPECT_EQ(floats(p->second), want);
}

TEST(PsServer, ARestartedServerKeepsValuesAndVersions) {
  shoal::testing::TempDir dir("ps_server");
  const std::string snap = dir.path() + "/server0.safetensors";
  push_then_stop(snap, 3);
  expect_k(*serve(Mode::kAsync, 1.0, snap), 3, {7, 14});
}

// Snapshots are written off the serving thread, but an answer waits for
// the snapshot that holds its update: whenever a push has been answered,
// the file on disk already holds it. A snapshot that cannot be written
// refuses the answers waiting for it, naming the file.
TEST(PsServer, AnAnsweredPushIsAlreadyInTheSnapshotOnDisk) {
  shoal::testing::TempDir dir("ps_server");
  const std::string snap = dir.path() + "/server0.safetensors";
  auto server = serve(Mode::kAsync, 1.0, snap);
  auto w = Worker::connect({addr(*server)}, kToken, 0, soon());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->init("k", tensor({10, 20})).ok());
  for (int s = 0; s < 20; ++s) {
    auto pr = (*w)->push("k", s, tensor({1, 2}), soon());
    ASSERT_TRUE(pr.ok()) << pr.status().to_string();
    auto on_disk = train::load_checkpoint(snap);
    ASSERT_TRUE(on_disk.ok()) << on_disk.status().to_string();
    EXPECT_EQ(on_disk->get_int("version/k", -1), s + 1);
    EXPECT_EQ(floats(on_disk->tensors.at("value/k")),
              (std::vector<float>{10.f - (s + 1), 20.f - 2 * (s + 1)}));
  }
  auto bad = serve(Mode::kAsync, 1.0, dir.path() + "/no/such/dir/server0.safetensors");
  auto wb = Worker::connect({addr(*bad)}, kToken, 0, soon());
  ASSERT_TRUE(wb.ok());
  ASSERT_TRUE((*wb)->init("k", tensor({1, 2})).ok());
  auto pr = (*wb)->push("k", 0, tensor({1, 2}), soon());
  ASSERT_FALSE(pr.ok());
  EXPECT_NE(pr.status().message().find("snapshot " + dir.path() + "/no/such/dir"),
            std::string::npos)
      << pr.status().to_string();
}

// A snapshot belongs to the job that wrote it: a server of another job
// (another token) on the same file is refused, naming it; before, the old
// job's sequence marks made every push of the new job a duplicate and its
// workers waited for ever.
TEST(PsServer, AnotherJobsSnapshotIsRefusedByName) {
  shoal::testing::TempDir dir("ps_server");
  const std::string snap = dir.path() + "/server0.safetensors";
  push_then_stop(snap, 1);
  const ServerOptions o = options(Mode::kAsync, 1.0, snap);
  auto other = Server::start("127.0.0.1", 0, "another-job-token", o);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find(snap + " is the snapshot of another job"),
            std::string::npos)
      << other.status().to_string();
  // The same job restarts on it, and finds its update: the refused server
  // wrote nothing over the file (before, its last snapshot at exit did).
  auto same = Server::start("127.0.0.1", 0, kToken, o);
  ASSERT_TRUE(same.ok()) << same.status().to_string();
  expect_k(**same, 1, {9, 18});
}

// Servers started without options adopt the first worker's, refuse a
// worker that asks for others by field, and answer a push-pull with the
// value once the sync round closes.
TEST(PsServer, OptionsComeFromTheFirstWorkerAndPushPullAnswersAtRoundClose) {
  ServerOptions o;
  o.configured = false;
  auto s = Server::start("127.0.0.1", 0, kToken, o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ShardOptions job;
  job.mode = Mode::kSync;
  job.lr = 0.5;
  auto a = Worker::connect({addr(**s)}, kToken, 0, soon(), &job);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ShardOptions other = job;
  other.optimizer.name = "adam";
  auto bad = Worker::connect({addr(**s)}, kToken, 1, soon(), &other);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("optimizer: the server has sgd, the worker asks for adam"),
            std::string::npos)
      << bad.status().to_string();
  auto b = Worker::connect({addr(**s)}, kToken, 1, soon(), &job);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_TRUE((*a)->init("k", tensor({1, 1})).ok());
  ASSERT_TRUE((*b)->init("k", tensor({9, 9})).ok());  // the first value stays
  Result<Worker::Pulled> pa = internal_error("unset");
  std::thread ta([&] { pa = (*a)->push_pull("k", 0, tensor({1, 2}), 0.25, soon()); });
  auto pb = (*b)->push_pull("k", 0, tensor({3, 4}), 0.25, soon());
  ta.join();
  ASSERT_TRUE(pa.ok()) << pa.status().to_string();
  ASSERT_TRUE(pb.ok()) << pb.status().to_string();
  // SGD with the pushed lr (0.25, not the options' 0.5) on the mean (2, 3).
  EXPECT_EQ(floats(pa->value), (std::vector<float>{0.5f, 0.25f}));
  EXPECT_EQ(floats(pb->value), floats(pa->value));
  EXPECT_EQ(pa->version, 1u);
  EXPECT_EQ((*s)->stats().rounds, 1u);
  EXPECT_EQ((*s)->stats().by_worker.at(1), 1u);
}

// A member that sends nothing past the heartbeat deadline is dropped, and
// the round it held closes for the others.
TEST(PsServer, ASilentWorkerIsDroppedAtItsHeartbeatDeadline) {
  ServerOptions o;
  o.shard.mode = Mode::kSync;
  o.shard.lr = 1;
  o.heartbeat_s = 0.5;
  auto s = Server::start("127.0.0.1", 0, kToken, o);
  ASSERT_TRUE(s.ok());
  auto a = Worker::connect({addr(**s)}, kToken, 0, soon());
  auto silent = Worker::connect({addr(**s)}, kToken, 1, soon());
  ASSERT_TRUE(a.ok() && silent.ok());
  ASSERT_TRUE((*a)->init("k", tensor({0})).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto p = (*a)->push_pull("k", 0, tensor({2}), 0, soon());  // waits for worker 1, then not
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(floats(p->value), (std::vector<float>{-2.f}));
  EXPECT_GE(waited, 0.4);
  EXPECT_LT(waited, 5.0);
  // Worker 1 is dropped (worker 0 too: it sent nothing while it waited,
  // and this test gives it no heartbeat thread, unlike ps::WorkerJob).
  bool one = false;
  for (const auto& [w, line] : (*s)->take_drops())
    if (w == 1) one = line.find("worker 1 sent nothing for") != std::string::npos;
  EXPECT_TRUE(one);
}

// A worker's heartbeats follow a server that restarted at a new address:
// the new server keeps the worker (whose own connection stays idle) past
// its heartbeat deadline, where heartbeats that gave up would let it go.
TEST(PsServer, HeartbeatsReachARestartedServer) {
  ServerOptions o;
  o.shard.mode = Mode::kAsync;
  o.heartbeat_s = 1;
  auto first = Server::start("127.0.0.1", 0, kToken, o);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  std::mutex mu;
  std::string registered = addr(**first);
  auto hb = Heartbeat::start({registered}, kToken, 0, 0.2, 1.0, [&](int) {
    std::lock_guard<std::mutex> lk(mu);
    return registered;
  });
  ASSERT_TRUE(hb.ok()) << hb.status().to_string();
  first->reset();  // the server dies; heartbeats to it fail
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto second = Server::start("127.0.0.1", 0, kToken, o);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  {
    std::lock_guard<std::mutex> lk(mu);
    registered = addr(**second);  // it registers again
  }
  auto w = Worker::connect({addr(**second)}, kToken, 0, soon(), &o.shard);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // 2.5 deadlines, idle
  const auto drops = (*second)->take_drops();
  EXPECT_TRUE(drops.empty()) << drops.front().second;
}

}  // namespace
}  // namespace shoal::ps

namespace shoal::ps {
namespace {

// Staleness over the real transport: the server notes the version each
// push-pull's answer carried to its worker, so a worker whose value is two
// updates old gets half the rate under stale_lr.
TEST(PsServer, AStaleAsyncPushGetsItsRateDividedByItsStaleness) {
  ServerOptions o;
  o.shard.mode = Mode::kAsync;
  o.shard.lr = 1.0;
  o.shard.stale_lr = true;
  auto s = Server::start("127.0.0.1", 0, kToken, o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto w0 = Worker::connect({addr(**s)}, kToken, 0, soon(), &o.shard);
  auto w1 = Worker::connect({addr(**s)}, kToken, 1, soon(), &o.shard);
  ASSERT_TRUE(w0.ok() && w1.ok());
  ASSERT_TRUE((*w0)->init("w", tensor({0})).ok());
  ASSERT_TRUE((*w1)->init("w", tensor({0})).ok());
  // Worker 0 is answered with version 1; worker 1 then updates twice.
  ASSERT_TRUE((*w0)->push_pull("w", 0, tensor({1}), 0, soon()).ok());
  ASSERT_TRUE((*w1)->push_pull("w", 0, tensor({1}), 0, soon()).ok());
  ASSERT_TRUE((*w1)->push_pull("w", 1, tensor({1}), 0, soon()).ok());
  // Worker 1's second push was 0 updates old (full rate); worker 0's next
  // is 2 old: 4 / 2. (First pushes, before any answer, count as unknown.)
  auto p = (*w0)->push_pull("w", 1, tensor({4}), 0, soon());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(floats(p->value), std::vector<float>{-5});
  EXPECT_EQ((*s)->stats().staleness_sum, 2u);
  EXPECT_EQ((*s)->stats().staleness_pushes, 2u);
}

}  // namespace
}  // namespace shoal::ps
