// Mesh::exchange: several framed sends and receives at once, over sockets
// and shared-memory rings, while every other peer is watched for an abort
// frame or a closed connection. Shaped like Gloo's Pair (prepareRead /
// read / write): each phase below is one function over the exchange's
// state.
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "comm/mesh.h"
#include "comm/reduce_internal.h"

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

bool finished(const Xfer& x) { return x.done == x.bytes + net::kHeaderBytes; }

bool retry(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

}  // namespace

// One call's working state.
struct Mesh::Exchange {
  Exchange(std::vector<Xfer>& x, std::uint64_t f, const char* w, Deadline d)
      : xs(x), fp(f), what(w), dl(d) {}
  std::vector<Xfer>& xs;
  std::uint64_t fp = 0, wseq = 0;
  const char* what = "";
  Deadline dl;
  std::vector<bool> watch;  // peers polled only for an abort or a close
  std::vector<bool> gone;   // shm peers that said goodbye mid-call
  std::vector<pollfd> fds;
  std::vector<int> who;  // per fd: index into xs, or -1 - peer for a watched one
  int idle = 0;          // rounds without progress
  std::chrono::steady_clock::time_point idle_since;
};

Status Mesh::exchange(std::vector<Xfer>& xs, std::uint64_t fp, const char* what) {
  Exchange e(xs, fp, what, deadline());
  for (const Xfer& x : xs)
    if (x.is_send) bytes_sent += x.bytes;
  arm(e);
  while (true) {
    bool progressed = false, shm_pending = false;
    SHOAL_RETURN_IF_ERROR(pump_shm(e, progressed, shm_pending));
    const bool sock_pending = poll_set(e);
    if (!sock_pending && !shm_pending) return ok_status();
    e.idle = progressed ? 0 : e.idle + 1;
    if (e.idle <= 1) e.idle_since = std::chrono::steady_clock::now();
    if (shm_pending && !sock_pending && e.idle < 64) continue;  // spin briefly on the rings
    for (int p = 0; p < world_; ++p)
      if (e.watch[static_cast<std::size_t>(p)]) {
        e.fds.push_back({peers_[static_cast<std::size_t>(p)].fd(), POLLIN, 0});
        e.who.push_back(-1 - p);
      }
    int ms = static_cast<int>(std::min<long long>(e.dl.remaining().count(), 1000));
    bool nap = false;
    if (shm_pending) {
      ms = 0;
      // Nothing moved for a while: sleep on a ring's doorbell (below) instead
      // of spinning, so the peer (or this rank's compute) gets the core.
      nap = !sock_pending && std::chrono::steady_clock::now() - e.idle_since >
                                 std::chrono::microseconds(o_.shm_spin_us);
      // Until then, offer the core to any other runnable rank (ranks
      // outnumbering cores): returns at once when there is none.
      if (!nap) sched_yield();
    } else if (std::chrono::steady_clock::now() - e.idle_since <
               std::chrono::microseconds(o_.socket_spin_us)) {
      // Only sockets pending and the wait still short: look again without
      // sleeping (a sleeping poll's wake-up costs ~20 us a message here).
      ms = 0;
      sched_yield();
    }
    const int rc = ::poll(e.fds.data(), e.fds.size(), ms);
    if (rc < 0 && errno != EINTR) return unavailable("poll: {}", std::strerror(errno));
    if (rc <= 0) {
      if (e.dl.expired()) return timed_out(e);
      if (nap) nap_on_ring(e);
      continue;
    }
    for (std::size_t k = 0; k < e.fds.size(); ++k) {
      if (e.fds[k].revents == 0) continue;
      if (e.who[k] < 0) {
        SHOAL_RETURN_IF_ERROR(on_watched(e, -1 - e.who[k]));
        continue;
      }
      Xfer& x = xs[static_cast<std::size_t>(e.who[k])];
      SHOAL_RETURN_IF_ERROR(x.is_send ? on_writable(e, x) : on_readable(e, x));
    }
  }
}

// Resets the transfers, writes the send headers, and watches every peer
// that has no transfer on a socket in this call.
void Mesh::arm(Exchange& e) {
  e.wseq = static_cast<std::uint8_t>(e.fp) == kSendRecv ? kP2pSeq : seq;
  for (auto& x : e.xs) {
    x.done = 0;
    x.header_done = false;
    x.applied = x.carry = 0;
    if (x.is_send) {
      net::FrameHeader h;
      h.type = static_cast<std::uint16_t>(net::FrameType::kData);
      h.length = x.bytes;
      h.seq = e.wseq;
      h.fingerprint = e.fp;
      net::encode_header(h, x.hdr);
    }
  }
  e.watch.assign(static_cast<std::size_t>(world_), true);
  e.watch[static_cast<std::size_t>(rank_)] = false;
  for (auto& x : e.xs)
    if (!is_shm(x.peer)) e.watch[static_cast<std::size_t>(x.peer)] = false;
  e.gone.assign(static_cast<std::size_t>(world_), false);
}

