// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) as a rewrite of a
// forward graph, before autodiff, for a group of T ranks that all see the
// same batch. The plan is found in the graph: a *column* linear (weight a
// parameter input) whose output flows only through shardable ops
// (reshape, transpose, batched matmul, elementwise, softmax) into the input
// of *row* linears. Several columns may feed one region (attention's q, k
// and v meet in its matmuls); a linear that is a row is never also a
// column. The rewrite splits each column's weight by output rows and its
// bias, each row's weight by input columns, and divides the sharded
// dimension of every reshape in the region by T (attention heads, MLP
// hidden units). An embedding's table and an output head's weight (tied or
// not) are split by vocabulary rows (any vocabulary size: ranks hold
// r*V/T..(r+1)*V/T), the lookup summed over the group, the head's columns
// of the logits gathered. Two ops carry the communication, as in Megatron:
//   tp_copy(x):      identity forward; its gradient is an all-reduce (the
//                    column linears' input is used by every rank's shard).
//   tp_allreduce(y): sum over the group forward (the row linear's partial
//                    products); its gradient is the identity.
// The row linear's bias is added once, after the all-reduce. Autodiff of
// the rewritten graph gives one all-reduce forward and one backward per
// region. Each rank's slice of a sharded parameter is a contiguous block of
// its rows (columns) — for attention, whole heads — so the group computes
// exactly what one process computes with the whole parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shoal/graph/graph.h"
#include "shoal/tensor/tensor.h"
#include "shoal/train/trainer.h"

namespace shoal::mp {

struct TpShard {
  std::string input;  // the parameter's graph input ("param/h.0.attn.q.weight")
  int axis = 0;       // 0: split by rows (column linears), 1: by columns (row linears)
  Shape full;         // its whole shape
  // Rows [r*n/T, (r+1)*n/T) on rank r, for any n (an embedding's
  // vocabulary).
  bool uneven = false;
  // Else, with units > 0: split by whole units (attention heads; for a
  // region without heads, its hidden units), which need not divide by T:
  // rank r holds units [r*U/T, (r+1)*U/T) of the U along `axis`. 0: even.
  std::int64_t units = 0;
};
// A range of `n` split over `size` ranks as evenly as it goes: rank r's start.
inline std::int64_t split_at(std::int64_t n, int r, int size) { return n * r / size; }
// Rank r's [begin, end) of the shard's axis.
inline std::pair<std::int64_t, std::int64_t> tp_range(const TpShard& s, int r, int size) {
  const std::int64_t n = s.full[static_cast<std::size_t>(s.axis)];
  const std::int64_t u = s.uneven ? n : s.units > 0 ? s.units : size;
  return {n * split_at(u, r, size) / u, n * split_at(u, r + 1, size) / u};
}

struct TpPlan {
  struct Region {
    std::vector<std::string> columns, rows;  // the linears' weight inputs
  };
  std::vector<Region> regions;
  // Vocabulary-parallel embeddings (Megatron): tables read by one embedding
  // and nothing else (an untied one), split by rows; each rank looks up
  // the ids it holds, zeros for the others, and the group sums.
  std::vector<std::string> tables;
  // Parameters read as output heads (matmul with the parameter transposed,
  // tied to a table above or their own), split by the same rows: each rank
  // computes its columns of the logits, and the group sums them, placed
  // among zeros, into the whole logits (Megatron's column-parallel head
  // with its output gathered; the cross-entropy runs on the whole logits).
  std::vector<std::string> heads;
  std::vector<TpShard> shards;  // every parameter input the rewrite splits
  std::string str() const;      // one line per region, for logs
};

void register_tensor_parallel_ops();
// vocab_parallel_cross_entropy and its gradient (mp/vocab_cross_entropy.cc);
// register_tensor_parallel_ops calls it.
void register_vocab_cross_entropy();

// Finds the plan for a group of `size` ranks; an error names a parameter
// whose sharded dimension `size` does not divide.
Result<TpPlan> plan_tensor_parallel(const graph::Graph& g, int size);

// Rewrites `g` for this rank of the group registered as `comm_id`
// (collective::register_communicator), following `plan` (from plan_tensor_parallel,
// or edited). The parameter inputs then take this rank's slices. With
// parallel_loss, a cross-entropy of a vocabulary-parallel head's logits
// becomes Megatron's vocabulary-parallel one (vocab_parallel_cross_entropy:
// its outputs are the loss, each row's log-sum-exp and the count of rows
// whose label scores highest); without, it reads the logits made whole.
Status shard_tensor_parallel(graph::Graph& g, const TpPlan& plan, std::int64_t comm_id,
                             bool parallel_loss = true);

// Sequence parallelism on a graph shard_tensor_parallel rewrote: where the
// ops between a row-parallel sum (tp_allreduce) and the column-parallel
// inputs it reaches (tp_copy) are row-wise (adds, layer norms, reshapes)
// and every operand from outside broadcasts over the rows, the sum becomes
// a reduce_scatter along the first axis, the copies allgathers, and those
// ops run on this rank's rows only (their first dimension / T). Returns how
// many such regions it split; `refused` gets why each other one was not
// (a row count T does not divide, an op that is not row-wise, a graph
// output). With one_sum_for_params the parameters those ops read pass one
// tp_copy_bucket (their gradients summed in one all-reduce); without, a
// tp_copy each (a pipeline cuts the graph into stages: one node feeding
// every stage would not fit one).
Result<int> shard_sequence(graph::Graph& g, std::int64_t comm_id,
                           std::vector<std::string>* refused = nullptr,
                           bool one_sum_for_params = true);

// This rank's slice of a whole parameter, as the plan splits it.
Tensor tp_slice(const Tensor& full, const TpShard& s, int rank, int size);

// Makes `o` one rank of a tensor-parallel group (the communicator
// registered as `comm_id`; every rank trains on the same batches): the
// training and evaluation graphs are rewritten, the parameters held as
// slices, checkpoints whole.
// With sequence_parallel, shard_sequence after the split. A loss of the
// vocabulary-parallel head's logits becomes the vocabulary-parallel one, and
// the trainer counts right answers from it (ParamSlices::correct). In a
// pipeline or under gradient accumulation (in_pipeline: a step pass copies
// the forward once per micro-batch), the loss reads whole logits and each
// parameter the rows read gets its own tp_copy.
Status attach_tensor_parallel(train::TrainOptions& o, std::int64_t comm_id,
                              bool sequence_parallel = false, bool in_pipeline = false);

}  // namespace shoal::mp
