// train::Peers for the workers of a parameter-server job, over the job's
// rendezvous store (workers share no communicator: in async jobs they come
// and go). In sync jobs worker 0 leads: its options and its tensors are
// what the others check and copy; in async jobs the first worker to write
// leads (any worker may be gone). Sums and averages are collective only in
// sync jobs (a fixed quorum); in async jobs each worker keeps its own (a
// sum over workers that may have left would never finish). Private to ps.
#pragma once

#include <memory>

#include "shoal/net/store.h"
#include "shoal/train/trainer.h"

namespace shoal::ps {

std::shared_ptr<train::Peers> make_store_peers(net::Store& store, int worker, int workers,
                                               bool collective, double timeout_s);

}  // namespace shoal::ps
