// The trainer: builds the step graph (model forward, cross-entropy,
// autodiff, an optional gradient pass, optimizer update nodes), compiles it
// and an eval graph on the CPU backend over the same parameter tensors, and
// runs epochs with a progress line, per-epoch test accuracy, JSONL metrics,
// a PNG plot and atomic checkpoints. Resuming restores params, buffers,
// optimizer state, step, and data position, so a deterministic run resumes
// to bit-identical weights. One Trainer per process (it sets the CPU thread
// count); not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/graph/graph.h"
#include "shoal/train/checkpoint.h"
#include "shoal/train/model.h"
#include "shoal/train/optim.h"
#include "shoal/train/weights.h"

namespace shoal::runtime {
class Executable;
}  // namespace shoal::runtime

namespace shoal::train {

struct DataSplits;  // train/sources.h
struct StepBuild;   // train/trainer_impl.h

// What a trainer needs from the other ranks of a data-parallel job
// (dp::attach implements it over a Communicator). Every call is collective:
// all ranks make the same calls in the same order.
class Peers {
 public:
  virtual ~Peers() = default;
  // All ranks must hold the same `value` for `what`; otherwise the error
  // names a rank that differs and both values.
  virtual Status agree(const std::string& what, std::uint64_t value) = 0;
  // All ranks must hold the same value for each (option, value) pair, in
  // the same order; otherwise the error names the first option that
  // differs, a rank that differs and both values.
  using Options = std::vector<std::pair<std::string, std::string>>;
  virtual Status agree_options(const Options& options) = 0;
  virtual Status broadcast(Tensor& t) = 0;         // rank 0's value, in place
  virtual Status sum(std::vector<double>& v) = 0;  // element-wise over ranks, in place
  virtual Status average(Tensor& t) = 0;           // f32, element-wise mean over ranks, in place
  // Whether sum and average combine every rank. When they do not (an async
  // parameter-server job, whose workers come and go) each rank evaluates
  // the whole test set instead of its share.
  virtual bool collective() const { return true; }
};

// What the user sets: the CLI's flags, the Python module's keywords, a
// config file. Kept in a run's options and compared across ranks.
struct TrainSettings {
  std::string model = "cnn";
  GptConfig gpt;  // --model gpt's size; gpt.context is also text data's sample length
  // An ONNX model: initializers several nodes read stay one parameter
  // (onnx::Bindings::tie_shared).
  bool onnx_tied = false;
  std::string data = "fashion-mnist";  // what train/sources.h's load_data reads
  // Data already in memory (the Python bindings): used instead of `data`,
  // which then only names it (in messages and the ranks' agreement).
  std::shared_ptr<const DataSplits> dataset;
  int epochs = 5;
  std::int64_t batch = 64;
  // The samples of one step over every data-parallel share (--global-batch);
  // 0 means batch x shares. When set, Trainer::create gives this rank its
  // share as `batch`: global / shares each, the first global % shares one
  // more, each share's gradient weighted so their mean is the mean over
  // the global batch (the math of any layout with that global batch).
  std::int64_t global_batch = 0;
  std::string optimizer = "sgd";
  double lr = 0.02;
  double momentum = 0.9, weight_decay = 0.0;
  double trust = 0.001;               // LARS eta
  std::string schedule = "constant";  // constant, step, cosine
  double warmup_epochs = 0;
  double step_epochs = 1, gamma = 0.1;  // step schedule
  bool linear_scaling = false;          // lr *= global batch / 256
  int threads = 0;                      // 0 = all cores
  std::uint64_t seed = 0;
  std::string out;  // run directory ("" = runs/<model>)
  bool augment = false;
  bool deterministic = false;  // refuse to resume with a different thread count
  // "f32", or "bf16": the step's matmuls and convolutions read bf16
  // operands and accumulate in f32 (graph::autocast_bf16); weights,
  // optimizer state and everything else stay f32. Needs a CPU with bf16
  // products.
  std::string precision = "f32";
  // "none"; "selective": attention's softmax region is computed again in
  // the backward instead of kept (graph::recompute_attention); "full": only
  // the norm layers' inputs are kept (graph::recompute_full).
  std::string recompute = "none";
  int keep_checkpoints = 3;
  std::int64_t checkpoint_every = 0;  // steps; 0 = at the end of each epoch
  bool checkpoints = true;
  // Every rank writes its share of each checkpoint (checkpoint.h's sharded
  // directory with an index) instead of rank 0 writing one file.
  bool sharded_checkpoints = false;
  bool resume = false;
  // Start from these weights (a checkpoint, or a safetensors state_dict
  // another tool wrote; train/weights.h) instead of a random init.
  std::string init_from;
  std::int64_t max_steps = 0;                    // stop after this many steps in all (0 = no limit)
  std::int64_t limit_train = 0, limit_test = 0;  // use the first N samples (0 = all)
  // The number of classes (0 = one more than the largest label): a label
  // outside [0, classes) is refused by name.
  int classes = 0;
  std::int64_t eval_batch = 500;
  bool plot = true;
  bool quiet = false;  // no progress output (tests)
  std::string trace;   // Chrome trace of the last 10 steps, rewritten each epoch
  // The training step's graph as JSON (graph::to_json), after every pass
  // (strategies, precision, recomputation), before the backend compiles it;
  // with several ranks each writes FILE.rank<r>.json.
  std::string dump_graph;
};

// What the distribution passes fill in (dist::Job and the strategies'
// attach functions), never the user: this process's place in its job and
// the hooks through which a strategy rewrites the training step.
struct StrategyHooks {
  int rank = 0, world = 1;  // this process among the job's ranks (set by dist)
  // Runs between autodiff and the optimizer (the data-parallel pass): may
  // rewrite gradients in `params` (each ParamRef.grad).
  std::function<Status(graph::Graph&, std::vector<ParamRef>&)> grad_pass;
  // Allocates the training step's arena (runtime::CompileOptions); dp::attach
  // gives shared memory so gradient buckets are all-reduced over mappings.
  std::function<Result<std::shared_ptr<Storage>>(std::size_t)> arena_allocator;
  // Replaces the optimizer (append_optimizer): builds the new parameters
  // from the gradients elsewhere, as the parameter server's push-pull nodes
  // do (ps::attach). The returned lr input ("lr", a scalar) is fed the
  // schedule's rate each step; state and step may be left empty.
  std::function<Result<OptimizerGraph>(graph::Builder&, const std::vector<ParamRef>&)> update_pass;
  // Rewrites the forward graph (the training graph before autodiff, and
  // every evaluation graph) so that some parameters are held as per-rank
  // slices (tensor parallelism, mp::attach_tensor_parallel). The trainer
  // keeps this rank's slices; checkpoints, a resume and the start-up hold
  // whole tensors, built and cut with these functions.
  struct ParamSlices {
    std::set<std::string> names;  // parameters held as slices
    // This rank's slice of a whole parameter (or of its optimizer state).
    std::function<Tensor(const std::string& param, const Tensor& whole)> slice;
    // The whole tensor from every rank's slice (collective).
    std::function<Result<Tensor>(const std::string& param, const Tensor& mine)> gather;
    // Whether this rank computes the model's logits (false on a pipeline's
    // earlier stages, whose slices of the parameters they do not hold are
    // empty tensors).
    bool reports = true;
    // The evaluation graphs gather parameters inside the graph (ZeRO-3), so
    // every rank of a data-parallel group runs as many evaluation steps as
    // the others: a rank whose share of the test set is one batch short
    // runs the last batch again, unscored. No rank ever holds the whole
    // model at once.
    bool eval_in_lockstep = false;
    // Set when the rewrite computes the training loss without whole logits
    // (tensor parallelism's vocabulary-parallel cross-entropy): a scalar,
    // how many rows' label scores highest, which the trainer reports as the
    // step's right answers instead of reading the logits.
    graph::Value correct;
  };
  std::function<Result<ParamSlices>(graph::Graph&)> forward_pass;
  // Replaces autodiff (pipeline parallelism, mp::attach_pipeline): given the
  // forward of one micro-batch (batch / micro_batches samples) with its
  // loss, logits and every parameter, it may replace the graph with this
  // rank's whole step, and returns in `step` the step's loss, the logits
  // (invalid where the rank computes none) and the parameters the rank
  // holds, with their gradients. forward_pass then rewrites only the
  // evaluation graphs.
  struct Step {
    graph::Value loss, logits;
    std::vector<ParamRef> params;
    // In: the forward's running-statistics updates (batch norm), by buffer
    // name; out: the step's. A pass that cannot carry them refuses.
    std::vector<std::pair<std::string, graph::Value>> buffers;
  };
  std::function<Result<ParamSlices>(graph::Graph&, Step& step)> step_pass;
  int micro_batches = 1;
  // The share of each global batch this rank trains on, when it is not
  // (rank, world): tensor-parallel ranks all see the same batch (0 of 1).
  int data_rank = -1, data_world = -1;
  // Which share of the global batch this rank trains on, and how many
  // shares there are (data_rank/data_world when set, else rank/world).
  int data_shard() const { return data_world > 0 ? data_rank : rank; }
  int data_shards() const { return data_world > 0 ? data_world : world; }
  // Runs once when start-up is done (after a resume and rank 0's
  // broadcast), with the parameters: ps::attach initializes the servers'
  // keys and pulls their current values into them.
  std::function<Status(std::map<std::string, Tensor>&)> on_start;
  // State a pass keeps outside the graph (ps: each worker's 2-bit
  // residuals), saved and restored with the checkpoints: on_checkpoint runs
  // on every rank at each checkpoint, on_resume once at start-up after a
  // resume, with the checkpoints' directory and the step.
  std::function<Status(const std::string& dir, std::int64_t step)> on_checkpoint;
  std::function<Status(const std::string& dir, std::int64_t step)> on_resume;
  // Prepare training batches ahead on a worker thread. dp::attach turns it off
  // when no core is free: the worker would run only by preempting a rank.
  bool prefetch = true;
  // Elastic data parallelism (dist/elastic.h). `commit`: keep the state of
  // the last step boundary (Trainer::committed), so a step that fails
  // half-applied is not lost: the live tensors where the step's updates can
  // wait for its all-reduces (plain data parallelism without running
  // statistics), else a copy of the parameters, buffers and optimizer state.
  // `resume_state`: such a copy from the generation before, where training
  // continues instead of from a checkpoint file (every rank restores its
  // own; rank 0's is then broadcast as after any resume). `metrics_note`: a
  // JSON object the lead appends to metrics.jsonl when run() starts (what
  // changed in the job's membership).
  bool commit = false;
  // Steps between copies (SHOAL_ELASTIC_COMMIT_EVERY): 0 = chosen from the
  // measured copy and step times so the copies cost about 2% of training;
  // a fault then trains again at most that many steps. Given (> 0), copies
  // are kept even where the live tensors would do.
  int commit_every = 0;
  std::shared_ptr<const CheckpointState> resume_state;
  std::string metrics_note;
  // Asked on rank 0 after every step: whether ranks wait to join. If so,
  // every rank ends run() after that step with CANCELLED, state committed.
  std::function<bool()> regroup;
  // The other ranks (null when world == 1): start-up agreement on the graph
  // and build, rank 0's weights broadcast, metrics summed, buffers averaged.
  std::shared_ptr<Peers> peers;
};

// A trainer's options: the user's settings and the strategies' hooks.
struct TrainOptions : TrainSettings, StrategyHooks {
  std::int64_t global() const { return global_batch > 0 ? global_batch : batch * data_shards(); }
  // Share `s` of the global batch: its first sample and its size.
  std::int64_t share_offset(int s) const;
  std::int64_t share_size(int s) const;
};
// Checks ranges and names (model, optimizer, schedule); the error names the option.
Status validate(const TrainOptions& o);
// The optimizer the options name (what append_optimizer builds).
OptimizerOptions optimizer_options(const TrainOptions& o);

struct EpochMetrics {
  int epoch = 0;
  std::int64_t step = 0;  // global step at the end of this entry
  bool partial = false;   // --max-steps ended the run inside this epoch
  double train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0;
  double images_per_s = 0, train_seconds = 0, wall_seconds = 0;
  // This rank's model FLOP/s (the step graph's products, forward and
  // backward) and their share of the host's measured GEMM peak (0: unknown).
  double model_flops_per_s = 0, mfu = 0;
};

// Where one training step's time and memory go on this rank: the median
// over the traced steps (TrainSettings::trace, the last 10) of the step
// graph's kernels, by kind, and the bytes the rank holds. What `shoal
// plan` calibrates from.
struct StepProfile {
  int steps = 0;      // traced steps the medians are over
  double step_s = 0;  // the step graph's run, wall clock
  // From one step's start to the next's: the run, the batch, and waiting
  // for the other ranks where they step together (measured with or
  // without a trace).
  double period_s = 0;
  double product_s = 0;  // matmuls and convolutions, forward and backward
  double update_s = 0;   // optimizer updates
  double other_s = 0;    // every other kernel on the compute thread
  // Collectives on the compute thread: all-reduces (data and tensor
  // parallelism), a pipeline's sends and receives, ZeRO's gathers and
  // reduce-scatters (not in other_s).
  double allreduce_s = 0, transfer_s = 0, shard_s = 0;
  double flops = 0;  // model FLOPs of one step (graph::graph_flops)
  std::size_t arena_bytes = 0, param_bytes = 0, state_bytes = 0, buffer_bytes = 0;
  int param_tensors = 0;
  std::size_t bytes() const { return arena_bytes + param_bytes + state_bytes + buffer_bytes; }
};

struct EvalResult {
  double loss = 0, accuracy = 0;
  std::int64_t samples = 0;
};

class Trainer {
 public:
  static Result<std::unique_ptr<Trainer>> create(const TrainOptions& o);
  ~Trainer();

