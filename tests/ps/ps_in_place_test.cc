// Push-pulls with a server on the worker's host, through shared memory
// (wire ops 'M' and 'Y'): the server reads each gradient from the worker's
// region and writes the value into it. Two sync workers equal the same
// job over TCP bit for bit (and one process on the mean gradient), and no
// gradient or value crosses the socket; a worker whose memory the server
// cannot map falls back to TCP; a shmpushpull naming memory that is not
// the worker's is refused by name while the server serves on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <latch>
#include <thread>
#include <vector>

#include "ps/wire.h"
#include "shoal/comm/communicator.h"
#include "shoal/net/frame_server.h"
#include "shoal/net/shared_memory.h"
#include "shoal/ps/server.h"
#include "shoal/ps/worker.h"

namespace shoal::ps {
namespace {

const std::string kToken = "ps-in-place-token";
Deadline soon() { return Deadline::after_seconds(20); }

std::unique_ptr<Server> serve(double lr, std::int64_t bound = 1000000) {
  ServerOptions o;
  o.shard.mode = Mode::kSync;
  o.shard.lr = lr;
  o.shard.slice_bound = bound;
  auto s = Server::start("127.0.0.1", 0, kToken, o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(s).value();
}
std::string addr(const Server& s) { return "127.0.0.1:" + std::to_string(s.port()); }

// An f32 tensor in a shared region, as a training arena's buffers are.
Tensor shared_tensor(std::int64_t n) {
  auto st = comm::Communicator::shared_arena(static_cast<std::size_t>(4 * n));
  EXPECT_TRUE(st.ok());
  return Tensor::from_storage(*st, {n}, DType::kF32);
}

// Worker w's gradient at v: a fixed linear map, different per worker.
float grad_at(int w, std::int64_t i, const float* v, std::int64_t n) {
  return 0.1f * v[(i * 3 + w) % n] - 0.05f * static_cast<float>((i + 2 * w) % 7) + 0.01f * w;
}

struct Job {
  std::vector<std::vector<float>> values;  // by worker
  Server::Traffic traffic;
  std::vector<int>
      in_place;  // whether each worker's server mapped it (not vector<bool>: two threads write)
};

// Two sync workers push-pull one key of n elements (sliced in blocks when
// n >= bound) for `steps` steps, gradient and value in shared regions.
Job train(bool in_place, std::int64_t n, std::int64_t bound, int steps) {
  auto server = serve(0.5, bound);
  ShardOptions so;
  so.mode = Mode::kSync;
  so.lr = 0.5;
  so.slice_bound = bound;
  Job run;
  run.values.resize(2);
  run.in_place.resize(2);
  std::latch joined(2);
  auto work = [&](int id) {
    auto w = Worker::connect({addr(*server)}, kToken, id, soon(), &so);
    const Status init = w.ok() ? (*w)->init("k", Tensor::zeros({n}, DType::kF32)) : w.status();
    joined.arrive_and_wait();
    ASSERT_TRUE(init.ok()) << init.to_string();
    (*w)->set_in_place(in_place);
    run.in_place[static_cast<std::size_t>(id)] = (*w)->in_place(0);
    Tensor v = shared_tensor(n), g = shared_tensor(n);
    for (int step = 0; step < steps; ++step) {
      for (std::int64_t i = 0; i < n; ++i) g.data<float>()[i] = grad_at(id, i, v.data<float>(), n);
      auto p = (*w)->push_pull("k", step, g, 0, soon(), &v);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      ASSERT_EQ(p->version, static_cast<std::uint64_t>(step + 1));
    }
    run.values[static_cast<std::size_t>(id)].assign(v.data<float>(), v.data<float>() + n);
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  run.traffic = server->traffic();
  return run;
}

TEST(PsInPlace, SharedMemoryPushPullsEqualTcpOnesAndSkipTheSocket) {
  constexpr int kSteps = 6;
  // 11 elements in one key; 2,500 in blocks of at most 1,000 (3 blocks,
  // one uneven), each block's gradient and value a view into the region.
  for (auto [n, bound] : {std::pair<std::int64_t, std::int64_t>{11, 1000000}, {2500, 1000}}) {
    SCOPED_TRACE(fmt::format("{} elements, slice bound {}", n, bound));
    const Job shm = train(true, n, bound, kSteps);
    const Job tcp = train(false, n, bound, kSteps);
    ASSERT_EQ(shm.values[0].size(), static_cast<std::size_t>(n));
    EXPECT_TRUE(shm.in_place[0] && shm.in_place[1]) << "the server could not map this process";
    for (int w : {0, 1}) {
      EXPECT_EQ(shm.values[static_cast<std::size_t>(w)], tcp.values[static_cast<std::size_t>(w)])
          << "worker " << w;
      EXPECT_EQ(shm.values[static_cast<std::size_t>(w)], shm.values[0]);
    }
    // One process on the mean gradient.
    std::vector<float> ref(static_cast<std::size_t>(n), 0.f), g(ref.size());
    for (int step = 0; step < kSteps; ++step) {
      for (std::int64_t i = 0; i < n; ++i)
        g[static_cast<std::size_t>(i)] =
            (grad_at(0, i, ref.data(), n) + grad_at(1, i, ref.data(), n)) * 0.5f;
      for (std::size_t i = 0; i < ref.size(); ++i) ref[i] -= 0.5f * g[i];
    }
    for (std::size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(shm.values[0][i], ref[i], 1e-5f * (1 + std::fabs(ref[i]))) << "element " << i;
    // Every gradient was read from, every value written into, the workers'
    // memory; over TCP, none.
    const std::uint64_t bytes = 2ull * kSteps * 4 * static_cast<std::uint64_t>(n);
    EXPECT_EQ(shm.traffic.shm_in, bytes);
    EXPECT_EQ(shm.traffic.shm_out, bytes);
    EXPECT_EQ(tcp.traffic.shm_in, 0u);
    EXPECT_GE(tcp.traffic.bytes_in, bytes);
    // The sockets carried TCP's bytes less every gradient and value: a
    // shmpushpull's references cost at most 70 bytes more than a pushpull's head.
    const std::uint64_t requests =
        2ull * kSteps * static_cast<std::uint64_t>((n + bound - 1) / bound);
    EXPECT_LE(shm.traffic.bytes_in + bytes, tcp.traffic.bytes_in + 70 * requests);
    EXPECT_EQ(shm.traffic.bytes_out + bytes, tcp.traffic.bytes_out);
  }
}

// Memory in private pages (not a shared region) goes over TCP even to a
// server that maps this process: nothing to map.
TEST(PsInPlace, PrivateMemoryGoesOverTcp) {
  auto server = serve(1.0);
  auto w = Worker::connect({addr(*server)}, kToken, 0, soon());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE((*w)->in_place(0));
  ASSERT_TRUE((*w)->init("k", Tensor::from_vector(std::vector<float>{1, 2}, {2})).ok());
  Tensor into = Tensor::zeros({2}, DType::kF32);
  auto p =
      (*w)->push_pull("k", 0, Tensor::from_vector(std::vector<float>{1, 1}, {2}), 0, soon(), &into);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(std::vector<float>(into.data<float>(), into.data<float>() + 2),
            (std::vector<float>{0, 1}));
  EXPECT_EQ(server->traffic().shm_in, 0u);
}

// Sends `r` on a raw authenticated connection; the refusal's text.
std::string refusal(net::Socket& s, const Request& r) {
  const std::string body = encode(r);
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kPsRequest);
  h.length = body.size();
  EXPECT_TRUE(s.send_frame(h, body.data(), soon()).ok());
  auto rep =
      net::recv_reply(s, net::FrameType::kPsReply, net::FrameType::kStoreError, 4096, soon());
  return rep.ok() ? "answered" : std::string(rep.status().message());
}

TEST(PsInPlace, MemoryThatIsNotTheWorkersIsRefusedByNameAndTheServerServesOn) {
  auto server = serve(1.0);
  auto w = Worker::connect({addr(*server)}, kToken, 0, soon());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE((*w)->init("k", Tensor::from_vector(std::vector<float>{1, 2}, {2})).ok());
  auto raw = net::connect_authenticated("127.0.0.1", server->port(), soon(), kToken, "ps server");
  ASSERT_TRUE(raw.ok());
  Tensor g = shared_tensor(2);
  auto ref = net::find_shared(g.raw_data(), 8);
  ASSERT_TRUE(ref.has_value());
  Request y;
  y.op = Op::kShmPushPull;
  y.worker = 0;
  y.key = "k";
  y.seq = 1;
  y.mem = {static_cast<std::int32_t>(::getpid()), {2}, *ref, *ref};
  // A region id this process never announced at that descriptor.
  Request wrong = y;
  wrong.mem.grad.id += 1000;
  std::string why = refusal(*raw, wrong);
  EXPECT_NE(why.find(fmt::format("mapping region {} of process {}", wrong.mem.grad.id, ::getpid())),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("not the announced region"), std::string::npos) << why;
  // A process that does not exist (or lives on another host).
  Request gone = y;
  gone.mem.pid = 0x3fffffff;
  why = refusal(*raw, gone);
  EXPECT_NE(why.find("of process 1073741823"), std::string::npos) << why;
  // Its mapcheck fails the same way: such a worker goes over TCP.
  Request probe;
  probe.op = Op::kMapCheck;
  probe.worker = 0;
  probe.mem = gone.mem;
  why = refusal(*raw, probe);
  EXPECT_NE(why.find("of process 1073741823"), std::string::npos) << why;
  // It serves on: the real worker's push-pull is applied.
  Tensor into = shared_tensor(2);
  g.data<float>()[0] = 1;
  g.data<float>()[1] = 1;
  auto p = (*w)->push_pull("k", 0, g, 0, soon(), &into);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(std::vector<float>(into.data<float>(), into.data<float>() + 2),
            (std::vector<float>{0, 1}));
  EXPECT_EQ(server->traffic().shm_in, 8u);
}

}  // namespace
}  // namespace shoal::ps
