// The all-reduce algorithms, free functions over a Mesh (its transport),
// each in its own file. In place on `buf`; `fp` is the call's fingerprint
// (every frame carries it, so ranks in different calls are told apart).
// Every one reduces each element in an order fixed by rank, so all ranks
// get the same bits.
#pragma once

#include "comm/mesh.h"

namespace shoal::comm {

// Reduce-scatter then allgather around the ring: 2(p-1) steps of n/p.
Status ring_allreduce(Mesh& m, void* buf, std::size_t count, DType dt, ReduceOp op,
                      std::uint64_t fp);
// Recursive doubling: log2(p) exchanges of the whole buffer (small messages).
Status rd_allreduce(Mesh& m, void* buf, std::size_t count, DType dt, ReduceOp op, std::uint64_t fp);
// Recursive halving-doubling (Rabenseifner).
Status hd_allreduce(Mesh& m, void* buf, std::size_t count, DType dt, ReduceOp op, std::uint64_t fp);
// Ranks of one host read and write each other's buffers (mapped or CMA).
Status direct_allreduce(Mesh& m, void* buf, std::size_t count, DType dt, ReduceOp op,
                        std::uint64_t fp);

}  // namespace shoal::comm
