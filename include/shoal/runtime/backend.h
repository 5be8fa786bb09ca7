// Backend / Executable / Executor: a Backend compiles a verified Graph into
// an Executable (kernels chosen, memory planned into one arena); an Executor
// runs it with feeds and collects trace events. Graph code never sees a
// backend, so a GPU backend can come later. An Executable is not thread-safe:
// one run at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "shoal/core/deadline.h"
#include "shoal/core/status.h"
#include "shoal/graph/graph.h"
#include "shoal/tensor/tensor.h"

namespace shoal::runtime {

struct CompileOptions {
  bool fuse = true;  // fold activations into matmul/conv post-ops
  // Keep blocked layouts between ops (SHOAL_BLOCKED_LAYOUT=0 turns it off).
  bool blocked_layouts = true;
  bool constant_fold = true;
  double async_wait_seconds = 300.0;  // deadline for async kernels
  // Allocates the arena (zero-filled, 64-byte aligned; default
  // Storage::allocate). Data parallelism passes shared memory here, so the
  // all-reduce of gradient buckets placed in the arena reaches the other
  // ranks' buckets without system calls (comm::Communicator::allocate_shared).
  std::function<Result<std::shared_ptr<Storage>>(std::size_t bytes)> arena_allocator;
  // Graph outputs the caller will give storage with bind_output (the
  // trainer's new parameters and optimizer state, written over the old):
  // planned outside the arena, so they cost no arena bytes. One that is
  // still unbound at the first run gets an allocation of its own then.
  std::set<int> outputs_bound_later;
};

// One span of a trace. Times are microseconds of the monotonic clock
// (steady_clock), which every process on a host shares, so the traces of
// the ranks of a job line up when merged.
struct TraceEvent {
  const char* name;  // op name (static in the graph's lifetime), or "wait"
  int node;          // graph node, or -1 (then name says what it is)
  int lane;          // 0: the executing thread; 1: the communication thread
  double start_us, dur_us;
  const char* impl = nullptr;  // the kernel that ran it ("onednn:bf16"), if known
};
double trace_clock_us();  // now, on the trace clock
double trace_clock_us(std::chrono::steady_clock::time_point t);

class Executable {
 public:
  virtual ~Executable() = default;
  // Binds a graph input by name; the tensor is used (not copied) until rebound.
  virtual Status bind(const std::string& name, const Tensor& t) = 0;
  virtual Status run() = 0;
  // Makes the executable write graph output i into `t` (same dtype and
  // shape, contiguous) instead of the arena, e.g. a new parameter over the
  // bound old one. Refused, naming the reader, when `t` overlaps a bound
  // input that another node reads after the writer, or that the writer
  // itself reads and its kernel is not in_place_safe(); bind() re-checks.
  virtual Status bind_output(int i, const Tensor& t) = 0;
  // Graph output i: a view into the arena (or the tensor given to
  // bind_output), valid until the next run.
  virtual const Tensor& output(int i) const = 0;
  virtual int num_outputs() const = 0;
  virtual std::size_t arena_bytes() const = 0;    // peak planned bytes
  virtual std::size_t naive_bytes() const = 0;    // without reuse
  virtual const graph::Graph& graph() const = 0;  // after backend passes
  virtual void enable_trace(bool on) = 0;
  // The events of the last run only (each run starts a fresh list).
  virtual const std::vector<TraceEvent>& trace() const = 0;
  virtual std::uint64_t steps() const = 0;
  virtual void set_step(std::uint64_t step) = 0;  // e.g. on resume
  // Which implementation runs each op ("onednn", "ref"), keyed by op name.
  virtual std::map<std::string, std::string> kernel_impls() const = 0;
  // Holds the writers of outputs `outs` back until every collective started
  // before them has finished, so that a run failing in a collective (a peer
  // lost) leaves the tensors bound to those outputs as they were: an
  // elastic job's survivors go on from them, with no copy kept. Refused,
  // naming both, where a collective starts after the first such writer.
  // held_written(): whether the last run() got as far as those writers.
  virtual Status hold_writes(const std::vector<int>& outs) = 0;
  virtual bool held_written() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Result<std::unique_ptr<Executable>> compile(graph::Graph g, const CompileOptions& o) = 0;
};

Result<std::unique_ptr<Backend>> make_backend(const std::string& name);  // "cpu"

// Runs an executable with named feeds and returns copies of its outputs.
// Chrome trace JSON of `events` (of `g`'s nodes) as process `pid`, written
// atomically. Lane 0 is thread "compute", lane 1 "comm".
Status write_chrome_trace(const std::string& path, const graph::Graph& g,
                          const std::vector<TraceEvent>& events, int pid);

class Executor {
 public:
  explicit Executor(Executable& exe) : exe_(exe) {}
  Result<std::vector<Tensor>> run(const std::map<std::string, Tensor>& feeds);
  // Chrome trace JSON (chrome://tracing, Perfetto) of the last run.
  Status write_trace(const std::string& path, int pid = 0) const;

