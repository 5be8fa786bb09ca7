// Mesh transport: framed sends and receives over sockets and shared-memory
// rings, all peers polled at once; the fold for non-powers of two; mapped
// peer buffers and cross-memory copies.
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

// Reduces bounce[0, n) (after the xfer's carried partial element) into the
// xfer's buffer; keeps a trailing partial element for next time.
void absorb(Xfer& x, std::uint8_t* bounce, std::size_t n) {
  const std::size_t es = dtype_size(x.dt);
  std::size_t total = x.carry + n, whole = total - total % es;
  reduce_into(static_cast<std::uint8_t*>(x.buf) + x.applied, bounce, whole / es, x.dt, x.op);
  x.applied += whole;
  x.carry = total - whole;
  std::memcpy(x.carry_bytes, bounce + whole, x.carry);
}

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

Status Mesh::exchange(std::vector<Xfer>& xs, std::uint64_t fp, const char* what) {
  const std::uint64_t wseq = static_cast<std::uint8_t>(fp) == kSendRecv ? kP2pSeq : seq;
  Deadline dl = deadline();
  for (auto& x : xs) {
    x.done = 0;
    x.header_done = false;
    x.applied = x.carry = 0;
    if (x.is_send) {
      net::FrameHeader h;
      h.type = static_cast<std::uint16_t>(net::FrameType::kData);
      h.length = x.bytes;
      h.seq = wseq;
      h.fingerprint = fp;
      net::encode_header(h, x.hdr);
    }
  }
  std::vector<bool> watch(static_cast<std::size_t>(world_), true);
  watch[static_cast<std::size_t>(rank_)] = false;
  for (auto& x : xs)
    if (!is_shm(x.peer)) watch[static_cast<std::size_t>(x.peer)] = false;
  auto fail_peer = [&](int peer, const std::string& why) {
    return unavailable("{} #{}: {} {}", what, seq, peers_[static_cast<std::size_t>(peer)].peer(),
                       why);
  };
  // A received header: abort, goodbye, or the data frame this call expects.
  auto check_header = [&](Xfer& x) -> Status {
    net::Socket& s = peers_[static_cast<std::size_t>(x.peer)];
    auto h = net::decode_header(x.hdr, net::kMaxFrame, s.peer());
    if (!h.ok()) return h.status().with_context(fmt::format("{} #{}", what, seq));
    if (h->type == static_cast<std::uint16_t>(net::FrameType::kAbort))
      return aborted("{} #{}: {}", what, seq, abort_message(x.peer, h->length, is_shm(x.peer), dl));
    if (h->type == static_cast<std::uint16_t>(net::FrameType::kGoodbye))
      return fail_peer(x.peer,
                       "shut down its communicator while this rank still waits for it "
                       "(the ranks' call sequences differ)");
    if (h->type != static_cast<std::uint16_t>(net::FrameType::kData))
      return fail_peer(x.peer, fmt::format("sent frame type {} during a collective", h->type));
    if (h->fingerprint != fp || h->seq != wseq)
      return failed_precondition("collective mismatch: rank {} called {} #{}, but {} called {} #{}",
                                 rank_, describe_fingerprint(fp),
                                 wseq == kP2pSeq ? std::string("p2p") : std::to_string(wseq),
                                 s.peer(), describe_fingerprint(h->fingerprint),
                                 h->seq == kP2pSeq ? std::string("p2p") : std::to_string(h->seq));
    if (h->length != x.bytes)
      return failed_precondition("{} #{}: {} sent {} bytes, this rank expects {}", what, seq,
                                 s.peer(), h->length, x.bytes);
    return ok_status();
  };
  std::vector<pollfd> fds;
  std::vector<int> who;  // index into xs, or -1 - peer for watched ones
  std::vector<bool> gone(static_cast<std::size_t>(world_), false);
  int idle = 0;
  auto idle_since = std::chrono::steady_clock::now();
  while (true) {
    // Shared-memory transfers: copy what the rings allow, no system call.
    bool shm_pending = false, progressed = false;
    for (auto& x : xs) {
      if (!is_shm(x.peer) || x.done == x.bytes + net::kHeaderBytes) continue;
      net::ShmChannel& ch = *shm_[static_cast<std::size_t>(x.peer)];
      x.bell = (x.is_send ? ch.tx() : ch.rx()).bell();
      while (x.done < x.bytes + net::kHeaderBytes) {
        std::size_t n;
        bool in_hdr = x.done < net::kHeaderBytes;
        if (x.is_send) {
          n = in_hdr ? ch.tx().write_some(x.hdr + x.done, net::kHeaderBytes - x.done)
                     : ch.tx().write_some(bytes(x.buf) + (x.done - net::kHeaderBytes),
                                          x.bytes + net::kHeaderBytes - x.done);
        } else if (in_hdr) {
          n = ch.rx().read_some(x.hdr + x.done, net::kHeaderBytes - x.done);
        } else if (x.reduce) {
          std::memcpy(bounce.data(), x.carry_bytes, x.carry);
          n = ch.rx().read_some(bounce.data() + x.carry,
                                std::min(bounce.size() - 8, x.bytes + net::kHeaderBytes - x.done));
          if (n) absorb(x, bounce.data(), n);
        } else {
          n = ch.rx().read_some(bytes(x.buf) + (x.done - net::kHeaderBytes),
                                x.bytes + net::kHeaderBytes - x.done);
        }
        if (n == 0) break;
        progressed = true;
        x.done += n;
        if (!x.is_send && in_hdr && x.done == net::kHeaderBytes)
          SHOAL_RETURN_IF_ERROR(check_header(x));
      }
      if (x.done < x.bytes + net::kHeaderBytes) {
        if (gone[static_cast<std::size_t>(x.peer)] && !progressed)
          return fail_peer(x.peer,
                           "shut down its communicator while this rank still waits for "
                           "it (the ranks' call sequences differ)");
        shm_pending = true;
      }
    }
    fds.clear();
    who.clear();
    bool sock_pending = false;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const Xfer& x = xs[i];
      if (is_shm(x.peer) || x.done == x.bytes + net::kHeaderBytes) continue;
      sock_pending = true;
      fds.push_back({peers_[static_cast<std::size_t>(x.peer)].fd(),
                     static_cast<short>(x.is_send ? POLLOUT : POLLIN), 0});
      who.push_back(static_cast<int>(i));
    }
    if (!sock_pending && !shm_pending) return ok_status();
    idle = progressed ? 0 : idle + 1;
    if (idle <= 1) idle_since = std::chrono::steady_clock::now();
    if (shm_pending && !sock_pending && idle < 64) continue;  // spin briefly on the rings
    for (int p = 0; p < world_; ++p)
      if (watch[static_cast<std::size_t>(p)]) {
        fds.push_back({peers_[static_cast<std::size_t>(p)].fd(), POLLIN, 0});
        who.push_back(-1 - p);
      }
    int ms = static_cast<int>(std::min<long long>(dl.remaining().count(), 1000));
    bool nap = false;
    if (shm_pending) {
      ms = 0;
      // Nothing moved for a while: sleep on a ring's doorbell (below) instead
      // of spinning, so the peer (or this rank's compute) gets the core.
      nap = !sock_pending && std::chrono::steady_clock::now() - idle_since >
                                 std::chrono::microseconds(o_.shm_spin_us);
      // Until then, offer the core to any other runnable rank (ranks
      // outnumbering cores): returns at once when there is none.
      if (!nap) sched_yield();
    }
    int rc = ::poll(fds.data(), fds.size(), ms);
    if (rc < 0 && errno != EINTR) return unavailable("poll: {}", std::strerror(errno));
    if (rc <= 0) {
      if (dl.expired()) {
        // Name the ranks that went silent: a frozen (stopped, swapping,
        // livelocked) peer keeps its connection open, so only time tells.
        std::string waiting, silent;
        std::vector<bool> named(static_cast<std::size_t>(world_), false);
        for (const auto& x : xs) {
          if (x.done >= x.bytes + net::kHeaderBytes) continue;
          waiting += fmt::format("{}{} {}", waiting.empty() ? "" : ", ",
                                 x.is_send ? "sending to" : "receiving from",
                                 peers_[static_cast<std::size_t>(x.peer)].peer());
          if (named[static_cast<std::size_t>(x.peer)]) continue;
          named[static_cast<std::size_t>(x.peer)] = true;
          silent += fmt::format("{}rank {}", silent.empty() ? "" : ", ", x.peer);
        }
        return deadline_exceeded(
            "{} #{}: {} unresponsive: timed out after {:.0f} s {} (SHOAL_COMM_TIMEOUT)", what, seq,
            silent, o_.timeout_seconds, waiting);
      }
      if (nap) {
        // A pending receive's ring first: its peer's next write wakes us.
        const Xfer* z = nullptr;
        for (const auto& x : xs) {
          if (!is_shm(x.peer) || x.done == x.bytes + net::kHeaderBytes) continue;
          if (z == nullptr || (z->is_send && !x.is_send)) z = &x;
        }
        if (z != nullptr) {
          net::ShmChannel& ch = *shm_[static_cast<std::size_t>(z->peer)];
          // Bounded, so dead or aborting peers (sockets) are still noticed.
          (z->is_send ? ch.tx() : ch.rx()).sleep(z->bell, 2000);
        }
      }
      continue;
    }
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      if (who[k] < 0) {  // a watched peer: abort frame, or closed?
        int p = -1 - who[k];
        std::uint8_t hb[net::kHeaderBytes];
        ssize_t n = ::recv(fds[k].fd, hb, sizeof hb, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return fail_peer(p, "closed the connection (process died?)");
        if (n == static_cast<ssize_t>(sizeof hb)) {
          auto h = net::decode_header(hb, 1 << 20, peers_[static_cast<std::size_t>(p)].peer());
          bool involved = std::any_of(xs.begin(), xs.end(), [&](const Xfer& x) {
            return x.peer == p && x.done < x.bytes + net::kHeaderBytes;
          });
          // A shared-memory peer that said goodbye may still have left our data
          // in the ring: fail only once its ring stops moving (below).
          if (h.ok() && involved && h->type == static_cast<std::uint16_t>(net::FrameType::kGoodbye))
            gone[static_cast<std::size_t>(p)] = true;
          if (h.ok() && h->type == static_cast<std::uint16_t>(net::FrameType::kAbort)) {
            (void)peers_[static_cast<std::size_t>(p)].recv_all(hb, sizeof hb, dl);  // peeked
            return aborted("{} #{}: {}", what, seq, abort_message(p, h->length, false, dl));
          }
        }
        // Data for a later step, or a clean goodbye: leave it for whoever reads it.
        watch[static_cast<std::size_t>(p)] = false;
        continue;
      }
      Xfer& x = xs[static_cast<std::size_t>(who[k])];
      net::Socket& s = peers_[static_cast<std::size_t>(x.peer)];
      if (x.is_send) {
        iovec iov[2];
        int cnt = 0;
        if (x.done < net::kHeaderBytes) {
          iov[cnt++] = {x.hdr + x.done, net::kHeaderBytes - x.done};
          iov[cnt++] = {x.buf, x.bytes};
        } else {
          std::size_t off = x.done - net::kHeaderBytes;
          iov[cnt++] = {bytes(x.buf) + off, x.bytes - off};
        }
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = static_cast<std::size_t>(cnt);
        ssize_t n = ::sendmsg(s.fd(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
          return fail_peer(x.peer, fmt::format("send failed: {}", std::strerror(errno)));
        }
        x.done += static_cast<std::size_t>(n);
        continue;
      }
      // Receive: the header first, checked, then the payload in place.
      if (x.done < net::kHeaderBytes) {
        ssize_t n = ::recv(s.fd(), x.hdr + x.done, net::kHeaderBytes - x.done, MSG_DONTWAIT);
        if (n == 0) return fail_peer(x.peer, "closed the connection (process died?)");
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
          return fail_peer(x.peer, fmt::format("receive failed: {}", std::strerror(errno)));
        }
        x.done += static_cast<std::size_t>(n);
        if (x.done < net::kHeaderBytes) continue;
        SHOAL_RETURN_IF_ERROR(check_header(x));
        if (x.bytes > 0) continue;
      }
      std::size_t off = x.done - net::kHeaderBytes;
      if (off == x.bytes) continue;
      if (x.reduce) std::memcpy(bounce.data(), x.carry_bytes, x.carry);
      ssize_t n = x.reduce ? ::recv(s.fd(), bounce.data() + x.carry,
                                    std::min(bounce.size() - 8, x.bytes - off), MSG_DONTWAIT)
                           : ::recv(s.fd(), bytes(x.buf) + off, x.bytes - off, MSG_DONTWAIT);
      if (n == 0) return fail_peer(x.peer, "closed the connection (process died?)");
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return fail_peer(x.peer, fmt::format("receive failed: {}", std::strerror(errno)));
      }
      if (x.reduce) absorb(x, bounce.data(), static_cast<std::size_t>(n));
      x.done += static_cast<std::size_t>(n);
    }
  }
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