  // Trains until `epochs` (or max_steps), evaluating after each epoch.
  Status run();
  Result<EvalResult> evaluate();
  Status checkpoint();  // saves now (collective; rank 0 writes unless sharded)
  Status resume_latest();
  // The state at the last step boundary (TrainOptions::commit), or null:
  // what an elastic job's next generation continues from.
  std::shared_ptr<const CheckpointState> committed() const;

  std::int64_t global_step() const { return step_; }
  std::int64_t steps_per_epoch() const;
  const std::map<std::string, Tensor>& params() const { return params_; }
  // Batch-norm running statistics (averaged over ranks first when several train).
  Result<std::map<std::string, Tensor>> buffers();
  // Replaces parameters and buffers from `w` in place (names and shapes
  // checked as for --init-from); every rank must load the same weights.
  Status load_weights(const WeightsFile& w);
  // Trains until `epochs` in all from now on (after run() has reached the
  // options' count: the LR schedule stretches to the new total).
  Status set_epochs(int epochs);
  int epochs() const { return o_.epochs; }
  const std::vector<EpochMetrics>& history() const { return history_; }
  // The traced steps' profile (needs TrainSettings::trace; the first
  // `skip` traced steps are left out, as warm-up). Bytes without tracing.
  StepProfile step_profile(std::size_t skip = 0) const;
  const std::string& run_dir() const { return dir_; }
  // The signal (SIGINT, SIGTERM; core/stop.h) that ended run() early after
  // a checkpoint, or 0.
  int stopped_by() const { return stopped_by_; }

