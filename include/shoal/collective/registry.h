// The communicators a graph's collective ops run over. A pass registers a
// live Communicator (the job's world, or a group from Communicator::split)
// and writes the returned id into its nodes' "comm" attribute; the kernels
// look the id up when the graph is compiled. Below every strategy: data,
// tensor and pipeline parallelism all name their groups this way.
#pragma once

#include <cstdint>

#include "shoal/comm/communicator.h"

namespace shoal::collective {

// Makes `c` reachable from graph attributes; returns its id. The
// communicator must outlive every executable that uses the id. With
// `overlap` the bucket all-reduce kernels are asynchronous: each all-reduce
// runs on the communicator's progress thread while the backward pass goes
// on, and the first update that reads the bucket waits for it. Without, the
// compute thread runs each all-reduce itself when the bucket is complete:
// better when every core of the host computes (no core is left for the
// progress thread, so overlap only adds thread hand-offs; see
// docs/data-parallel.md). The choice is the executable's, not the graph's:
// ranks may differ in it.
std::int64_t register_communicator(comm::Communicator* c, bool overlap = true);
// The communicator registered as `id`, or null.
comm::Communicator* communicator(std::int64_t id);
// Whether `id` was registered with overlap (false for an unknown id).
bool overlapped(std::int64_t id);

}  // namespace shoal::collective