Status Mesh::fail_peer(const Exchange& e, int peer, const std::string& why) const {
  return unavailable("{} #{}: {} {}", e.what, seq, peers_[static_cast<std::size_t>(peer)].peer(),
                     why);
}

// A received header: abort, goodbye, or the data frame this call expects.
Status Mesh::check_header(const Exchange& e, Xfer& x) {
  net::Socket& s = peers_[static_cast<std::size_t>(x.peer)];
  auto h = net::decode_header(x.hdr, net::kMaxFrame, s.peer());
  if (!h.ok()) return h.status().with_context(fmt::format("{} #{}", e.what, seq));
  if (h->type == static_cast<std::uint16_t>(net::FrameType::kAbort))
    return aborted("{} #{}: {}", e.what, seq,
                   abort_message(x.peer, h->length, is_shm(x.peer), e.dl));
  if (h->type == static_cast<std::uint16_t>(net::FrameType::kGoodbye))
    return fail_peer(e, x.peer,
                     "shut down its communicator while this rank still waits for it "
                     "(the ranks' call sequences differ)");
  if (h->type != static_cast<std::uint16_t>(net::FrameType::kData))
    return fail_peer(e, x.peer, fmt::format("sent frame type {} during a collective", h->type));
  if (h->fingerprint != e.fp || h->seq != e.wseq)
    return failed_precondition("collective mismatch: rank {} called {} #{}, but {} called {} #{}",
                               rank_, describe_fingerprint(e.fp),
                               e.wseq == kP2pSeq ? std::string("p2p") : std::to_string(e.wseq),
                               s.peer(), describe_fingerprint(h->fingerprint),
                               h->seq == kP2pSeq ? std::string("p2p") : std::to_string(h->seq));
  if (h->length != x.bytes)
    return failed_precondition("{} #{}: {} sent {} bytes, this rank expects {}", e.what, seq,
                               s.peer(), h->length, x.bytes);
  return ok_status();
}

// Shared-memory transfers: copies what the rings allow, no system call.
// Sets `pending` when any is still pending and `progressed` when bytes
// moved. (A Status, not a Result<bool>: it runs on every spin of the loop.)
Status Mesh::pump_shm(Exchange& e, bool& progressed, bool& pending) {
  pending = false;
  for (auto& x : e.xs) {
    if (!is_shm(x.peer) || finished(x)) continue;
    net::ShmChannel& ch = *shm_[static_cast<std::size_t>(x.peer)];
    x.bell = (x.is_send ? ch.tx() : ch.rx()).bell();
    while (x.done < x.bytes + net::kHeaderBytes) {
      std::size_t n;
      const bool in_hdr = x.done < net::kHeaderBytes;
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
        SHOAL_RETURN_IF_ERROR(check_header(e, x));
    }
    if (!finished(x)) {
      if (e.gone[static_cast<std::size_t>(x.peer)] && !progressed)
        return fail_peer(e, x.peer,
                         "shut down its communicator while this rank still waits for "
                         "it (the ranks' call sequences differ)");
      pending = true;
    }
  }
  return ok_status();
}

// The poll set of the socket transfers still pending; whether there is one.
bool Mesh::poll_set(Exchange& e) {
  e.fds.clear();
  e.who.clear();
  for (std::size_t i = 0; i < e.xs.size(); ++i) {
    const Xfer& x = e.xs[i];
    if (is_shm(x.peer) || finished(x)) continue;
    e.fds.push_back({peers_[static_cast<std::size_t>(x.peer)].fd(),
                     static_cast<short>(x.is_send ? POLLOUT : POLLIN), 0});
    e.who.push_back(static_cast<int>(i));
  }
  return !e.fds.empty();
}

// The deadline passed: names the ranks that went silent (a frozen peer
// keeps its connection open, so only time tells) and what this rank waits
// for from each.
Status Mesh::timed_out(const Exchange& e) const {
  std::string waiting, silent;
  std::vector<bool> named(static_cast<std::size_t>(world_), false);
  for (const auto& x : e.xs) {
    if (x.done >= x.bytes + net::kHeaderBytes) continue;
    waiting += fmt::format("{}{} {}", waiting.empty() ? "" : ", ",
                           x.is_send ? "sending to" : "receiving from",
                           peers_[static_cast<std::size_t>(x.peer)].peer());
    if (named[static_cast<std::size_t>(x.peer)]) continue;
    named[static_cast<std::size_t>(x.peer)] = true;
    silent += fmt::format("{}rank {}", silent.empty() ? "" : ", ", x.peer);
  }
  return deadline_exceeded(
      "{} #{}: {} unresponsive: timed out after {:.0f} s {} (SHOAL_COMM_TIMEOUT)", e.what, seq,
      silent, o_.timeout_seconds, waiting);
}