 private:
  Trainer() = default;
  struct Impl;
  Status init(const TrainOptions& o);
  // init's parts (trainer.cc).
  Status load_splits(const std::optional<WeightsFile>& init_w);
  Status build_forward(StepBuild& sb);
  Status agree_with_peers(const graph::Graph& g);
  Status differentiate(StepBuild& sb);
  void weigh_share(graph::Graph& g, std::vector<ParamRef>& refs) const;
  Status init_state(StepBuild& sb, const std::optional<WeightsFile>& init_w);
  Status compile_step(StepBuild& sb);
  Status train_step(double* loss, std::int64_t* correct);
  // Collective where ranks step together: the mean loss, a stop signal on
  // any rank, whether an elastic job regroups (TrainOptions::regroup), and
  // whether it copies its state (`commit`: any rank's wish is every rank's,
  // as a sharded state's copy is a collective gather).
  Result<int> step_vote(double* loss, bool* regroup, bool* commit);
  Status stop_now(int sig);
  Status commit_step();  // trainer_commit.cc
  // Whether the step's updates can wait for its all-reduces (then no copy
  // is kept: TrainOptions::commit goes on from the live tensors).
  void hold_updates();
  // Whether this step boundary gets a copy (TrainOptions::commit_every),
  // given the mean step time so far.
  bool commit_due(double step_seconds) const;
  Status restore(const std::string& from, const CheckpointState& s);
  Status report_finished(std::int64_t limit);
  const char* rate_key() const;  // metrics.jsonl's name for the rate
  void log_train_record(int epoch, double loss, std::int64_t steps, double rate, double flops);
  void log_epoch_record(const EpochMetrics& em, double elapsed_s);
  Status open_run_dir();  // the lead's, at the start of run()
  Status write_plot() const;
  void print_epoch(const EpochMetrics& em) const;
  Status sync_from_lead();
  // Parameters held as slices (trainer_slices.cc).
  bool sliced(const std::string& param) const;
  Shape whole_shape(const std::string& param) const;
  // Collective: "param/.." and the sliced entries of `state` ("opt/..")
  // made whole; this rank keeps those `keep` names.
  Result<std::map<std::string, Tensor>> gather_slices(
      const std::map<std::string, Tensor>& state,
      const std::function<bool(const std::string&)>& keep);
  // Every tensor a checkpoint holds, whole, with its dtype and shape: the
  // same on every rank, before any is gathered.
  std::map<std::string, TensorMeta> checkpoint_metas() const;
  Status sync_slices(bool resumed);
  void hold_empty_state(const OptimizerGraph& og);
  Status count_reporters();
  // The evaluation graph for batches of this shape (one per batch size: the
  // tail gets its own), compiled on first use.
  Result<runtime::Executable*> eval_exe(const Shape& images);
  CheckpointDir checkpoint_dir() const;  // <run dir>/checkpoints, keeping keep_checkpoints
  void describe_checkpoint(CheckpointState& s) const;  // the metadata
  // Collective: `s` holds this rank's share of `listing`.
  Status save_sharded(const std::map<std::string, TensorMeta>& listing, const CheckpointState& s);
  Status sync_buffers();
  TrainOptions o_;
  std::string dir_;
  std::unique_ptr<Impl> impl_;
  std::map<std::string, Tensor> params_, buffers_, state_;
  std::int64_t step_ = 0;
  std::int64_t buffers_synced_at_ = -1;
  int stopped_by_ = 0;
  std::vector<EpochMetrics> history_;
};

// Rewrites a metrics.jsonl without the records of steps after `step` (a
// run resumed from an earlier checkpoint than its last record).
Status keep_metrics_until(const std::string& path, std::int64_t step);

}  // namespace shoal::train
