// Turns a single-process train::TrainOptions into one rank of a
// data-parallel job over a Communicator: sets rank and world (the loader
// shards each epoch's permutation), installs inject_allreduce as the
// gradient pass, and gives the trainer its Peers (graph/build agreement,
// rank 0's weights broadcast at start, metrics summed, BN buffers averaged
// before evaluation and checkpoints).
#pragma once

#include "shoal/comm/communicator.h"
#include "shoal/dp/allreduce.h"
#include "shoal/train/trainer.h"

namespace shoal::dp {

// Whether `d`'s layout (--dp x --tp x --pp) fits a job of `ranks` ranks.
Status check_layout(const DpOptions& d, int ranks);

// `c` must outlive the trainer built from `o`.
Status attach(train::TrainOptions& o, comm::Communicator& c, const DpOptions& d = {});

}  // namespace shoal::dp
