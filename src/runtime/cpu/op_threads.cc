// Which nodes run on one thread. Every oneDNN primitive opens an OpenMP
// parallel region whatever its size, and under a passive wait (the user's
// OMP_WAIT_POLICY=passive; the default is a short spin, docs/runtime.md)
// waking the sleeping thread costs 50-90 us on this VM, more than a small
// matmul takes. A GRU of 28 steps (224 matmuls of 1-6 MFLOP per training
// step) ran 3.7x slower on two threads than on one. Nodes below the limits
// here are then built and run with one thread; above them the second
// thread's help outweighs its wake-up.
#include <omp.h>

#include <cctype>
#include <cstdlib>
#include <string>

#include "runtime/cpu/kernels_internal.h"
#include "shoal/graph/passes.h"

namespace shoal::runtime::cpu {

namespace {

constexpr double kSerialFlops = 16e6;              // ~0.15 ms of one core's matmul
constexpr std::int64_t kSerialElements = 1 << 16;  // ~0.1 ms of an element-wise pass

// Only under the passive wait: threads that spin (OMP_WAIT_POLICY=active,
// GOMP_SPINCOUNT set) answer in well under a microsecond, and keeping small
// nodes on one thread then costs (a LeNet on two threads: 20.5k img/s with
// every node parallel, 17.1k with small ones serial, spinning 10k).
bool passive_wait() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (std::getenv("GOMP_SPINCOUNT") != nullptr || policy == nullptr) return false;
  std::string p(policy);
  for (char& ch : p) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return p == "passive";
}

}  // namespace

bool runs_serial(const graph::Graph& g, const graph::Node& n) {
  static const bool enabled = [] {
    const char* v = std::getenv("SHOAL_SERIAL_SMALL_OPS");
    return passive_wait() && (!v || std::string(v) != "0");
  }();
  return enabled && omp_get_max_threads() > 1 && small_node(g, n);
}

bool small_node(const graph::Graph& g, const graph::Node& n) {
  const double flops = graph::node_flops(g, n);
  if (flops > 0) return flops < kSerialFlops;
  std::int64_t elements = 0;
  for (const auto& o : n.outputs) elements = std::max(elements, num_elements(o.shape));
  for (const auto& v : n.inputs) elements = std::max(elements, num_elements(g.type(v).shape));
  return elements < kSerialElements;
}

SerialScope::SerialScope(bool serial) : restore_(serial ? omp_get_max_threads() : 0) {
  if (serial) omp_set_num_threads(1);
}
SerialScope::~SerialScope() {
  if (restore_ > 0) omp_set_num_threads(restore_);
}

}  // namespace shoal::runtime::cpu
