// Kernels: the code that runs one node on one backend. A factory makes one
// Kernel per node at compile time (where it may build and cache oneDNN
// primitives and scratch), so a steady-state run allocates nothing. Async
// kernels (collectives) start in run() and finish in wait(); the executor
// waits before the first consumer of their outputs. The registry is filled
// at static init or before compile; lookups are thread-safe afterwards.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shoal/core/deadline.h"
#include "shoal/core/status.h"
#include "shoal/graph/graph.h"
#include "shoal/tensor/tensor.h"

namespace shoal::runtime {

struct KernelContext {
  const graph::Node& node;
  std::uint64_t step = 0;  // run counter: keys dropout masks
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual Status run(const KernelContext& ctx, std::span<const Tensor> in,
                     std::span<Tensor> out) = 0;
  virtual bool is_async() const { return false; }
  virtual Status wait(Deadline) { return ok_status(); }
  // For an async kernel whose work ran elsewhere (a communication thread):
  // when that work started and finished in the last run, for the trace's
  // communication lane. False when it has nothing to report.
  virtual bool work_interval(std::chrono::steady_clock::time_point* start,
                             std::chrono::steady_clock::time_point* end) const {
    (void)start;
    (void)end;
    return false;
  }
  // True when the kernel still computes correctly if an output shares
  // memory with its input of the same element index (output i[k] written
  // only after input i[k] was read, element by element): optimizer updates.
  // Lets Executable::bind_output write a new parameter over the old one.
  virtual bool in_place_safe() const { return false; }
  // Asks the memory planner to place this node's inputs back to back and
  // each output i over input i, so the kernel can work on one span in
  // place (a gradient bucket's all-reduce). The planner does it only when
  // it is safe (no other reader after this node, not a graph output, all
  // arena values), so the kernel must check the pointers and work either way.
  virtual bool wants_packed_inputs() const { return false; }
  // "onednn", "blas", "ref"... shown in traces and `shoal info`.
  virtual const char* impl() const { return "ref"; }
};

using KernelFactory = std::function<Result<std::unique_ptr<Kernel>>(
    const graph::Node& node, const std::vector<graph::TensorType>& inputs)>;

class KernelRegistry {
 public:
  static KernelRegistry& cpu();
  void add(const std::string& op, KernelFactory f);
  const KernelFactory* find(const std::string& op) const;
  bool has(const std::string& op) const { return find(op) != nullptr; }

 private:
  std::map<std::string, KernelFactory> f_;
};

// The boundary every kernel is called through: libraries under the kernels
// (oneDNN's C++ API, the standard library's allocators) may throw, and no
// exception crosses a Shoal API, so these turn one into a Status naming the
// node, the kernel's implementation and what was thrown.
Result<std::unique_ptr<Kernel>> make_kernel(const KernelFactory& f, const graph::Node& node,
                                            const std::vector<graph::TensorType>& inputs);
Status run_kernel(Kernel& k, const KernelContext& ctx, std::span<const Tensor> in,
                  std::span<Tensor> out);

// Sets the thread count of the CPU kernels (OpenMP and oneDNN); 0 = all cores.
void set_num_threads(int n);
int num_threads();
// Cores this process may use (its CPU affinity mask, as OpenMP counts it).
int num_cores();

}  // namespace shoal::runtime
