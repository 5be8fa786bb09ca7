// Sharded data parallelism, ZeRO stage 1 (Rajbhandari et al. 2020) as a
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

#include "shoal/train/optim.h"

namespace shoal::dp {

// Rank r's [offset, offset + size) of `total` elements split over `world`.
std::vector<std::int64_t> shard_sizes(std::int64_t total, int world);

// Builds the sharded update for `params` over communicator `comm_id` (this
// process being `rank` of `world`). Fits train::TrainOptions::update_pass.
Result<train::OptimizerGraph> inject_sharded(graph::Builder& b,
                                             const std::vector<train::ParamRef>& params,
                                             const train::OptimizerOptions& o,
                                             std::int64_t comm_id);

}  // namespace shoal::dp
