// `shoal bench peak`: what this host computes and moves at most, for the
// thread count given: the f32 and bf16 GEMM peak (oneDNN, square matmuls)
// and the memory bandwidth (a triad). The peaks are what `shoal train`
// measures model FLOPs utilization against; this command re-measures them
// and rewrites the cache the trainer reads (runtime/peak.h).
#include <string>

#include "cli/commands.h"
#include "shoal/core/logging.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"
#include "shoal/runtime/peak.h"

namespace shoal::cli {

int run_bench_peak(int threads, int n, double seconds) {
  if (threads > 0) runtime::set_num_threads(threads);
  fmt::print("# shoal bench peak: {} threads, {}x{}x{} matmuls, best of {:.1f} s each\n",
             runtime::num_threads(), n, n, n, seconds);
  bool stored = true;
  for (DType t : {DType::kF32, DType::kBF16}) {
    auto f = runtime::measure_gemm_peak(t, n, seconds);
    if (!f.ok()) {
      fmt::print("{:<6} GEMM  -  ({})\n", dtype_name(t), f.status().message());
      continue;
    }
    fmt::print("{:<6} GEMM  {:8.1f} GFLOP/s\n", dtype_name(t), *f / 1e9);
    if (Status st = runtime::store_gemm_peak(t, *f); !st.ok()) {
      SHOAL_LOG_WARN("bench peak: not cached: {}", st.to_string());
      stored = false;
    }
  }
  auto bw = runtime::measure_bandwidth(64, seconds);
  if (!bw.ok()) {
    SHOAL_LOG_ERROR("bench peak: {}", bw.status().to_string());
    return 1;
  }
  fmt::print("memory triad {:8.1f} GB/s\n", *bw / 1e9);
  if (stored) fmt::print("# kept in {} for shoal train's MFU\n", runtime::peak_cache_path());
  return 0;
}

}  // namespace shoal::cli
