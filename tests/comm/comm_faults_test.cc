// The communicator's faults: mismatched calls named with both sides, a cut
// that ends the call in flight, wrong tokens, malformed frames, strays at
// the mesh port, a SIGKILLed rank named by every survivor (processes), and
// the launchers' variables.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/world.h"
#include "shoal/comm/communicator.h"
#include "shoal/comm/handshake.h"
#include "shoal/core/launch_env.h"
#include "shoal/net/socket.h"
#include "shoal/net/store.h"

namespace shoal::comm {
namespace {
namespace fs = std::filesystem;
using namespace shoal::comm::testing;

TEST(Faults, MismatchedCallsAreReportedWithBothSides) {
  auto st = run_world(2, [&](Communicator& c) -> Status {
    std::vector<float> v(16, 1.f);
    if (c.rank() == 0) return c.allreduce(v.data(), v.data(), 10, DType::kF32, ReduceOp::kSum);
    return c.broadcast(v.data(), 16, DType::kF32, 0);
  });
  for (const auto& s : st) {
    ASSERT_FALSE(s.ok());
  }
  std::string all = st[0].to_string() + " | " + st[1].to_string();
  EXPECT_NE(all.find("collective mismatch"), std::string::npos) << all;
  EXPECT_NE(all.find("allreduce(f32, count 10, sum)"), std::string::npos) << all;
  EXPECT_NE(all.find("broadcast(f32, count 16, root 0)"), std::string::npos) << all;
}

// Communicator::cut from another thread (an elastic job's watchdog) fails
// the call in flight at once, on every transport the ranks use, while the
// peer it waits for is alive and silent: not at the 60 s deadline.
TEST(Faults, ACutFailsTheCallInFlightAtOnce) {
  std::atomic<int> returned{0};
  const auto t0 = std::chrono::steady_clock::now();
  auto st = run_world(3, [&](Communicator& c) -> Status {
    if (c.rank() == 2) {  // alive, connected, and never joins the call
      for (int i = 0; i < 3000 && returned.load() < 2; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return ok_status();
    }
    std::thread cutter;
    if (c.rank() == 0)
      cutter = std::thread([&c] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        c.cut();
      });
    std::vector<float> v(1000, 1.f);
    Status s = c.allreduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum);
    if (cutter.joinable()) cutter.join();
    ++returned;
    return s;
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(st[0].ok());
  EXPECT_FALSE(st[1].ok());  // rank 0's connections closed under it
  EXPECT_TRUE(st[2].ok()) << st[2].to_string();
  EXPECT_LT(took, 10) << st[0].to_string();  // rank 2 would end it at 30 s
}

TEST(Faults, WrongTokenIsRejected) {
  CommOptions o;
  o.token = "the job's";
  o.timeout_seconds = 10;
  auto st = run_world(
      3, [](Communicator&) { return ok_status(); }, o,
      [](int r, CommOptions& mine) {
        if (r == 1) mine.token = "something else";
      });
  ASSERT_FALSE(st[1].ok());
  std::string all = st[0].to_string() + st[1].to_string() + st[2].to_string();
  EXPECT_NE(all.find("token"), std::string::npos) << all;
}

TEST(Frames, BadHeadersAreRefused) {
  std::uint8_t hb[net::kHeaderBytes];
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kData);
  h.length = 100;
  net::encode_header(h, hb);
  EXPECT_TRUE(net::decode_header(hb, 100, "p").ok());
  auto too_long = net::decode_header(hb, 99, "p");
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("exceeds the bound"), std::string::npos);
  hb[0] ^= 1;
  EXPECT_NE(net::decode_header(hb, 100, "p").status().message().find("bad magic"),
            std::string::npos);
  hb[0] ^= 1;
  hb[4] = 9;
  EXPECT_NE(net::decode_header(hb, 100, "p").status().message().find("protocol version 9"),
            std::string::npos);
  hb[4] = static_cast<std::uint8_t>(net::kProtocolVersion);
  hb[6] = 77;
  EXPECT_NE(net::decode_header(hb, 100, "p").status().message().find("unknown frame type"),
            std::string::npos);
  EXPECT_FALSE(net::decode_header(std::span<const std::uint8_t>(hb, 10), 100, "p").ok());
}

// A port scanner or health probe that reaches rank 0's mesh port while it
// waits for rank 1 (bytes that are no frame, a silent connection, a hello
// of another world size) is dropped and logged; rank 1 then connects and
// the job runs. Before: the first stray ended rank 0 with "bad magic".
TEST(Faults, StrayConnectionsAtStartUpAreDroppedNotFatal) {
  auto srv = net::TcpStoreServer::start("127.0.0.1", 0, "");
  ASSERT_TRUE(srv.ok());
  const int port = (*srv)->port();
  std::vector<Status> out(2);
  auto rank = [&](int r) {
    auto store = net::TcpStore::connect("127.0.0.1", port, Deadline::after_seconds(10), "");
    if (!store.ok()) {
      out[static_cast<std::size_t>(r)] = store.status();
      return;
    }
    CommOptions o;
    o.timeout_seconds = 30;
    o.prefix = "strays";
    auto c = Communicator::create(r, 2, **store, o);
    if (!c.ok()) {
      out[static_cast<std::size_t>(r)] = c.status();
      return;
    }
    std::vector<float> v(1000, static_cast<float>(r + 1));
    out[static_cast<std::size_t>(r)] =
        (*c)->allreduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum);
    if (out[static_cast<std::size_t>(r)].ok() && v[999] != 3.f)
      out[static_cast<std::size_t>(r)] = internal_error("rank {}: sum {}, expected 3", r, v[999]);
  };
  std::thread r0(rank, 0);
  auto store = net::TcpStore::connect("127.0.0.1", port, Deadline::after_seconds(10), "");
  ASSERT_TRUE(store.ok());
  auto addr = (*store)->get("strays/addr/0", Deadline::after_seconds(20));
  ASSERT_TRUE(addr.ok()) << addr.status().to_string();
  auto hp = net::split_host_port(*addr, "rank 0");
  ASSERT_TRUE(hp.ok());
  const Deadline dl = Deadline::after_seconds(10);
  auto garbage = net::Socket::connect(hp->first, hp->second, dl);
  ASSERT_TRUE(garbage.ok());
  const std::string http = "GET / HTTP/1.0\r\n\r\n GET / HTTP/1.0\r\n\r\n";
  ASSERT_TRUE(garbage->send_all(http.data(), http.size(), dl).ok());
  auto silent = net::Socket::connect(hp->first, hp->second, dl);  // says nothing, stays open
  ASSERT_TRUE(silent.ok());
  auto other_job = net::Socket::connect(hp->first, hp->second, dl);
  ASSERT_TRUE(other_job.ok());
  const std::string hello = encode_hello(3, 5, make_nonce());
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kHello);
  h.length = hello.size();
  ASSERT_TRUE(other_job->send_frame(h, hello.data(), dl).ok());
  const auto t0 = std::chrono::steady_clock::now();
  std::thread r1(rank, 1);
  r0.join();
  r1.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  expect_all_ok(out);
  // The silent one costs its hello window, not the 30 s deadline.
  EXPECT_LT(secs, 15.0);
}

