// The all-reduce tuner's cost model where a job spans hosts: every
// algorithm priced step by step with the link each step's messages cross
// (a host's own memory, or its network link shared by the host's ranks
// that cross in that step), the two-level layout included. Pure arithmetic
// over constants every rank agrees on, so every rank makes the same choice.
#ifndef SHOAL_COMM_TUNER_H_
#define SHOAL_COMM_TUNER_H_

#include <cstddef>
#include <vector>

#include "shoal/comm/communicator.h"

namespace shoal::comm {

// t = alpha + bytes * beta: one message between two ranks.
struct LinkCost {
  double alpha = 0, beta = 0;
  double time(double bytes) const { return alpha + bytes * beta; }
};

struct Topology {
  std::vector<int> host;              // host index of each rank
  LinkCost cross;                     // between hosts, one flow on a host's link
  LinkCost local;                     // between ranks of one host
  bool uniform = false;               // every host runs as many ranks (the sliced form)
  std::size_t piece_bytes = 4 << 20;  // the sliced form's pipeline piece
};

struct Priced {
  Algorithm algo = Algorithm::kRing;
  double seconds = 0;
};

// Seconds of one all-reduce of `bytes` (`count` elements) by `algo` (ring,
// rd, hd, or kHierarchical) over `t`.
double allreduce_seconds(const Topology& t, Algorithm algo, std::size_t bytes, std::size_t count);

// The cheapest of ring, recursive doubling, halving-doubling and the
// two-level form for `bytes` over `t`.
Priced cheapest_allreduce(const Topology& t, std::size_t bytes, std::size_t count);

}  // namespace shoal::comm

#endif  // SHOAL_COMM_TUNER_H_
