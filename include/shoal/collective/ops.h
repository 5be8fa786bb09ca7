// Collective operations as graph ops with gradient rules: the pieces data,
// tensor, pipeline and sharded data parallelism are built from, below every
// strategy. Each runs over a communicator registered with
// collective::register_communicator (collective/registry.h), named by the
// node's "comm" attribute; `sizes` are every rank's rows along the first
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
//   allreduce_bucket(x1..xn): every xi averaged ("op" avg) or summed
//                      ("op" sum) over the ranks, packed into one buffer of
//                      the "wire" dtype (f32, f16, bf16); asynchronous when
//                      the communicator was registered with overlap.
//                      Gradient: the same all-reduce of the dy.
// Every rank must build the same collectives in the same order; a mismatch
// fails on the communicator's checks.
#pragma once

#include <cstdint>
#include <vector>

#include "shoal/graph/builder.h"

namespace shoal::collective {

// Registers every op of this header and its CPU kernel (idempotent; the
// builders below call it).
void register_ops();

graph::Value allgather(graph::Builder& b, graph::Value x, std::int64_t comm,
                       const std::vector<std::int64_t>& sizes);
graph::Value reduce_scatter(graph::Builder& b, graph::Value x, std::int64_t comm,
                            const std::vector<std::int64_t>& sizes);

graph::Value broadcast(graph::Builder& b, graph::Value x, std::int64_t comm, int root);
graph::Value reduce(graph::Builder& b, graph::Value x, std::int64_t comm, int root);

graph::Value scatter(graph::Builder& b, graph::Value x, std::int64_t comm, int root,
                     const std::vector<std::int64_t>& sizes);
graph::Value gather(graph::Builder& b, graph::Value x, std::int64_t comm, int root,
                    const std::vector<std::int64_t>& sizes);

// Registers allreduce_bucket alone (register_ops does too).
void register_bucket_allreduce();

}  // namespace shoal::collective
