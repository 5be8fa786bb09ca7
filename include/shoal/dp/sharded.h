// Sharded data parallelism, ZeRO stages 1 and 2 (Rajbhandari et al. 2020) as a
// graph pass: instead of all-reducing gradients and updating every
// parameter on every rank, the step's gradients (flattened into one vector
// of all parameters, in parameter order) are reduce-scattered, each rank
// updates only its contiguous shard of that vector with its shard of the
// optimizer state, and the updated shards are all-gathered back into the
// parameters. Optimizer state per rank falls as 1/N; the math is that of
// plain data parallelism (same global-batch mean gradient, same update).
// Shards are as even as N allows (the first total % N ranks hold one more
// element). Element-wise optimizers only: LARS and LAMB scale each layer
// by norms of the whole layer, which a shard cut through it does not have.
// Checkpoints hold the logical per-parameter state (OptimizerGraph::Layout),
// so a sharded run resumes into plain data parallelism, one process, or
// another N, and the reverse.
#pragma once

#include <cstdint>
#include <vector>

#include "shoal/graph/graph.h"
#include "shoal/train/optim.h"
#include "shoal/train/trainer.h"

namespace shoal::dp {

// Rank r's [offset, offset + size) of `total` elements split over `world`.
std::vector<std::int64_t> shard_sizes(std::int64_t total, int world);

// Builds the sharded update for `params` over communicator `comm_id`. Fits
// train::TrainOptions::update_pass. bucket_elements 0: ZeRO-1, one flat
// vector of every parameter, reduce-scattered after the backward pass.
// Otherwise ZeRO-2: the gradients, in the order the backward pass produces
// them, form buckets of up to bucket_elements; each bucket is flattened and
// reduce-scattered, updated as this rank's shard of it and all-gathered on
// its own, so no buffer of every parameter exists (ZeRO-1's flat gradient
// and flat gathered weights): the gradients a rank keeps are its shards.
// Each rank's optimizer state is its shard of every bucket (still 1/N, and
// the same logical tensors in checkpoints). `wire` f16/bf16: the gradients
// are cast to it before the reduce-scatter (half the bytes; each hop sums in
// f32 and rounds) and widened after; the parameters are gathered in f32, so
// every rank keeps the same f32 weights.
Result<train::OptimizerGraph> inject_sharded(graph::Builder& b,
                                             const std::vector<train::ParamRef>& params,
                                             const train::OptimizerOptions& o, std::int64_t comm_id,
                                             std::int64_t bucket_elements = 0,
                                             std::vector<std::int64_t>* shard_elements = nullptr,
                                             DType wire = DType::kF32);

// ZeRO-3 (FSDP's full sharding) as a rewrite of the forward graph: every
// parameter input becomes this rank's block of its rows (as even as N
// allows) and each use reads an all-gather of the blocks. Autodiff makes
// the gradient of each gather a reduce-scatter, so each rank receives the
// summed gradient of its rows only and updates them with its rows of the
// optimizer state: parameters, gradients and state per rank all fall as
// 1/N. The gathers are synchronous kernels appended after the forward, so
// the executor (smallest ready id first) runs each just before its first
// use, and the memory planner frees the whole tensor after its last.
struct Zero3Gather {
  std::string name;  // the parameter, without "param/"
  graph::Value shard, whole;
  std::vector<std::int64_t> sizes;  // rows per rank
};
// Rewrites `g` for communicator `comm_id`; the slices cut and gather whole
// tensors for checkpoints, and evaluation uses the whole parameters.
Result<train::TrainOptions::ParamSlices> shard_parameters(graph::Graph& g, std::int64_t comm_id,
                                                          std::vector<Zero3Gather>* gathers);
// After autodiff: the backward's uses of each gathered parameter (nodes
// from `forward_end` on) read a second gather instead, so the whole tensor
// is not kept alive from the forward to the backward.
Status regather_for_backward(graph::Graph& g, int forward_end,
                             const std::vector<Zero3Gather>& gathers, std::int64_t comm_id);

}  // namespace shoal::dp
