// The trainer's private state and helpers, shared by the files that
// implement it (trainer.cc: set-up, steps, evaluation, the loop;
// trainer_checkpoint.cc: saving and resuming). Private to train.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "shoal/runtime/backend.h"
#include "shoal/train/data.h"
#include "shoal/train/model.h"
#include "shoal/train/optim.h"
#include "shoal/train/trainer.h"

namespace shoal::train {

using Clock = std::chrono::steady_clock;

// A progress line that redraws in place on a terminal and prints plain
// lines (about ten per epoch) otherwise.
class Progress {
 public:
  // SHOAL_PLAIN_OUTPUT=1 (set by shoal run, whose rank prefixes break
  // in-place redraws, even where mpirun gives ranks a terminal): lines.
  Progress(bool quiet)
      : quiet_(quiet),
        tty_(isatty(STDOUT_FILENO) != 0 && std::getenv("SHOAL_PLAIN_OUTPUT") == nullptr) {}
  std::string unit = "img/s";  // tok/s for text
  // `extra`: more of the line before the ETA (the model FLOP/s and MFU).
  void update(int epoch, int epochs, std::int64_t i, std::int64_t n, double loss, double ips,
              double eta_s, const std::string& extra = "") {
    if (quiet_) return;
    auto now = Clock::now();
    bool last = i == n;
    if (tty_) {
      if (!last && now - last_ < std::chrono::milliseconds(200)) return;
      last_ = now;
      int width = 24, fill = n ? static_cast<int>(width * i / n) : width;
      std::string bar(static_cast<std::size_t>(fill), '#');
      bar.resize(static_cast<std::size_t>(width), '.');
      fmt::print("\repoch {}/{} [{}] {}/{} loss {:.4f} {:.0f} {}{} ETA {}   ", epoch, epochs, bar,
                 i, n, loss, ips, unit, extra, eta(eta_s));
      if (last) fmt::print("\n");
      std::fflush(stdout);
    } else {
      std::int64_t every = std::max<std::int64_t>(n / 10, 1);
      if (i % every != 0 && !last) return;
      fmt::print("epoch {}/{} step {}/{} loss {:.4f} {:.0f} {}{} ETA {}\n", epoch, epochs, i, n,
                 loss, ips, unit, extra, eta(eta_s));
      std::fflush(stdout);
    }
  }

 private:
  static std::string eta(double s) {
    auto t = static_cast<std::int64_t>(std::max(0.0, s));
    return fmt::format("{}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60);
  }
  bool quiet_, tty_;
  Clock::time_point last_{};
};

// " 12.3 GFLOP/s MFU 41%" for the progress and epoch lines (no MFU when
// the peak is unknown). trainer_report.cc.
std::string flops_str(double flops_per_s, double peak);

inline std::int64_t argmax_row(const float* row, std::int64_t c) {
  std::int64_t best = 0;
  for (std::int64_t j = 1; j < c; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

// The bytes of a set of named tensors (parameters, optimizer state, buffers).
inline std::size_t total_bytes(const std::map<std::string, Tensor>& ts) {
  std::size_t n = 0;
  for (const auto& [name, t] : ts) n += t.nbytes();
  return n;
}

inline void copy_into(Tensor& dst, const Tensor& src) {
  std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
}

struct Trainer::Impl {
  Dataset train, test;
  std::unique_ptr<Loader> loader;
  Model model;
  std::vector<ParamSpec> specs;
  std::vector<BufferSpec> bspecs;
  std::unique_ptr<runtime::Executable> exe;
  std::map<std::int64_t, std::unique_ptr<runtime::Executable>> eval_exes;
  // Output index -> persistent tensor it is copied back into after a step.
  std::vector<std::pair<int, Tensor*>> writeback;
  Tensor lr, opt_step;
  LrSchedule sched;
  float mean = 0, stddev = 1;
  std::ofstream metrics;
  Progress progress{false};
  bool tracing = false;
  std::deque<std::vector<runtime::TraceEvent>> trace_steps;
  // Seconds from one step's start to the next's, the last kTraceSteps.
  std::deque<double> periods;
  // A sharded optimizer state's layout (null: per parameter, OptimizerGraph),
  // and the logical state a resume read on rank 0, until sync_from_lead
  // hands every rank its shard.
  std::shared_ptr<OptimizerGraph::Layout> layout;
  std::map<std::string, Tensor> resumed_state;
  // Parameters held as slices (TrainOptions::forward_pass), and the whole
  // tensors a resume read on rank 0 ("param/<p>", "opt/<p>/<slot>") until
  // sync_from_lead cuts every rank's slices from them.
  std::optional<TrainOptions::ParamSlices> slices;
  std::map<std::string, Tensor> resumed_whole;
  // The step's outputs: its loss and logits (-1: an earlier pipeline stage
  // computes none), and how many ranks score each batch (the ones whose
  // slices report: all of a tensor-parallel group, a pipeline's last stage).
  int loss_out = 0, logits_out = -1, correct_out = -1;
  double report_copies = 1;
  // The step's outputs that update parameters and optimizer state.
  std::vector<int> update_outputs;
  // TrainOptions::commit without copies (trainer_commit.cc): the updates
  // wait for every all-reduce of the step, so a step that fails in one
  // leaves the state of the step before it. `in_step`: a run() began and
  // has not returned well; `live_from`: the start-up is over (before, the
  // tensors may hold half a broadcast).
  bool live = false, in_step = false, live_from = false;
  // TrainOptions::commit: the state at the last step boundary.
  std::shared_ptr<CheckpointState> commit;
  double commit_seconds = 0;   // how long the last copy took
  std::int64_t commit_at = 0;  // its step (kept as a number: read every step)
  // Model FLOPs of one step on this rank (graph::graph_flops of the compiled
  // step): with the step time, the model FLOP/s and MFU the reports carry.
  double step_flops = 0;
  double peak_flops = 0;  // this host's GEMM peak for the precision (0: unknown)
};

inline bool has_input(const runtime::Executable& exe, const std::string& name) {
  return exe.graph().find_input(name).ok();
}

// The step graph while init builds it.
struct StepBuild {
  graph::Graph g;
  graph::Value loss, logits;
  graph::Value correct;  // in place of the logits (ParamSlices::correct)
  std::vector<ParamRef> refs;
  OptimizerGraph og;
  std::vector<std::pair<std::string, graph::Value>> buffer_updates;
  int forward_end = -1;  // nodes before autodiff (-1: a step pass differentiated)
};

// Binds a batch's images (and labels) where the graph reads them: a
// pipeline's later stages read no images, its earlier ones no labels.
inline Status bind_batch(runtime::Executable& exe, const Batch& b, bool labels) {
  if (exe.graph().find_input("x").ok()) SHOAL_RETURN_IF_ERROR(exe.bind("x", b.images));
  if (labels && exe.graph().find_input("labels").ok())
    SHOAL_RETURN_IF_ERROR(exe.bind("labels", b.labels));
  return ok_status();
}
inline constexpr std::size_t kTraceSteps = 10;

// "opt/<param>/<slot>" -> "<param>" ("" for other names).
inline std::string state_param(const std::string& name) {
  if (!name.starts_with("opt/")) return "";
  const std::size_t slot = name.rfind('/');
  return slot > 4 ? name.substr(4, slot - 4) : "";
}

}  // namespace shoal::train