 private:
  Executable& exe_;
};

// Folds nodes whose inputs are all constants into constants (runs them on
// the CPU kernels). Returns how many were folded.
Result<int> constant_fold(graph::Graph& g);
// Rewrites relu(linear|conv2d|batch_norm(...)) into the producer's
// "activation" attr when the pre-activation has no other use. Returns how
// many were fused. (ReLU's gradient stays its own pass: folded into batch
// norm's gradient, which then reads y in both of its passes, it cost as
// much as it saved: ResNet-20 -0.1 ms, resnet18 +0.1 ms a step.)
int fuse_activations(graph::Graph& g);
// Fuses a residual add into the layer norm that reads it, in the step as
// autodiff left it (f32, operands of one shape):
//   s = add(a, b); y = layer_norm(s, g, beta)  ->  (y, s) = add_layer_norm(a, b, g, beta)
//   (dx, dg, db) = layer_norm_grad(s, g, dy); add(dx, r)  ->  layer_norm_grad(s, g, dy, r)
// where the rewrite cannot close a cycle (gamma, beta and r do not depend
// on the node they join). Returns how many of both were fused.
int fuse_residual_norms(graph::Graph& g);
// Rewrites an add tree of slice_scatters of one shape and axis (f32 or
// f64, each read only by the tree) into one slice_scatter_sum: an imported
// 3-D convolution's gradient (and a 3-D transposed convolution) sums its
// depth taps' frames so. Returns how many adds were folded.
int fuse_slice_scatters(graph::Graph& g);
// Rewrites relu_grad(max_pool2d_grad(y, dy), y), the pooled ReLU's
// gradient (a CNN's conv, batch norm, ReLU, pool), into max_pool2d_grad with
// attr relu = 1: one pass over dx where two read and wrote it whole.
// Returns how many were fused.
int fuse_pool_relu_grads(graph::Graph& g);
// Lets oneDNN's channel-blocked layout (nChw16c) flow between convolutions,
// batch norms and element-wise ops, inserting `layout` conversions where a
// blocked value meets another op or is a graph output. Returns how many
// conversions were inserted. See src/runtime/cpu/layout.cc.
Result<int> assign_blocked_layouts(graph::Graph& g);

}  // namespace shoal::runtime

namespace shoal::runtime {
// Versions and settings of the CPU runtime (oneDNN, BLAS, threads, ISA) for
// `shoal info` and benchmark headers.
std::vector<std::pair<std::string, std::string>> runtime_info();

// Whether this CPU computes bf16 products natively (AVX-512 BF16 or AMX-BF16,
// which oneDNN uses): --precision bf16 needs one, since an emulation would be
// slower than f32. The error names the instruction sets and the CPU.
// SHOAL_CPU_BF16=0 reports them missing (to test the refusal on any host).
Status bf16_support();
}  // namespace shoal::runtime
