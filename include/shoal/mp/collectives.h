// Collective operations as graph ops with gradient rules (issue 16): the
// pieces tensor, pipeline and sharded data parallelism are built from. Each
// runs over a communicator registered with dp::register_communicator (the
// job's world, or a group from Communicator::split), named by the node's
// "comm" attribute; `sizes` are every rank's rows along the first
// dimension, in rank order, and need not be equal.
//   allgather(x):      x [sizes[rank], ...] -> [sum(sizes), ...], the ranks'
//                      blocks in rank order. Gradient: reduce_scatter(dy).
//   reduce_scatter(x): x [sum(sizes), ...] -> [sizes[rank], ...], block
//                      `rank` of the sum over ranks. Gradient: allgather(dy).
//   broadcast(x):      every rank gets the root's x (the others' x are
//                      ignored). Gradient: reduce(dy) to the root.
//   reduce(x):         the root gets the sum of every rank's x, the others
//                      zeros. Gradient: broadcast(dy) from the root.
//   scatter(x):        rank r gets block r (sizes[r] rows) of the root's x
//                      [sum(sizes), ...] (the others' x are ignored).
//                      Gradient: gather(dy) to the root.
//   gather(x):         the root gets every rank's x [sizes[r], ...] stacked
//                      in rank order, the others zeros [sum(sizes), ...].
//                      Gradient: scatter(dy) from the root.
// Every rank must build the same collectives in the same order (as with
// the all-reduce buckets); a mismatch fails on the communicator's checks.
#pragma once

#include <cstdint>
#include <vector>

#include "shoal/graph/builder.h"

namespace shoal::mp {

void register_collective_ops();

graph::Value allgather(graph::Builder& b, graph::Value x, std::int64_t comm,
                       const std::vector<std::int64_t>& sizes);
graph::Value reduce_scatter(graph::Builder& b, graph::Value x, std::int64_t comm,
                            const std::vector<std::int64_t>& sizes);

void register_rooted_ops();
graph::Value broadcast(graph::Builder& b, graph::Value x, std::int64_t comm, int root);
graph::Value reduce(graph::Builder& b, graph::Value x, std::int64_t comm, int root);

void register_dealt_ops();
graph::Value scatter(graph::Builder& b, graph::Value x, std::int64_t comm, int root,
                     const std::vector<std::int64_t>& sizes);
graph::Value gather(graph::Builder& b, graph::Value x, std::int64_t comm, int root,
                    const std::vector<std::int64_t>& sizes);

}  // namespace shoal::mp
