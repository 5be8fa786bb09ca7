// Pipeline parallelism (GPipe, Huang et al. 2019; 1F1B, PipeDream-Flush,
// Narayanan et al. 2021) as a rewrite of one step's graph, for a group of P
// ranks, each holding one stage: a contiguous run of the model's layers.
//
// plan_pipeline finds where a forward graph can be cut: positions in its
// order where exactly one activation crosses (between transformer blocks,
// the residual stream), and picks P-1 of them so that the stages' estimated
// cost (FLOPs of matmuls and convolutions, elements elsewhere) is as even as
// the cuts allow, or takes the cuts it is given.
//
// build_stage_step builds stage s's whole training step from the forward
// graph of one micro-batch: the batch is split into m micro-batches; each
// runs the stage's layers, receiving its input from stage s-1 (pp_recv) and
// sending its output to stage s+1 (pp_send); autodiff of each micro-batch's
// objective (its send's token, or its loss / m on the last stage) builds the
// backward, whose pp_recv/pp_send are the gradients of the forward ones;
// gradients are summed over micro-batches. Each node's schedule slot orders
// the micro-batches as the schedule says (GPipe: all forwards then all
// backwards; 1F1B: P-s-1 forwards, then one forward and one backward in
// turn, which keeps at most P-s micro-batches' activations alive), and the
// executor's memory plan follows that order. Only this stage's parameters
// are in its graph, so only this stage updates them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/graph.h"
#include "shoal/train/trainer.h"

