// Turns a single-process train::TrainOptions into one rank of a
// data-parallel job over a Communicator: sets rank and world (the loader
// shards each epoch's permutation), installs inject_allreduce (or the ZeRO
// passes of dp/sharded.h) as the gradient pass, and gives the trainer its
// Peers (graph/build agreement, rank 0's weights broadcast at start, metrics
// summed, BN buffers averaged before evaluation and checkpoints). How data
// parallelism composes with tensor and pipeline parallelism is dist's
// (dist/layout.h): these are the pieces it composes.
#pragma once

#include <memory>

#include "shoal/comm/communicator.h"
#include "shoal/dp/allreduce.h"
#include "shoal/train/trainer.h"

namespace shoal::dp {

// The trainer's Peers over c. `c` must outlive them.
std::shared_ptr<train::Peers> peers(comm::Communicator& c);

// Every rank's (option, value) list, gathered whole and compared by name:
// a difference is an error naming the option and both values.
Status agree_options(comm::Communicator& c, const train::Peers::Options& options);
// d's settings as (flag, value), for agree_options.
train::Peers::Options named_options(const DpOptions& d);

// Data parallelism over every rank of `c`, the whole model on each. The
// ranks must have agreed on d (agree_options(named_options(d)) does). `c`
// must outlive the trainer built from `o`.
Status attach(train::TrainOptions& o, comm::Communicator& c, const DpOptions& d = {});

// Data parallelism over `group`: the ranks that hold the same part of a
// model another pass split (tensor slices, pipeline stages). Each part's
// gradients are all-reduced over the group on the compute thread, or
// sharded with ZeRO-1/2/3. ZeRO-3 replaces o.forward_pass (attach_zero3):
// a caller that installed one composes the two. Sets o.data_rank and
// o.data_world to the group's. `lead` logs.
Status attach_group(train::TrainOptions& o, comm::Communicator& group, const DpOptions& d,
                    bool lead);

// ZeRO-3 over `c`, registered as collective communicator `id`: sets
// o.forward_pass (every parameter read through an all-gather of its row
// blocks) and o.grad_pass (gathered again for the backward; each rank's row
// gradients become the global batch's mean).
Status attach_zero3(train::TrainOptions& o, comm::Communicator& c, std::int64_t id);

}  // namespace shoal::dp
