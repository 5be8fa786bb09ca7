// What the CPU is and offers bf16 products, read from /proc/cpuinfo and
// CPUID (runtime/backend.h's bf16_support; `shoal info` lists it).
#include <cpuid.h>

#include <fstream>
#include <string>

#include "runtime/cpu/kernels_internal.h"
#include "shoal/core/env.h"
#include "shoal/runtime/backend.h"

namespace shoal::runtime {
namespace cpu {

// CPUID leaf 7: subleaf 1 EAX bit 5 is AVX512_BF16, subleaf 0 EDX bit 22 AMX-BF16.
std::string bf16_isas() {
  std::string s;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5))) s += "avx512_bf16";
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)))
    s += s.empty() ? "amx_bf16" : " amx_bf16";
#endif
  return s;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.starts_with("model name") && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "this CPU";
}

}  // namespace cpu

Status bf16_support() {
  auto allowed = env::get_bool("SHOAL_CPU_BF16", true);
  if (!allowed.ok()) return allowed.status();
  if (*allowed && !cpu::bf16_isas().empty()) return ok_status();
  return failed_precondition(
      "bf16 needs AVX-512 BF16 (avx512_bf16) or AMX-BF16 (amx_bf16), and {} has neither{}: "
      "use --precision f32",
      cpu::cpu_model(), *allowed ? "" : " (SHOAL_CPU_BF16=0)");
}

}  // namespace shoal::runtime