namespace shoal::mp {

// One direction of a pipeline link: `comm` carries this op's tensor, the
// reverse op (its gradient) travels over `grad_comm`. Ids from
// collective::register_communicator; peer is a rank of that group.
struct PipeLink {
  std::int64_t comm = -1, grad_comm = -1, peer = -1, tag = 0;
};
void register_pipeline_ops();
graph::Value pp_send(graph::Builder& b, graph::Value x, const PipeLink& l);
graph::Value pp_recv(graph::Builder& b, graph::Value after, const Shape& shape, const PipeLink& l);

struct PipelinePlan {
  std::vector<int> order;  // the forward's nodes, in execution order
  struct Cut {
    std::size_t pos = 0;  // the cut is before order[pos]
    graph::Value value;   // the one activation that crosses it
    double cost_before = 0;
  };
  std::vector<Cut> candidates;    // every place a cut may go
  std::vector<std::size_t> cuts;  // the chosen ones (indices into candidates)
  std::vector<double> stage_cost;
  double total_cost = 0;
  // Node range [first, last) of `order` that stage s runs.
  std::pair<std::size_t, std::size_t> range(int s) const;
  // `ranks`: the pipeline's ranks, when it holds more pieces (chunks).
  std::string str(const graph::Graph& g, int ranks = 0) const;
};
// Interleaved stages (see stage_work): `ranks` hold the plan's pieces in
// turn, each batch in `micro` micro-batches.
struct Interleave {
  int ranks = 0, micro = 1;
};
// `outputs`: the values the forward computes (loss, logits). `cuts`: indices
// into the candidates (empty: balanced by cost: the largest stage as small
// as it can be; with `il.ranks` < `stages`, the estimated step of the
// interleaved schedule, micro x the largest sum of a rank's pieces +
// (ranks - 1) x the largest piece).
Result<PipelinePlan> plan_pipeline(const graph::Graph& g, const std::vector<graph::Value>& outputs,
                                   int stages, const std::vector<std::size_t>& cuts = {},
                                   const Interleave& il = {});

// Whether node `id` is computed from graph inputs other than parameters and
// from constants only (no communication): such nodes belong to no stage.
bool from_inputs_only(const graph::Graph& g, int id);

enum class Schedule { kGPipe, k1F1B };
Result<Schedule> parse_schedule(const std::string& name);  // "gpipe", "1f1b"
// Stage s's order of work: (micro-batch, true for its forward) pairs.
std::vector<std::pair<int, bool>> schedule_order(Schedule s, int stage, int stages, int micro);

// Interleaved (virtual) stages, Megatron's way (Narayanan et al. 2021): the
// model is cut into stages x chunks pieces and rank s holds pieces s,
// s + stages, s + 2·stages, ...: its chunk c is piece c·stages + s. A
// micro-batch goes round the ranks `chunks` times, so each rank starts work
// sooner and the bubble shrinks from (p-1)/(m+p-1) toward
// (p-1)/(chunks·m+p-1), for chunks times the sends.
struct Work {
  int chunk = 0, micro = 0;
  bool forward = true;
  bool operator==(const Work&) const = default;
};
// Stage s's order of work over its chunks. chunks == 1: schedule_order.
// chunks > 1 (micro a multiple of stages): forwards go chunk by chunk in
// groups of `stages` micro-batches, backwards likewise from the last chunk;
// 1F1B runs 2·(stages-s-1) + (chunks-1)·stages forwards first (all of them
// when micro == stages), then one forward and one backward in turn; GPipe
// runs every forward first.
std::vector<Work> stage_work(Schedule s, int stage, int stages, int micro, int chunks);
// The tag of a pipeline frame: the cut it crosses and the micro-batch.
constexpr int kMaxMicroBatches = 1 << 16;
inline std::int64_t pipe_tag(int cut, int micro) {
  return static_cast<std::int64_t>(cut) * kMaxMicroBatches + micro;
}

struct StageOptions {
  int stage = 0, stages = 1, micro_batches = 1;
  int chunks = 1;  // interleaved stages: the plan has stages x chunks pieces
  Schedule schedule = Schedule::k1F1B;
  // Activations go forward over fwd_comm, gradients back over bwd_comm (two
  // progress threads: a stage's send never queues behind its receive from
  // the other side); the loss is broadcast from the last stage over loss_comm.
  std::int64_t fwd_comm = -1, bwd_comm = -1, loss_comm = -1;
};

struct StageStep {
  graph::Value loss;                    // the step's mean loss on every stage (from the last)
  graph::Value logits;                  // the last stage: every micro-batch's, in batch order
  std::vector<train::ParamRef> params;  // this stage's, gradients summed over micro-batches
  // The running statistics after the last micro-batch (see build_stage_step).
  std::vector<std::pair<std::string, graph::Value>> buffers;
};
// Replaces `g` (the forward of one micro-batch: inputs "x" and "labels" of
// batch / m rows) with stage s's step for the whole batch. `buffers`: the
// forward's running-statistics updates (batch norm), by buffer name, whose
// values the plan's outputs must include; only in a plan of one piece
// (gradient accumulation): micro-batch i reads the statistics micro-batch
// i - 1 wrote, as PyTorch's accumulation loop does, and the step's are the
// last one's.
Result<StageStep> build_stage_step(
    graph::Graph& g, graph::Value loss, graph::Value logits, const PipelinePlan& plan,
    const StageOptions& o, const std::vector<std::pair<std::string, graph::Value>>& buffers = {});
// Replaces `g` (an evaluation forward, output 0 its logits) with stage s's
// part; output 0 becomes the send's token except on the last stage.
Status build_stage_forward(graph::Graph& g, const PipelinePlan& plan, const StageOptions& o);

// The parameters each stage's nodes use. A parameter several stages use (a
// tied embedding and output head) is in each of their lists: each holds it
// and updates it alike, with its gradient summed over them (Megatron's
// embedding all-reduce between the first and last stage).
Result<std::vector<std::vector<std::string>>> stage_params(const graph::Graph& g,
                                                           const PipelinePlan& plan);

struct PipelineOptions {
  int stages = 2, micro_batches = 4;
  int chunks = 1;  // pieces of the model per rank (interleaved stages)
  Schedule schedule = Schedule::k1F1B;
  std::vector<std::size_t> cuts;  // indices into the plan's candidates (empty: balanced)
};
// Makes `o` train stage (rank of `pipe`) of a pipeline over the ranks of
// `pipe`: the trainer's step_pass and forward_pass, and each parameter held
// by the stages that use it. The communicators must outlive the trainer.
Status attach_pipeline(train::TrainOptions& o, comm::Communicator& pipe, const PipelineOptions& po);

}  // namespace shoal::mp
