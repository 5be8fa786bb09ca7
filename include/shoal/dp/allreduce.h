// Data parallelism as a graph pass (first step): an "allreduce" graph op
// whose CPU kernel is asynchronous (it starts Communicator::allreduce_async
// in run() and the executor waits before the first consumer), and
// inject_allreduce(), which rewrites each gradient between autodiff and the
// optimizer update into allreduce(avg) of itself, latest gradient first so
// communication starts while the rest of the backward pass runs. Buckets
// (fusing small gradients into one buffer) are not done yet: one node per
// gradient.
#pragma once

#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/graph/graph.h"
#include "shoal/train/optim.h"

namespace shoal::dp {

// Registers the op and its kernel (idempotent).
void register_ops();
// Makes `c` reachable from graph attributes; returns its id. The
// communicator must outlive every executable that uses the id.
std::int64_t register_communicator(comm::Communicator* c);

// Replaces each ParamRef.grad with allreduce(grad, avg) over communicator
// `comm_id`. Matches train::TrainOptions::grad_pass.
Status inject_allreduce(graph::Graph& g, std::vector<train::ParamRef>& params,
                        std::int64_t comm_id);

}  // namespace shoal::dp
