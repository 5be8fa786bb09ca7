// Mesh transport: point-to-point calls over exchange() (mesh_exchange.cc),
// the fold for non-powers of two, mapped peer buffers and cross-memory
// copies.
#include "comm/mesh.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "comm/reduce_internal.h"
#include "shoal/core/logging.h"

namespace shoal::comm {
namespace {

constexpr std::size_t kMaxMappingsPerPeer = 16;

}  // namespace

void Mesh::abort_peers(const Status& why) {
  std::string msg = fmt::format("rank {} aborted: {}", rank_, why.message());
  for (auto& p : peers_) {
    if (!p.valid()) continue;
    net::FrameHeader h;
    h.type = static_cast<std::uint16_t>(net::FrameType::kAbort);
    h.length = msg.size();
    (void)p.send_frame(h, msg.data(), Deadline::after(std::chrono::milliseconds(200)));
  }
}

void Mesh::cut() {
  for (auto& p : peers_)
    if (p.valid()) ::shutdown(p.fd(), SHUT_RDWR);
}

// The text of an abort frame whose header has been read, from where the
// header came: the peer's shared-memory ring or its socket (bounded: 1 MiB).
std::string Mesh::abort_message(int peer, std::uint64_t length, bool from_ring, Deadline dl) {
  std::string m(std::min<std::uint64_t>(length, 1 << 20), '\0');
  if (from_ring) {
    std::size_t got = 0;
    for (int spin = 0; got < m.size() && spin < 1000000 && !dl.expired(); ++spin)
      got += shm_[static_cast<std::size_t>(peer)]->rx().read_some(m.data() + got, m.size() - got);
    m.resize(got);
  } else {
    (void)peers_[static_cast<std::size_t>(peer)].recv_all(m.data(), m.size(), dl);
  }
  return m;
}

Status Mesh::sendrecv(int to, const void* s, std::size_t sb, int from, void* r, std::size_t rb,
                      std::uint64_t fp, const char* what) {
  std::vector<Xfer> xs;
  xs.push_back(Xfer{to, true, const_cast<void*>(s), sb, 0, false, {}});
  xs.push_back(Xfer{from, false, r, rb, 0, false, {}});
  return exchange(xs, fp, what);
}

Status Mesh::send_to(int to, const void* s, std::size_t sb, std::uint64_t fp, const char* what) {
  std::vector<Xfer> xs{Xfer{to, true, const_cast<void*>(s), sb, 0, false, {}}};
  return exchange(xs, fp, what);
}

Status Mesh::recv_from(int from, void* r, std::size_t rb, std::uint64_t fp, const char* what) {
  std::vector<Xfer> xs{Xfer{from, false, r, rb, 0, false, {}}};
  return exchange(xs, fp, what);
}

// Recursive doubling (MPICH's non-power-of-two fold): log2(n) exchanges of
// the whole buffer; best for small messages.
// MPICH's fold for non-powers of two: of the first 2*rem ranks (rem = n -
// the largest power of two p2 <= n), each even one hands its buffer to the
// odd one above it and sits the middle phase out. Returns this rank's place
// among the p2 that stay, or -1; fold_out gives the result back.
Result<int> Mesh::fold_in(void* buf, std::size_t count, DType dt, ReduceOp op, std::uint64_t fp,
                          const char* what) {
  const std::size_t bytes_n = count * dtype_size(dt);
  const int rem = world_ - fold_p2();
  scratch.resize(bytes_n);
  if (rank_ >= 2 * rem) return rank_ - rem;
  if (rank_ % 2 == 0) {
    SHOAL_RETURN_IF_ERROR(send_to(rank_ + 1, buf, bytes_n, fp, what));
    return -1;
  }
  SHOAL_RETURN_IF_ERROR(recv_from(rank_ - 1, scratch.data(), bytes_n, fp, what));
  reduce_into(buf, scratch.data(), count, dt, op);
  return rank_ / 2;
}

Status Mesh::fold_out(void* buf, std::size_t bytes_n, std::uint64_t fp, const char* what) {
  const int rem = world_ - fold_p2();
  if (rank_ >= 2 * rem) return ok_status();
  if (rank_ % 2 == 1) return send_to(rank_ - 1, buf, bytes_n, fp, what);
  return recv_from(rank_ + 1, buf, bytes_n, fp, what);
}

int Mesh::fold_p2() const {
  int p2 = 1;
  while (p2 * 2 <= world_) p2 *= 2;
  return p2;
}

// The real rank of place `nr` among the p2 ranks that stay after fold_in.
int Mesh::fold_rank(int nr) const {
  const int rem = world_ - fold_p2();
  return nr < rem ? nr * 2 + 1 : nr + rem;
}

Status Mesh::exchange_all(const void* mine, std::size_t bytes, void* theirs, std::uint64_t fp,
                          const char* what) {
  std::vector<Xfer> xs;
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    xs.push_back(Xfer{q, true, const_cast<void*>(mine), bytes, 0, false, {}});
    xs.push_back(
        Xfer{q, false, static_cast<std::uint8_t*>(theirs) + q * bytes, bytes, 0, false, {}});
  }
  return exchange(xs, fp, what);
}

Status Mesh::cma_copy(int peer, std::uint64_t remote, void* local, std::size_t bytes, bool to_peer,
                      const char* what) {
  auto* mine = static_cast<std::uint8_t*>(local);
  const pid_t pid = cma_pid_[static_cast<std::size_t>(peer)];
  while (bytes > 0) {
    iovec l{mine, bytes}, r{reinterpret_cast<void*>(remote), bytes};
    ssize_t n =
        to_peer ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return unavailable("{} #{}: {} the buffer of {}: {}", what, seq,
                         to_peer ? "writing" : "reading",
                         peers_[static_cast<std::size_t>(peer)].peer(),
                         n < 0 && errno == ESRCH ? "the process is gone (died?)"
                                                 : std::strerror(n < 0 ? errno : EIO));
    }
    mine += n;
    remote += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  return ok_status();
}

net::PeerMapping* Mesh::peer_mapping(int peer, const net::SharedRef& ref) {
  const auto key = std::make_pair(peer, ref.id);
  auto it = peer_maps_.find(key);
  if (it != peer_maps_.end()) return it->second.get();
  // Regions of one executable live as long as it does; a job that keeps
  // making new ones (re-compiles) should not pile up mappings, which keep
  // the peer's pages alive. Only this peer's oldest goes: ids count up per
  // process, so they compare within a peer only, and a call maps one region
  // per peer, so no mapping this call uses is dropped.
  const auto first = peer_maps_.lower_bound({peer, 0});  // ordered by (peer, id)
  std::size_t mine = 0;
  for (auto j = first; j != peer_maps_.end() && j->first.first == peer; ++j) ++mine;
  if (mine >= kMaxMappingsPerPeer) peer_maps_.erase(first);
  auto m = net::PeerMapping::open(cma_pid_[static_cast<std::size_t>(peer)], ref);
  if (!m.ok())
    SHOAL_LOG_WARN(
        "cannot map the shared buffer of {} ({}); its all-reduces copy through "
        "process_vm_readv instead",
        peers_[static_cast<std::size_t>(peer)].peer(), m.status().message());
  net::PeerMapping* got = m.ok() ? m->get() : nullptr;
  peer_maps_[key] = m.ok() ? std::move(*m) : nullptr;
  return got;
}

}  // namespace shoal::comm
