// bench_ps: parameter-server push+pull bandwidth over loopback TCP and,
// for a server on the worker's host, through shared memory. S
// servers (ps::Server, the real transport) and W worker threads (ps::Worker)
// in one process; each round every worker push-pulls one key of `mib` MiB
// in sync mode (the round closes when all W have pushed). As in MXNet, a
// key of at least MXNET_KVSTORE_BIGARRAY_BOUND (10^6) elements is sliced
// over every server, whose slices travel and update at the same time;
// smaller keys live on one server. Prints, per configuration, the median
// over `--repeat` runs of the time per round and the bytes each worker
// moves per second (2 x mib per round: the push and the pull), next to the
// memcpy bandwidth measured in the same run. With `shm` the worker's
// gradient and destination live in a shared region (as a training arena
// does) and the server reads and writes them in place (ps::Worker::
// set_in_place); with `tcp` they cross loopback sockets.
//
// usage: bench_ps [--mib 1,4,16,64] [--servers 1,2] [--workers 1,2,4] [--seconds 2]
//                 [--repeat 3] [--transport tcp,shm]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/ps/server.h"
#include "shoal/ps/worker.h"

using namespace shoal;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<int> ints(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

double memcpy_gbs(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes);
  const auto t0 = Clock::now();
  int n = 0;
  while (std::chrono::duration<double>(Clock::now() - t0).count() < 0.5) {
    std::memcpy(b.data(), a.data(), bytes);
    ++n;
  }
  return static_cast<double>(bytes) * n / std::chrono::duration<double>(Clock::now() - t0).count() /
         1e9;
}

// Seconds per round for S servers, W workers, `mib` MiB per worker.
// A tensor of n f32 in a shared region (shm) or private memory (tcp).
Tensor buffer(std::int64_t n, bool shm, float value) {
  Tensor t = Tensor::full({n}, DType::kF32, value);
  if (!shm) return t;
  auto st = comm::Communicator::shared_arena(static_cast<std::size_t>(4 * n));
  if (!st.ok()) std::exit(1);
  Tensor s = Tensor::from_storage(*st, {n}, DType::kF32);
  (void)s.copy_from(t);
  return s;
}

double run(int servers, int workers, double mib, double seconds, bool shm) {
  std::vector<std::unique_ptr<ps::Server>> ss;
  std::vector<std::string> addrs;
  for (int i = 0; i < servers; ++i) {
    ps::ServerOptions o;
    o.shard.mode = ps::Mode::kSync;
    o.heartbeat_s = 0;
    o.limits.max_request_bytes = std::uint64_t{1} << 28;  // 64 MiB keys and their headers
    auto s = ps::Server::start("127.0.0.1", 0, "bench", o);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.status().to_string().c_str());
      std::exit(1);
    }
    addrs.push_back("127.0.0.1:" + std::to_string((*s)->port()));
    ss.push_back(std::move(s).value());
  }
  const std::vector<std::string> keys = {"w"};
  const auto n = static_cast<std::int64_t>(mib * (1 << 20) / 4);
  ps::ShardOptions job;  // the job's options: sync, MXNet's slice bound
  job.mode = ps::Mode::kSync;
  std::vector<double> per_round(static_cast<std::size_t>(workers));
  std::vector<std::thread> ts;
  std::latch joined(workers);  // a sync round counts the workers live when it opens
  for (int w = 0; w < workers; ++w)
    ts.emplace_back([&, w] {
      auto wk = ps::Worker::connect(addrs, "bench", w, Deadline::after_seconds(30), &job);
      if (!wk.ok()) std::exit(1);
      (*wk)->set_in_place(shm);
      if (shm && !(*wk)->in_place(0)) {
        std::fprintf(stderr, "the servers cannot map this process's memory\n");
        std::exit(1);
      }
      Tensor g = buffer(n, shm, 0.001f);
      Tensor into = buffer(n, shm, 0);  // received in place, as in training
      for (const auto& k : keys) (void)(*wk)->init(k, Tensor::zeros({n}, DType::kF32));
      joined.arrive_and_wait();
      // Rounds: a fixed count, chosen from the first round's time, so that
      // every worker runs the same number (a sync round needs all).
      auto round = [&](std::int64_t step) {
        for (const auto& k : keys)
          if (auto p = (*wk)->push_pull(k, step, g, 0, Deadline::after_seconds(60), &into);
              !p.ok()) {
            std::fprintf(stderr, "worker %d: %s\n", w, p.status().to_string().c_str());
            std::exit(1);
          }
      };
      round(0);
      const auto t0 = Clock::now();
      const int rounds = std::max(3, static_cast<int>(seconds / 0.05 * (mib > 8 ? 0.2 : 1)));
      for (int r = 1; r <= rounds; ++r) round(r);
      per_round[static_cast<std::size_t>(w)] =
          std::chrono::duration<double>(Clock::now() - t0).count() / rounds;
    });
  for (auto& t : ts) t.join();
  double worst = 0;
  for (double s : per_round) worst = std::max(worst, s);
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> mibs = {1, 4, 16, 64}, servers = {1, 2}, workers = {1, 2, 4};
  double seconds = 2;
  int repeat = 3;
  std::vector<std::string> transports = {"tcp", "shm"};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mib") mibs = ints(argv[i + 1]);
    if (a == "--servers") servers = ints(argv[i + 1]);
    if (a == "--workers") workers = ints(argv[i + 1]);
    if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    if (a == "--repeat") repeat = std::max(1, std::atoi(argv[i + 1]));
    if (a == "--transport") {
      transports.clear();
      for (std::string t = argv[i + 1]; !t.empty();) {
        const auto c = t.find(',');
        transports.push_back(t.substr(0, c));
        t = c == std::string::npos ? "" : t.substr(c + 1);
      }
    }
  }
  std::printf("memcpy %.2f GB/s (64 MiB, one thread)\n", memcpy_gbs(64 << 20));
  std::printf("%6s %7s %7s %9s %10s %16s %16s\n", "MiB", "servers", "workers", "transport",
              "ms/round", "GB/s per worker", "GB/s all workers");
  for (int mib : mibs)
    for (int s : servers)
      for (int w : workers)
        for (const std::string& tr : transports) {
          std::vector<double> ts;
          for (int k = 0; k < repeat; ++k) ts.push_back(run(s, w, mib, seconds, tr == "shm"));
          std::sort(ts.begin(), ts.end());
          const double t = ts[ts.size() / 2];
          const double per = 2.0 * mib * (1 << 20) / t / 1e9;
          std::printf("%6d %7d %7d %9s %10.2f %16.2f %16.2f\n", mib, s, w, tr.c_str(), t * 1e3, per,
                      per * w);
          std::fflush(stdout);
        }
  return 0;
}
