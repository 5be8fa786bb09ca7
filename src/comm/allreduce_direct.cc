#include <cstring>
#include <vector>

#include "comm/algorithms.h"
#include "comm/direct_peers.h"
#include "comm/reduce_internal.h"

namespace shoal::comm {

// Direct all-reduce between ranks on one host: every rank publishes its
// buffer's address; rank r reduces its 1/N of the elements by reading that
// part of every peer's buffer into its own, and writes each finished piece
// straight into every peer's buffer; a barrier ends the call once all parts
// are everywhere. A peer's buffer in shared memory (allocate_shared) is
// mapped once and read and written with plain loads and stores; any other
// is copied through process_vm_readv/writev, in 256 KiB pieces that stay
// in cache. One copy per byte moved instead of two through a ring (none
// when mapped), and no rank waits for a descheduled peer to push data,
// which matters when ranks outnumber cores. Each part is reduced by one
// rank in a fixed order (its owner's values, then the others by rank), so
// all ranks get the same bits, run after run, whichever way they reach
// their peers.
Result<DirectPeers> publish_buffers(Mesh& m, const void* buf, std::size_t bytes, std::uint64_t fp,
                                    const char* what) {
  const auto n = static_cast<std::size_t>(m.size());
  DirectPeers::Addr mine{reinterpret_cast<std::uintptr_t>(buf), bytes, {}};
  if (m.options().map_peers)
    if (auto r = net::find_shared(buf, bytes)) mine.shared = *r;
  DirectPeers p;
  p.theirs.resize(n);
  p.mapped.assign(n, nullptr);
  SHOAL_RETURN_IF_ERROR(m.exchange_all(&mine, sizeof mine, p.theirs.data(), fp, what));
  m.last_mapped = true;
  for (int q = 0; q < m.size(); ++q) {
    if (q == m.rank()) continue;
    const DirectPeers::Addr& a = p.theirs[static_cast<std::size_t>(q)];
    if (a.bytes != mine.bytes)
      return failed_precondition("{} #{}: {} has {} bytes, this rank {}", what, m.seq,
                                 m.peer_name(q), a.bytes, mine.bytes);
    const net::SharedRef& r = a.shared;
    if (r.id != 0 && r.offset <= r.region_bytes && a.bytes <= r.region_bytes - r.offset)
      if (net::PeerMapping* pm = m.peer_mapping(q, r))
        p.mapped[static_cast<std::size_t>(q)] = pm->data() + r.offset;
    m.last_mapped = m.last_mapped && p.mapped[static_cast<std::size_t>(q)] != nullptr;
  }
  return p;
}

Status direct_barrier(Mesh& m, std::uint64_t fp, const char* what) {
  std::vector<std::uint8_t> flags(static_cast<std::size_t>(m.size()));
  std::uint8_t one = 1;
  return m.exchange_all(&one, 1, flags.data(), fp, what);
}

Status direct_allreduce(Mesh& m, void* buf, std::size_t count, DType dt, ReduceOp op,
                        std::uint64_t fp) {
  const char* what = "allreduce (direct)";
  const std::size_t es = dtype_size(dt), n = static_cast<std::size_t>(m.size());
  SHOAL_ASSIGN_OR_RETURN(DirectPeers peers, publish_buffers(m, buf, count * es, fp, what));
  const std::vector<DirectPeers::Addr>& theirs = peers.theirs;
  const std::vector<std::uint8_t*>& mapped = peers.mapped;
  auto lo = [&](int r) { return count * static_cast<std::size_t>(r) / n * es; };
  const std::size_t piece = m.bounce.size() / 8 * 8;
  auto* base = static_cast<std::uint8_t*>(buf);
  for (std::size_t off = lo(m.rank()); off < lo(m.rank() + 1); off += piece) {
    const std::size_t len = std::min(piece, lo(m.rank() + 1) - off);
    for (int q = 0; q < m.size(); ++q) {
      if (q == m.rank()) continue;
      const std::uint8_t* src = mapped[static_cast<std::size_t>(q)];
      if (src != nullptr) {
        src += off;
      } else {
        SHOAL_RETURN_IF_ERROR(m.cma_copy(q, theirs[static_cast<std::size_t>(q)].addr + off,
                                         m.bounce.data(), len, false, what));
        src = m.bounce.data();
      }
      reduce_into(base + off, src, len / es, dt, op);
    }
    // Average while the piece is in cache (do_allreduce skips its pass).
    if (op == ReduceOp::kAvg) divide_by_size(base + off, len / es, dt, m.size());
    // The piece is final: put it into every peer's buffer too (nobody else
    // reads or writes that range of theirs).
    for (int q = 0; q < m.size(); ++q) {
      if (q == m.rank()) continue;
      if (std::uint8_t* dst = mapped[static_cast<std::size_t>(q)]) {
        std::memcpy(dst + off, base + off, len);
      } else {
        SHOAL_RETURN_IF_ERROR(m.cma_copy(q, theirs[static_cast<std::size_t>(q)].addr + off,
                                         base + off, len, true, what));
      }
    }
  }
  return direct_barrier(m, fp, what);  // every part written everywhere
}

}  // namespace shoal::comm