// Sleeps on a pending ring's doorbell, a receive's first (its peer's next
// write wakes us); bounded, so dead or aborting peers (sockets) are still
// noticed.
void Mesh::nap_on_ring(const Exchange& e) {
  const Xfer* z = nullptr;
  for (const auto& x : e.xs) {
    if (!is_shm(x.peer) || finished(x)) continue;
    if (z == nullptr || (z->is_send && !x.is_send)) z = &x;
  }
  if (z == nullptr) return;
  net::ShmChannel& ch = *shm_[static_cast<std::size_t>(z->peer)];
  (z->is_send ? ch.tx() : ch.rx()).sleep(z->bell, 2000);
}

// A watched peer is readable: an abort frame fails the call; a close fails
// it; data for a later step or a clean goodbye is left for whoever reads
// it, and the peer is no longer watched in this call.
Status Mesh::on_watched(Exchange& e, int p) {
  net::Socket& s = peers_[static_cast<std::size_t>(p)];
  std::uint8_t hb[net::kHeaderBytes];
  const ssize_t n = ::recv(s.fd(), hb, sizeof hb, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return fail_peer(e, p, "closed the connection (process died?)");
  if (n == static_cast<ssize_t>(sizeof hb)) {
    auto h = net::decode_header(hb, 1 << 20, s.peer());
    const bool involved = std::any_of(e.xs.begin(), e.xs.end(), [&](const Xfer& x) {
      return x.peer == p && x.done < x.bytes + net::kHeaderBytes;
    });
    // A shared-memory peer that said goodbye may still have left our data
    // in the ring: fail only once its ring stops moving (pump_shm).
    if (h.ok() && involved && h->type == static_cast<std::uint16_t>(net::FrameType::kGoodbye))
      e.gone[static_cast<std::size_t>(p)] = true;
    if (h.ok() && h->type == static_cast<std::uint16_t>(net::FrameType::kAbort)) {
      (void)s.recv_all(hb, sizeof hb, e.dl);  // peeked
      return aborted("{} #{}: {}", e.what, seq, abort_message(p, h->length, false, e.dl));
    }
  }
  e.watch[static_cast<std::size_t>(p)] = false;
  return ok_status();
}

// A send's socket is writable: the header and payload in one sendmsg.
Status Mesh::on_writable(Exchange& e, Xfer& x) {
  net::Socket& s = peers_[static_cast<std::size_t>(x.peer)];
  iovec iov[2];
  int cnt = 0;
  if (x.done < net::kHeaderBytes) {
    iov[cnt++] = {x.hdr + x.done, net::kHeaderBytes - x.done};
    iov[cnt++] = {x.buf, x.bytes};
  } else {
    const std::size_t off = x.done - net::kHeaderBytes;
    iov[cnt++] = {bytes(x.buf) + off, x.bytes - off};
  }
  msghdr mh{};
  mh.msg_iov = iov;
  mh.msg_iovlen = static_cast<std::size_t>(cnt);
  const ssize_t n = ::sendmsg(s.fd(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0) {
    if (retry(errno)) return ok_status();
    return fail_peer(e, x.peer, fmt::format("send failed: {}", std::strerror(errno)));
  }
  x.done += static_cast<std::size_t>(n);
  return ok_status();
}

// A receive's socket is readable: the header first, checked, then the
// payload in place (or through the bounce buffer when it is reduced in).
Status Mesh::on_readable(Exchange& e, Xfer& x) {
  net::Socket& s = peers_[static_cast<std::size_t>(x.peer)];
  if (x.done < net::kHeaderBytes) {
    const ssize_t n = ::recv(s.fd(), x.hdr + x.done, net::kHeaderBytes - x.done, MSG_DONTWAIT);
    if (n == 0) return fail_peer(e, x.peer, "closed the connection (process died?)");
    if (n < 0) {
      if (retry(errno)) return ok_status();
      return fail_peer(e, x.peer, fmt::format("receive failed: {}", std::strerror(errno)));
    }
    x.done += static_cast<std::size_t>(n);
    if (x.done < net::kHeaderBytes) return ok_status();
    SHOAL_RETURN_IF_ERROR(check_header(e, x));
    if (x.bytes > 0) return ok_status();
  }
  const std::size_t off = x.done - net::kHeaderBytes;
  if (off == x.bytes) return ok_status();
  if (x.reduce) std::memcpy(bounce.data(), x.carry_bytes, x.carry);
  const ssize_t n = x.reduce ? ::recv(s.fd(), bounce.data() + x.carry,
                                      std::min(bounce.size() - 8, x.bytes - off), MSG_DONTWAIT)
                             : ::recv(s.fd(), bytes(x.buf) + off, x.bytes - off, MSG_DONTWAIT);
  if (n == 0) return fail_peer(e, x.peer, "closed the connection (process died?)");
  if (n < 0) {
    if (retry(errno)) return ok_status();
    return fail_peer(e, x.peer, fmt::format("receive failed: {}", std::strerror(errno)));
  }
  if (x.reduce) absorb(x, bounce.data(), static_cast<std::size_t>(n));
  x.done += static_cast<std::size_t>(n);
  return ok_status();
}

}  // namespace shoal::comm
