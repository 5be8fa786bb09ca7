// `shoal bench comm`: an nccl-tests-style table of an all-reduce (or, with
// --op, a reduce-scatter or all-gather): bytes, count, time, algbw, busbw,
// algorithm, from 4 B up to --max-bytes. Under a
// launcher (SHOAL_RANK, OMPI_COMM_WORLD_RANK, ...) every process is one
// rank; otherwise it forks -n local ranks that meet in a file store.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "shoal/comm/communicator.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/dp/sharded.h"
#include "shoal/net/shared_memory.h"
#include "shoal/net/store.h"

namespace shoal::cli {
namespace {

// One call of the collective over `count` elements of buf (set_count): all
// of them all-reduced in place; reduce-scattered into `part`; or each
// rank's share gathered from `part` into all of buf. Shares as ZeRO splits
// a flat gradient (dp::shard_sizes), worked out once per size, not timed.
struct Collective {
  comm::Communicator& c;
  std::string op;
  std::span<float> buf;
  std::vector<float> part;
  std::size_t count = 0;
  std::vector<std::size_t> shares;

  void set_count(std::size_t n) {
    count = n;
    const auto s = dp::shard_sizes(static_cast<std::int64_t>(n), c.size());
    shares.assign(s.begin(), s.end());
  }
  Status run() {
    if (op == "allreduce")
      return c.allreduce(buf.data(), buf.data(), count, DType::kF32, comm::ReduceOp::kSum);
    if (op == "reduce_scatter")
      return c.reduce_scatter(buf.data(), part.data(), shares, DType::kF32, comm::ReduceOp::kSum);
    return c.allgatherv(part.data(), buf.data(), shares, DType::kF32);
  }
  // nccl-tests' bus bandwidth: what each link carries, over algbw.
  double bus_factor() const {
    const double n = c.size();
    return op == "allreduce" ? 2.0 * (n - 1) / n : (n - 1) / n;
  }
};

int bench_rank(comm::Communicator& c, const BenchCommOptions& o) {
  const int n = c.size();
  const std::size_t elems = std::max<std::size_t>(o.max_bytes / 4, 1);
  std::vector<float> priv;
  std::shared_ptr<net::SharedRegion> region;
  float* data = nullptr;
  if (o.shared) {
    auto r = comm::Communicator::allocate_shared(elems * 4);
    if (!r.ok()) {
      SHOAL_LOG_ERROR("bench comm --shared: {}", r.status().to_string());
      return 1;
    }
    region = std::move(*r);
    data = static_cast<float*>(region->data());
  } else {
    priv.resize(elems);
    data = priv.data();
  }
  Collective coll{c, o.op, std::span<float>(data, elems), std::vector<float>(elems / n + 1, 1.0f),
                  0, {}};
  for (std::size_t i = 0; i < coll.buf.size(); ++i) coll.buf[i] = static_cast<float>(i % 7);
  if (c.rank() == 0) {
    fmt::print(
        "# shoal {} f32{}, {} ranks, {}{} buffers; tuner alpha {:.2f} us, beta "
        "{:.3f} ns/byte{}\n",
        o.op, o.op == "allgather" ? "" : " sum", n, o.op == "allreduce" ? "in place, " : "",
        o.shared ? "shared-memory" : "private", c.alpha() * 1e6, c.beta() * 1e9,
        c.host_alpha() > 0 ? fmt::format("; inside a host alpha {:.2f} us, beta {:.3f} ns/byte",
                                         c.host_alpha() * 1e6, c.host_beta() * 1e9)
                           : "");
    fmt::print("{:>12} {:>10} {:>10} {:>9} {:>9}  {}\n", "bytes", "count", "time(us)", "algbw",
               "busbw", "algorithm");
    fmt::print("{:>12} {:>10} {:>10} {:>9} {:>9}\n", "", "", "", "(GB/s)", "(GB/s)");
  }
  for (std::size_t bytes = 4; bytes <= o.max_bytes; bytes *= 4) {
    std::size_t count = bytes / 4;
    coll.set_count(count);
    for (int w = 0; w < 3; ++w) {
      Status st = coll.run();
      if (!st.ok()) {
        SHOAL_LOG_ERROR("bench comm: {}", st.to_string());
        return 1;
      }
    }
    // Iterations: enough for the timed seconds, agreed on by all ranks (max).
    auto t0 = std::chrono::steady_clock::now();
    (void)coll.run();
    double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::int64_t iters = std::clamp<std::int64_t>(
        static_cast<std::int64_t>(o.seconds / std::max(one, 1e-7)), 5, 2000);
    if (!c.allreduce(&iters, &iters, 1, DType::kI64, comm::ReduceOp::kMax).ok()) return 1;
    if (!c.barrier().ok()) return 1;
    t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) {
      Status st = coll.run();
      if (!st.ok()) {
        SHOAL_LOG_ERROR("bench comm: {}", st.to_string());
        return 1;
      }
    }
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        static_cast<double>(iters);
    // Before the max-reduction below replaces them (all-reduces only).
    std::string algo = o.op == "allreduce" ? c.last_algorithm() : "";
    if (algo == "direct") algo += c.last_direct_mapped() ? " (mapped)" : " (cma)";
    double tmax = us;
    if (!c.allreduce(&tmax, &tmax, 1, DType::kF64, comm::ReduceOp::kMax).ok()) return 1;
    if (c.rank() == 0) {
      double algbw = static_cast<double>(bytes) / (tmax * 1e3);
      fmt::print("{:>12} {:>10} {:>10.1f} {:>9.3f} {:>9.3f}  {}\n", bytes, count, tmax, algbw,
                 algbw * coll.bus_factor(), algo);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int run_bench_comm(const BenchCommOptions& o) {
  bool launched = env::get("SHOAL_RANK") || env::get("OMPI_COMM_WORLD_RANK") ||
                  env::get("PMI_RANK") || env::get("SLURM_PROCID") || env::get("RANK");
  if (launched) {
    auto c = comm::Communicator::from_env();
    if (!c.ok()) {
      SHOAL_LOG_ERROR("bench comm: {}", c.status().to_string());
      return 1;
    }
    return bench_rank(**c, o);
  }
  namespace fs = std::filesystem;
  auto dir = fs::temp_directory_path() / fmt::format("shoal_bench_comm_{}", getpid());
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      SHOAL_LOG_ERROR("bench comm: fork failed");
      return 1;
    }
    if (pid == 0) {
      log::set_identity(r, o.ranks, "bench");
      net::FileStore store(dir.string());
      auto co = comm::CommOptions::from_env();
      if (!co.ok()) _exit(2);
      auto c = comm::Communicator::create(r, o.ranks, store, *co);
      if (!c.ok()) {
        SHOAL_LOG_ERROR("bench comm: {}", c.status().to_string());
        _exit(1);
      }
      int rc = bench_rank(**c, o);
      c->reset();
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int worst = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    worst = std::max(worst, code);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return worst;
}

}  // namespace shoal::cli
