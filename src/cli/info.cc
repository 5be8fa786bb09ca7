// `shoal info`: what this build is and what this machine offers.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"

namespace shoal::cli {

std::string cpu_features() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model;
  std::set<std::string> flags;
  while (std::getline(f, line)) {
    if (model.empty() && line.rfind("model name", 0) == 0) model = line.substr(line.find(':') + 2);
    if (flags.empty() && line.rfind("flags", 0) == 0) {
      std::istringstream ss(line.substr(line.find(':') + 1));
      std::string w;
      while (ss >> w) flags.insert(w);
    }
  }
  std::string isa;
  for (const char* k : {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                        "avx512_vnni", "avx512_bf16", "amx_tile"})
    if (flags.count(k)) isa += std::string(isa.empty() ? "" : " ") + k;
  return fmt::format("{} [{}]", model.empty() ? "unknown CPU" : model, isa);
}

int run_info() {
  fmt::print("shoal {}\n", SHOAL_VERSION);
  fmt::print("  git commit  {}\n", SHOAL_GIT_COMMIT);
  fmt::print("  build type  {}\n", SHOAL_BUILD_TYPE);
  fmt::print("  compiler    {}\n", "g++ " __VERSION__);
  fmt::print("  cpu         {}\n", cpu_features());
  for (const auto& [k, v] : runtime::runtime_info()) fmt::print("  {:<11} {}\n", k, v);
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const std::string how = wait   ? std::string(wait)
                          : spin ? fmt::format("spin {}", spin)
                                 : std::string("(unset)");
  fmt::print("  omp wait    {} (OMP_WAIT_POLICY, GOMP_SPINCOUNT; spin 10000 unless set)\n", how);
  return 0;
}

}  // namespace shoal::cli
