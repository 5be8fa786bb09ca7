// `shoal bench comm`: an nccl-tests-style allreduce table (bytes, count,
// time, algbw, busbw, algorithm) from 4 B up to --max-bytes. Under a
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
#include "shoal/net/shared_memory.h"
#include "shoal/net/store.h"

namespace shoal::cli {
namespace {

int bench_rank(comm::Communicator& c, std::size_t max_bytes, double min_seconds, bool shared) {
  const int n = c.size();
  const std::size_t elems = std::max<std::size_t>(max_bytes / 4, 1);
  std::vector<float> priv;
  std::shared_ptr<net::SharedRegion> region;
  float* data = nullptr;
  if (shared) {
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
  std::span<float> buf(data, elems);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i % 7);
  if (c.rank() == 0) {
    fmt::print(
        "# shoal allreduce f32 sum, {} ranks, in place, {} buffers; tuner alpha {:.2f} us, beta "
        "{:.3f} ns/byte{}\n",
        n, shared ? "shared-memory" : "private", c.alpha() * 1e6, c.beta() * 1e9,
        c.host_alpha() > 0 ? fmt::format("; inside a host alpha {:.2f} us, beta {:.3f} ns/byte",
                                         c.host_alpha() * 1e6, c.host_beta() * 1e9)
                           : "");
    fmt::print("{:>12} {:>10} {:>10} {:>9} {:>9}  {}\n", "bytes", "count", "time(us)", "algbw",
               "busbw", "algorithm");
    fmt::print("{:>12} {:>10} {:>10} {:>9} {:>9}\n", "", "", "", "(GB/s)", "(GB/s)");
  }
  for (std::size_t bytes = 4; bytes <= max_bytes; bytes *= 4) {
    std::size_t count = bytes / 4;
    for (int w = 0; w < 3; ++w) {
      Status st = c.allreduce(buf.data(), buf.data(), count, DType::kF32, comm::ReduceOp::kSum);
      if (!st.ok()) {
        SHOAL_LOG_ERROR("bench comm: {}", st.to_string());
        return 1;
      }
    }
    // Iterations: enough for min_seconds, agreed on by all ranks (max).
    auto t0 = std::chrono::steady_clock::now();
    (void)c.allreduce(buf.data(), buf.data(), count, DType::kF32, comm::ReduceOp::kSum);
    double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::int64_t iters = std::clamp<std::int64_t>(
        static_cast<std::int64_t>(min_seconds / std::max(one, 1e-7)), 5, 2000);
    if (!c.allreduce(&iters, &iters, 1, DType::kI64, comm::ReduceOp::kMax).ok()) return 1;
    if (!c.barrier().ok()) return 1;
    t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) {
      Status st = c.allreduce(buf.data(), buf.data(), count, DType::kF32, comm::ReduceOp::kSum);
      if (!st.ok()) {
        SHOAL_LOG_ERROR("bench comm: {}", st.to_string());
        return 1;
      }
    }
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        static_cast<double>(iters);
    // Before the max-reduction below replaces them.
    std::string algo = c.last_algorithm();
    if (algo == "direct") algo += c.last_direct_mapped() ? " (mapped)" : " (cma)";
    double tmax = us;
    if (!c.allreduce(&tmax, &tmax, 1, DType::kF64, comm::ReduceOp::kMax).ok()) return 1;
    if (c.rank() == 0) {
      double algbw = static_cast<double>(bytes) / (tmax * 1e3);
      double busbw = algbw * 2.0 * (n - 1) / n;
      fmt::print("{:>12} {:>10} {:>10.1f} {:>9.3f} {:>9.3f}  {}\n", bytes, count, tmax, algbw,
                 busbw, algo);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int run_bench_comm(int ranks, std::size_t max_bytes, double min_seconds, bool shared) {
  bool launched = env::get("SHOAL_RANK") || env::get("OMPI_COMM_WORLD_RANK") ||
                  env::get("PMI_RANK") || env::get("SLURM_PROCID") || env::get("RANK");
  if (launched) {
    auto c = comm::Communicator::from_env();
    if (!c.ok()) {
      SHOAL_LOG_ERROR("bench comm: {}", c.status().to_string());
      return 1;
    }
    return bench_rank(**c, max_bytes, min_seconds, shared);
  }
  namespace fs = std::filesystem;
  auto dir = fs::temp_directory_path() / fmt::format("shoal_bench_comm_{}", getpid());
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      SHOAL_LOG_ERROR("bench comm: fork failed");
      return 1;
    }
    if (pid == 0) {
      log::set_identity(r, ranks, "bench");
      net::FileStore store(dir.string());
      auto o = comm::CommOptions::from_env();
      if (!o.ok()) _exit(2);
      auto c = comm::Communicator::create(r, ranks, store, *o);
      if (!c.ok()) {
        SHOAL_LOG_ERROR("bench comm: {}", c.status().to_string());
        _exit(1);
      }
      int rc = bench_rank(**c, max_bytes, min_seconds, shared);
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
