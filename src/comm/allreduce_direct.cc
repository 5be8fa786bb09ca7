#include <cstring>
#include <vector>

#include "comm/algorithms.h"
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
Status direct_allreduce(Mesh& m, void* buf, std::size_t count, DType dt, ReduceOp op,
                        std::uint64_t fp) {
  const char* what = "allreduce (direct)";
  const std::size_t es = dtype_size(dt), n = static_cast<std::size_t>(m.size());
  struct Addr {
    std::uint64_t addr, bytes;
    net::SharedRef shared;  // id 0: private memory
  };
  Addr mine{reinterpret_cast<std::uintptr_t>(buf), count * es, {}};
  if (m.options().map_peers)
    if (auto r = net::find_shared(buf, count * es)) mine.shared = *r;
  std::vector<Addr> theirs(n);
  SHOAL_RETURN_IF_ERROR(m.exchange_all(&mine, sizeof mine, theirs.data(), fp, what));
  // Where each peer's buffer is mapped here (null: copy through CMA).
  std::vector<std::uint8_t*> mapped(n, nullptr);
  m.last_mapped = true;
  for (int q = 0; q < m.size(); ++q) {
    if (q == m.rank()) continue;
    const Addr& a = theirs[static_cast<std::size_t>(q)];
    if (a.bytes != mine.bytes)
      return failed_precondition("{} #{}: {} has {} bytes, this rank {}", what, m.seq,
                                 m.peer_name(q), a.bytes, mine.bytes);
    const net::SharedRef& r = a.shared;
    if (r.id != 0 && r.offset <= r.region_bytes && a.bytes <= r.region_bytes - r.offset)
      if (net::PeerMapping* pm = m.peer_mapping(q, r))
        mapped[static_cast<std::size_t>(q)] = pm->data() + r.offset;
    m.last_mapped = m.last_mapped && mapped[static_cast<std::size_t>(q)] != nullptr;
  }
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
  // Every part written everywhere. Plain stores into a peer's mapping are
  // ordered before this barrier's ring write (release) or socket send.
  std::vector<std::uint8_t> flags(n);
  std::uint8_t one = 1;
  return m.exchange_all(&one, 1, flags.data(), fp, what);
}

}  // namespace shoal::comm
