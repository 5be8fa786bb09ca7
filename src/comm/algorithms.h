// The all-reduce algorithms, free functions over a Mesh (its transport),
// each in its own file. In place on `buf`; `fp` is the call's fingerprint
// (every frame carries it, so ranks in different calls are told apart).
// Every one reduces each element in an order fixed by rank, so all ranks
// get the same bits.
#pragma once

#include <vector>

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

// The same for the other two (gather_scatter_direct.cc): reduce-scatter
// reads each rank's part from every peer's input; all-gather writes each
// rank's part into every peer's output. `recv` (reduce-scatter) or `send`
// (all-gather) may be this rank's part of the other buffer, or apart from it.
// off[r]..off[r + 1] is rank r's part (in elements); off.back() the total.
Status direct_reduce_scatter(Mesh& m, const void* send, void* recv,
                             const std::vector<std::size_t>& off, DType dt, ReduceOp op,
                             std::uint64_t fp);
Status direct_allgatherv(Mesh& m, const void* send, void* recv, const std::vector<std::size_t>& off,
                         DType dt, std::uint64_t fp);

}  // namespace shoal::comm