// Processes: rank 2 of 4 SIGKILLs itself inside a stream of allreduces;
// every survivor fails within the deadline with an error naming rank 2.
TEST(Faults, KilledRankIsNamedByEverySurvivor) {
  const int world = 4;
  auto dir = fs::temp_directory_path() / ("shoal_fault_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      net::FileStore store((dir / "store").string());
      CommOptions o;
      o.timeout_seconds = 20;
      auto c = Communicator::create(r, world, store, o);
      if (!c.ok()) _exit(3);
      std::vector<float> v(100000, 1.f);
      for (int i = 0; i < 1000000; ++i) {
        if (r == 2 && i == 20) raise(SIGKILL);
        Status st = (*c)->allreduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kAvg);
        if (!st.ok()) {
          std::string msg = st.to_string();
          FILE* f = std::fopen((dir / ("err" + std::to_string(r))).c_str(), "w");
          std::fputs(msg.c_str(), f);
          std::fclose(f);
          _exit(msg.find("rank 2") != std::string::npos ? 0 : 4);
        }
      }
      _exit(5);
    }
    pids.push_back(pid);
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int> codes(world, -1);
  int left = world;
  while (left > 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    for (int r = 0; r < world; ++r) {
      if (codes[static_cast<std::size_t>(r)] != -1) continue;
      int status = 0;
      if (waitpid(pids[static_cast<std::size_t>(r)], &status, WNOHANG) > 0) {
        codes[static_cast<std::size_t>(r)] =
            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < world; ++r)
    if (codes[static_cast<std::size_t>(r)] == -1) {  // no orphans, even on failure
      kill(pids[static_cast<std::size_t>(r)], SIGKILL);
      waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
    }
  EXPECT_EQ(codes[2], 128 + SIGKILL);
  for (int r : {0, 1, 3}) {
    std::ifstream in(dir / ("err" + std::to_string(r)));
    std::string msg((std::istreambuf_iterator<char>(in)), {});
    std::printf("rank %d after %.2f s: %s\n", r, secs, msg.c_str());
    EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0) << "rank " << r << ": " << msg;
    EXPECT_NE(msg.find("allreduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("#"), std::string::npos) << msg;  // the sequence number
  }
  EXPECT_LT(secs, 20.0);  // well within the 20 s deadline: detected, not timed out
  fs::remove_all(dir);
}

TEST(Env, ReadsLauncherVariables) {
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  auto e = launch_env();
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->world, 4);
  EXPECT_EQ(e->source, "OpenMPI");
  EXPECT_EQ(e->store, "127.0.0.1:29500");
  // A batch shell (no job step) is one process, whatever SLURM_NTASKS says.
  setenv("SLURM_PROCID", "9", 1);
  setenv("SLURM_NTASKS", "4", 1);
  unsetenv("OMPI_COMM_WORLD_RANK");
  auto batch = launch_env();
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  EXPECT_EQ(batch->world, 1);
  EXPECT_NE(batch->source.find("Slurm batch shell"), std::string::npos) << batch->source;
  // In a job step the step's task count is the world.
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  auto bad = launch_env();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("SLURM_PROCID=9"), std::string::npos);
  for (const char* v :
       {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS"})
    unsetenv(v);
}

}  // namespace
}  // namespace shoal::comm
