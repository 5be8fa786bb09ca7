// Direct reduce-scatter and all-gather between ranks of one host: the
// direct all-reduce (allreduce_direct.cc) for the other two collectives.
// One exchange of buffer addresses; then each rank reads its part of every
// peer's input (reduce-scatter) or writes its part into every peer's output
// (all-gather), through a mapping when the buffer lies in shared memory,
// else through cross-memory attach; then one closing barrier. A ring takes
// n - 1 exchanges, each waiting for a neighbour, which on a host with more
// ranks than cores is often descheduled: tensor parallelism's sequence-
// parallel collectives spent most of a 4-rank step on 2 cores there.
#include <algorithm>
#include <cstring>

#include "comm/algorithms.h"
#include "comm/direct_peers.h"
#include "comm/reduce_internal.h"

namespace shoal::comm {

Status direct_reduce_scatter(Mesh& m, const void* send, void* recv,
                             const std::vector<std::size_t>& off, DType dt, ReduceOp op,
                             std::uint64_t fp) {
  const char* what = "reduce_scatter (direct)";
  const std::size_t es = dtype_size(dt);
  SHOAL_ASSIGN_OR_RETURN(DirectPeers peers, publish_buffers(m, send, off.back() * es, fp, what));
  const auto me = static_cast<std::size_t>(m.rank());
  const std::size_t begin = off[me] * es, bytes = (off[me + 1] - off[me]) * es;
  auto* out = static_cast<std::uint8_t*>(recv);
  // This rank's part: its own values first, then every peer's by rank (the
  // same order on every run, whichever way a peer is reached).
  if (bytes && out != static_cast<const std::uint8_t*>(send) + begin)
    std::memmove(out, static_cast<const std::uint8_t*>(send) + begin, bytes);
  const std::size_t piece = m.bounce.size() / 8 * 8;
  for (std::size_t at = 0; at < bytes; at += piece) {
    const std::size_t len = std::min(piece, bytes - at);
    for (int q = 0; q < m.size(); ++q) {
      if (q == m.rank()) continue;
      const std::uint8_t* src = peers.mapped[static_cast<std::size_t>(q)];
      if (src != nullptr) {
        src += begin + at;
      } else {
        SHOAL_RETURN_IF_ERROR(
            m.cma_copy(q, peers.theirs[static_cast<std::size_t>(q)].addr + begin + at,
                       m.bounce.data(), len, false, what));
        src = m.bounce.data();
      }
      reduce_into(out + at, src, len / es, dt, op);
    }
    if (op == ReduceOp::kAvg) divide_by_size(out + at, len / es, dt, m.size());
  }
  return direct_barrier(m, fp, what);  // no rank reads another's input after this
}

Status direct_allgatherv(Mesh& m, const void* send, void* recv, const std::vector<std::size_t>& off,
                         DType dt, std::uint64_t fp) {
  const char* what = "allgather (direct)";
  const std::size_t es = dtype_size(dt);
  SHOAL_ASSIGN_OR_RETURN(DirectPeers peers, publish_buffers(m, recv, off.back() * es, fp, what));
  const auto me = static_cast<std::size_t>(m.rank());
  const std::size_t begin = off[me] * es, bytes = (off[me + 1] - off[me]) * es;
  auto* out = static_cast<std::uint8_t*>(recv);
  const auto* mine = static_cast<const std::uint8_t*>(send);
  if (bytes && out + begin != mine) std::memmove(out + begin, mine, bytes);
  // This rank's part into every peer's output (nobody else writes that range).
  for (int q = 0; q < m.size() && bytes; ++q) {
    if (q == m.rank()) continue;
    if (std::uint8_t* dst = peers.mapped[static_cast<std::size_t>(q)]) {
      std::memcpy(dst + begin, out + begin, bytes);
    } else {
      SHOAL_RETURN_IF_ERROR(m.cma_copy(q, peers.theirs[static_cast<std::size_t>(q)].addr + begin,
                                       out + begin, bytes, true, what));
    }
  }
  return direct_barrier(m, fp, what);  // every part written everywhere
}

}  // namespace shoal::comm
