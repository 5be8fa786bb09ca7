// Measured peaks of this host (runtime/peak.h): oneDNN GEMMs and a triad.
#include "shoal/runtime/peak.h"

#include <chrono>
#include <cstdlib>
#include <dnnl.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/cpu/kernels_internal.h"
#include "runtime/cpu/onednn_internal.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"

namespace shoal::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using namespace cpu::dnnl_detail;  // NOLINT: engine, stream, dt, tag

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string cpu_key(DType t) {
  return fmt::format("{} / {} threads / {}", cpu::cpu_model(), num_threads(), dtype_name(t));
}

// The best rate of `work` (which returns how much it did) over repeats:
// at least 3, then until `seconds` have passed (at most 1000).
template <typename F>
double best_rate(double seconds, F work) {
  double best = 0;
  const auto t0 = Clock::now();
  for (int rep = 0; rep < 1000 && (rep < 3 || seconds_since(t0) < seconds); ++rep) {
    const auto r0 = Clock::now();
    const double done = work();
    best = std::max(best, done / seconds_since(r0));
  }
  return best;
}

}  // namespace

Result<double> measure_gemm_peak(DType t, int n, double seconds) {
  if (t != DType::kF32 && t != DType::kBF16)
    return invalid_argument("a GEMM peak is measured for f32 or bf16, not {}", dtype_name(t));
  if (t == DType::kBF16) SHOAL_RETURN_IF_ERROR(bf16_support());
  try {
    const dt src = dnnl_type(t);
    memory::desc a({n, n}, src, tag::ab), b({n, n}, src, tag::ab), c({n, n}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine());
    dnnl::matmul mm(pd);
    memory ma(a, engine()), mb(b, engine()), mc(c, engine());
    std::memset(ma.get_data_handle(), 0, a.get_size());
    std::memset(mb.get_data_handle(), 0, b.get_size());
    ExecArgs args = {{DNNL_ARG_SRC, &ma}, {DNNL_ARG_WEIGHTS, &mb}, {DNNL_ARG_DST, &mc}};
    args.execute(mm);  // warm-up: the kernel's code and the operands' pages
    stream().wait();
    const double flops = 2.0 * n * n * static_cast<double>(n);
    return best_rate(seconds, [&] {
      for (int i = 0; i < 4; ++i) args.execute(mm);
      stream().wait();
      return 4 * flops;
    });
  } catch (const dnnl::error& e) {
    return internal_error("oneDNN cannot run a {} matmul of {}: {}", dtype_name(t), n, e.what());
  }
}

Result<double> measure_bandwidth(int mib, double seconds) {
  const std::size_t n = static_cast<std::size_t>(mib) * 1024 * 1024 / sizeof(float);
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  const auto count = static_cast<std::int64_t>(n);
  float* pa = a.data();
  const float* pb = b.data();
  const float* pc = c.data();
  const double best = best_rate(seconds, [&] {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < count; ++i) pa[i] = pb[i] + 0.5f * pc[i];
    return 3.0 * static_cast<double>(n * sizeof(float));
  });
  if (a[n / 2] != 2.0f) return internal_error("the triad computed {} instead of 2", a[n / 2]);
  return best;
}

std::string peak_cache_path() {
  namespace fs = std::filesystem;
  if (const char* p = std::getenv("SHOAL_PEAK_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (fs::path(x) / "shoal" / "peak.json").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".cache" / "shoal" / "peak.json").string();
  return "";
}

namespace {
nlohmann::json read_cache(const std::string& path) {
  if (path.empty()) return nlohmann::json::object();
  auto text = read_file(path);
  if (!text.ok()) return nlohmann::json::object();
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    SHOAL_LOG_WARN("{}: not a JSON object; measuring the peak again and rewriting it", path);
    return nlohmann::json::object();
  }
  return j;
}
}  // namespace

Status store_gemm_peak(DType t, double flops) {
  const std::string path = peak_cache_path();
  if (path.empty()) return failed_precondition("no cache directory: set SHOAL_PEAK_CACHE or HOME");
  nlohmann::json j = read_cache(path);
  j[cpu_key(t)] = flops;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  return write_file_atomic(path, j.dump(2) + "\n");
}

Result<double> host_gemm_peak(DType t) {
  const std::string path = peak_cache_path();
  const nlohmann::json j = read_cache(path);
  const std::string key = cpu_key(t);
  if (auto it = j.find(key); it != j.end() && it->is_number() && it->get<double>() > 0)
    return it->get<double>();
  SHOAL_ASSIGN_OR_RETURN(double flops, measure_gemm_peak(t));
  SHOAL_LOG_INFO("measured this host's {} GEMM peak on {} threads once for MFU: {:.1f} GFLOP/s{}",
                 dtype_name(t), num_threads(), flops / 1e9,
                 path.empty() ? "" : fmt::format(" (kept in {})", path));
  if (Status st = store_gemm_peak(t, flops); !st.ok())
    SHOAL_LOG_DEBUG("peak not cached: {}", st.to_string());
  return flops;
}

}  // namespace shoal::runtime
