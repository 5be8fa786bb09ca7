// What this host can do, measured: the GEMM peak (oneDNN, large square
// matmuls, f32 and bf16) and the memory bandwidth (a STREAM triad), for the
// thread count in force. Model FLOPs utilization (MFU) is the step's
// counted FLOPs per second over this peak, as Megatron reports it against
// the hardware's. Measurements take a fraction of a second each; the
// trainer reads them from a cache `shoal bench peak` (or its own first
// measurement) writes, so runs do not pay for it every time.
#pragma once

#include <string>

#include "shoal/core/status.h"
#include "shoal/tensor/dtype.h"

namespace shoal::runtime {

// FLOP/s of an n x n x n matmul of type t (f32 or bf16, f32 output) on the
// current thread count: the best of repeats within about `seconds`.
Result<double> measure_gemm_peak(DType t, int n = 1024, double seconds = 0.3);
// Bytes/s of a[i] = b[i] + s * c[i] over arrays far larger than the caches
// (three arrays of `mib` MiB each), counting 3 arrays moved per pass.
Result<double> measure_bandwidth(int mib = 64, double seconds = 0.3);

// The GEMM peak of type t for the current thread count from the cache
// (SHOAL_PEAK_CACHE, else $XDG_CACHE_HOME/shoal/peak.json, else
// ~/.cache/shoal/peak.json; keyed by CPU model, threads and type), measured
// and stored there when missing. A cache that cannot be written only costs
// the measurement next time.
Result<double> host_gemm_peak(DType t);
// Stores a measured peak in that cache (shoal bench peak).
Status store_gemm_peak(DType t, double flops);
std::string peak_cache_path();

}  // namespace shoal::runtime
