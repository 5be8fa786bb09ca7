// The frame server: see frame_server.h. The wire format and the
// handshake are in docs/launch.md (security model).
#include "shoal/net/frame_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "net/in_buffer.h"
#include "shoal/core/logging.h"
#include "shoal/net/auth.h"

namespace shoal::net {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kMaxHandshakeFrame = 256;

Clock::time_point after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The address part of "host:port" / "[v6]:port": what per-address limits count.
std::string address_of(const std::string& peer) {
  std::size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

struct Conn {
  enum class Phase { kHello, kProof, kServing };
  Socket sock;
  std::string peer, addr;
  InBuffer in;
  std::size_t frame_rest = 0;  // bytes the frame begun in `in` still lacks
  std::string out;
  std::size_t out_pos = 0;
  Phase phase = Phase::kHello;
  std::string client_nonce, server_nonce;
  Clock::time_point handshake_until{}, frame_until{}, reply_until{};
  bool frame_begun = false, close_after_flush = false, dead = false;
};

using Parts = std::span<const std::string_view>;

void encode_frame_header(FrameType type, std::uint64_t seq, Parts parts,
                         std::uint8_t (&hb)[kHeaderBytes]) {
  FrameHeader h;
  h.type = static_cast<std::uint16_t>(type);
  h.seq = seq;
  for (auto p : parts) h.length += p.size();
  encode_header(h, hb);
}

// Queues (copies) a frame of `parts` but its first `skip` bytes (sent).
void queue_frame(Conn& c, FrameType type, std::uint64_t seq, Parts parts, std::size_t skip = 0) {
  std::uint8_t hb[kHeaderBytes];
  encode_frame_header(type, seq, parts, hb);
  auto queue = [&](const char* p, std::size_t len) {
    const std::size_t k = std::min(skip, len);
    skip -= k;
    c.out.append(p + k, len - k);
  };
  queue(reinterpret_cast<const char*>(hb), kHeaderBytes);
  for (auto p : parts) queue(p.data(), p.size());
}
void queue_frame(Conn& c, FrameType type, std::uint64_t seq, std::string_view payload) {
  queue_frame(c, type, seq, Parts(&payload, 1));
}

// Sends what the socket takes now; false when the connection is gone.
bool flush(Conn& c) {
  while (c.out_pos < c.out.size()) {
    ssize_t n = ::send(c.sock.fd(), c.out.data() + c.out_pos, c.out.size() - c.out_pos,
                       MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    return false;
  }
  c.out.clear();
  c.out_pos = 0;
  return !c.close_after_flush;
}

// Reads what the socket has now into place (bounded per wake, so one fast
// client cannot starve the loop); false on EOF or error.
bool fill(Conn& c) {
  constexpr std::size_t kChunk = 256 << 10, kPerWake = 4 << 20;
  for (std::size_t got = 0; got < kPerWake;) {
    const std::size_t room = c.in.make_room(std::max(kChunk, c.frame_rest));
    ssize_t n = ::recv(c.sock.fd(), c.in.tail(), std::min(room, kPerWake - got), MSG_DONTWAIT);
    if (n > 0) {
      c.in.commit(static_cast<std::size_t>(n));
      got += static_cast<std::size_t>(n);
      c.frame_rest -= std::min(c.frame_rest, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    return false;
  }
  return true;
}

// Sends a frame of `parts` straight from their memory while the socket
// takes it, then queues (copies) the rest: for a reply when nothing is
// queued before it. False when the connection is gone.
bool send_direct(Conn& c, FrameType type, std::uint64_t seq, Parts parts) {
  constexpr std::size_t kMaxParts = 7;
  if (parts.size() > kMaxParts) {
    queue_frame(c, type, seq, parts);
    return true;
  }
  std::uint8_t hb[kHeaderBytes];
  encode_frame_header(type, seq, parts, hb);
  iovec iov[kMaxParts + 1];
  std::size_t n_iov = 0, total = kHeaderBytes, sent = 0;
  iov[n_iov++] = {hb, kHeaderBytes};
  for (auto p : parts) {
    iov[n_iov++] = {const_cast<char*>(p.data()), p.size()};
    total += p.size();
  }
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = n_iov;
  while (sent < total) {
    ssize_t n = ::sendmsg(c.sock.fd(), &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
    for (auto k = static_cast<std::size_t>(n); k > 0;) {  // past what went
      const std::size_t take = std::min(k, m.msg_iov->iov_len);
      m.msg_iov->iov_base = static_cast<char*>(m.msg_iov->iov_base) + take;
      m.msg_iov->iov_len -= take;
      k -= take;
      if (m.msg_iov->iov_len == 0 && m.msg_iovlen > 1) {
        ++m.msg_iov;
        --m.msg_iovlen;
      }
    }
  }
  if (sent < total) queue_frame(c, type, seq, parts, sent);
  return true;
}

}  // namespace

// One server's loop state; FrameServer::serve drives it.
class FrameServer::Loop {
 public:
  Loop(FrameServer& server)
      : server_(server),
        token_(server.token_),
        name_(server.name_),
        limits_(server.limits_),
        handler_(server.handler_),
        refused_(server.refused_) {}

  void admit(Socket s) {
    std::string peer = s.peer(), addr = address_of(peer);
    int same = 0, unproven = 0;
    for (const auto& [id, c] : conns_) {
      if (c.addr != addr) continue;
      ++same;
      if (c.phase != Conn::Phase::kServing) ++unproven;
    }
    std::string why;
    if (static_cast<int>(conns_.size()) >= limits_.max_clients)
      why = fmt::format("{} connections open, the limit", conns_.size());
    else if (same >= limits_.max_clients_per_address)
      why = fmt::format("{} connections from {} open, the per-address limit", same, addr);
    else if (unproven >= limits_.max_unproven_per_address)
      why = fmt::format("{} connections from {} still in the handshake, the limit", unproven, addr);
    if (!why.empty()) {
      refuse(peer, why);
      return;  // closed as `s` goes out of scope
    }
    Conn c;
    c.sock = std::move(s);
    c.peer = peer;
    c.addr = addr;
    c.handshake_until = after(limits_.handshake_seconds);
    conns_.emplace(next_id_++, std::move(c));
  }

  // Reads, parses and answers what each ready connection sent.
  void on_ready(std::uint64_t id, short revents) {
    Conn& c = conns_.at(id);
    if (revents & POLLOUT) c.dead = c.dead || !flush(c);
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
      bool open = fill(c);
      parse(id, c);
      if (!open) c.dead = true;
    }
  }

  // Drops connections whose own deadline passed.
  void expire() {
    const auto now = Clock::now();
    for (auto& [id, c] : conns_) {
      if (c.dead) continue;
      if (c.phase != Conn::Phase::kServing && now > c.handshake_until)
        drop(c, fmt::format("did not finish the handshake within {:.0f} s",
                            limits_.handshake_seconds));
      else if (c.frame_begun && now > c.frame_until)
        drop(c, fmt::format("began a frame and did not finish it within {:.0f} s",
                            limits_.io_seconds));
      else if (!c.out.empty() && now > c.reply_until)
        drop(c, fmt::format("did not read its replies within {:.0f} s", limits_.io_seconds));
    }
  }

  void reap() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (!it->second.dead) {
        ++it;
        continue;
      }
      const ConnId id = it->first;
      const bool served = it->second.phase == Conn::Phase::kServing;
      it = conns_.erase(it);
      if (served) handler_->on_close(server_, id);
    }
  }

  std::map<std::uint64_t, Conn>& conns() { return conns_; }

  void reply_to(ConnId id, FrameType type, std::uint64_t seq, Parts parts) {
    auto it = conns_.find(id);
    if (it != conns_.end() && !it->second.dead) reply(it->second, type, seq, parts);
  }
  std::string peer_of(ConnId id) const {
    auto it = conns_.find(id);
    return it == conns_.end() ? std::string() : it->second.peer;
  }
  // Every client closes (the server stops).
  void close_all() {
    for (auto& [id, c] : conns_) c.dead = true;
    reap();
  }

 private:
  void refuse(const std::string& peer, const std::string& why) {
    ++refused_;
    std::uint64_t held = 0;
    if (refusals_.take(&held))
      SHOAL_LOG_WARN("{}: refused the client at {}: {}{}", name_, peer, why,
                     held ? fmt::format(" ({} more refused since the last such line)", held) : "");
  }
  void drop(Conn& c, const std::string& why) {
    refuse(c.peer, why);
    c.dead = true;
  }
  void reply(Conn& c, FrameType type, std::uint64_t seq, std::string_view payload) {
    reply(c, type, seq, Parts(&payload, 1));
  }
  void reply(Conn& c, FrameType type, std::uint64_t seq, Parts parts) {
    if (c.out.empty()) {
      c.reply_until = after(limits_.io_seconds);
      if (!send_direct(c, type, seq, parts)) {
        c.dead = true;
        return;
      }
    } else {
      queue_frame(c, type, seq, parts);
    }
    if (c.out.size() - c.out_pos > limits_.max_reply_backlog)
      drop(c, fmt::format("left {} bytes of replies unread", c.out.size() - c.out_pos));
    else if (!flush(c))
      c.dead = true;
  }

  void parse(std::uint64_t id, Conn& c) {
    std::size_t pos = 0;
    while (!c.dead && c.in.size() - pos >= kHeaderBytes) {
      const std::uint64_t bound =
          c.phase == Conn::Phase::kServing ? limits_.max_request_bytes : kMaxHandshakeFrame;
      auto h = decode_header(
          {reinterpret_cast<const std::uint8_t*>(c.in.data() + pos), kHeaderBytes}, bound, c.peer);
      if (!h.ok()) {
        drop(c, h.status().message());
        break;
      }
      if (c.in.size() - pos - kHeaderBytes < h->length) {
        c.frame_rest = kHeaderBytes + h->length - (c.in.size() - pos);
        if (!c.frame_begun) c.frame_until = after(limits_.io_seconds);
        c.frame_begun = true;
        break;
      }
      std::string_view body(c.in.data() + pos + kHeaderBytes, h->length);
      handle(id, c, *h, body);
      pos += kHeaderBytes + h->length;
      c.frame_begun = false;
    }
    if (!c.frame_begun && c.in.size() > pos && !c.dead) {
      c.frame_until = after(limits_.io_seconds);  // a header begun
      c.frame_begun = true;
    }
    c.in.consume(pos);
  }

  void handle(std::uint64_t id, Conn& c, const FrameHeader& h, std::string_view body) {
    const auto type = static_cast<FrameType>(h.type);
    if (c.phase == Conn::Phase::kHello) {
      if (type != FrameType::kHello || body.size() != kNonceBytes)
        return drop(c, fmt::format("sent frame type {} ({} bytes) instead of a hello", h.type,
                                   body.size()));
      c.client_nonce = std::string(body);
      c.server_nonce = make_nonce();
      c.phase = Conn::Phase::kProof;
      return reply(c, FrameType::kChallenge, 0,
                   c.server_nonce + store_proof(token_, 'S', c.client_nonce, c.server_nonce));
    }
    if (c.phase == Conn::Phase::kProof) {
      if (type != FrameType::kProof ||
          !mac_equal(body, store_proof(token_, 'C', c.client_nonce, c.server_nonce))) {
        queue_frame(c, FrameType::kStoreError, 0, "this client does not hold the job's token");
        (void)flush(c);
        return drop(c, "it does not hold this job's token (SHOAL_JOB_TOKEN differs)");
      }
      c.phase = Conn::Phase::kServing;
      return reply(c, FrameType::kProof, 0, "");
    }
    std::string why = handler_->on_request(server_, id, h, body);
    if (!why.empty()) drop(c, why);
  }

  FrameServer& server_;
  const std::string& token_;
  const std::string& name_;
  const ServerLimits& limits_;
  Handler* handler_;
  std::atomic<int>& refused_;
  log::LineBudget refusals_;  // one line per refusal, up to a burst per period
  std::map<std::uint64_t, Conn> conns_;
  std::uint64_t next_id_ = 1;
};

Result<std::unique_ptr<FrameServer>> FrameServer::start(const std::string& host, int port,
                                                        const std::string& token, Handler* handler,
                                                        ServerLimits limits, std::string name) {
  SHOAL_RETURN_IF_ERROR(init_crypto());
  std::unique_ptr<FrameServer> s(new FrameServer());
  SHOAL_ASSIGN_OR_RETURN(s->listener_, Socket::listen(host, port));
  SHOAL_ASSIGN_OR_RETURN(s->port_, s->listener_.local_port());
  SHOAL_ASSIGN_OR_RETURN(s->host_, s->listener_.local_host());
  s->token_ = token;
  s->limits_ = limits;
  s->handler_ = handler;
  s->name_ = std::move(name);
  s->loop_ = std::make_unique<Loop>(*s);
  s->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->wake_fd_ < 0) return internal_error("eventfd: {}", std::strerror(errno));
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

FrameServer::~FrameServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void FrameServer::wake() {
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void FrameServer::reply(ConnId c, FrameType type, std::uint64_t seq, std::string_view payload) {
  loop_->reply_to(c, type, seq, Parts(&payload, 1));
}

void FrameServer::reply(ConnId c, FrameType type, std::uint64_t seq,
                        std::span<const std::string_view> parts) {
  loop_->reply_to(c, type, seq, parts);
}

std::string FrameServer::peer(ConnId c) const { return loop_->peer_of(c); }

void FrameServer::serve() {
  Loop& loop = *loop_;
  std::vector<pollfd> fds;
  std::vector<std::uint64_t> ids;
  while (!stop_) {
    fds.assign({pollfd{listener_.fd(), POLLIN, 0}, pollfd{wake_fd_, POLLIN, 0}});
    ids.assign(2, 0);
    for (auto& [id, c] : loop.conns()) {
      short ev = POLLIN;
      if (!c.out.empty()) ev |= POLLOUT;
      fds.push_back({c.sock.fd(), ev, 0});
      ids.push_back(id);
    }
    int rc = ::poll(fds.data(), fds.size(), 100);
    if (rc > 0) {
      if (fds[0].revents & POLLIN) {
        for (int k = 0; k < 64; ++k) {  // drain the backlog, bounded
          auto s = listener_.accept(Deadline::after(std::chrono::milliseconds(0)));
          if (!s.ok()) break;
          loop.admit(std::move(s).value());
        }
      }
      if (fds[1].revents & POLLIN) {
        std::uint64_t n = 0;
        (void)!::read(wake_fd_, &n, sizeof(n));
      }
      for (std::size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents) loop.on_ready(ids[i], fds[i].revents);
    }
    loop.expire();
    loop.reap();
    handler_->on_tick(*this);
  }
  loop.close_all();
}

Result<Socket> connect_authenticated(const std::string& host, int port, Deadline dl,
                                     const std::string& token, const std::string& what) {
  SHOAL_RETURN_IF_ERROR(init_crypto());
  const std::string name = fmt::format("{} {}:{}", what, host, port);
  auto sock = Socket::connect(host, port, dl);
  if (!sock.ok())
    return sock.status().with_context(fmt::format("{} at {}:{} is unreachable", what, host, port));
  Socket s = std::move(sock).value();
  s.set_peer(name);
  // The handshake (net/auth.h): both sides prove the job token.
  const std::string nc = make_nonce();
  FrameHeader h;
  h.type = static_cast<std::uint16_t>(FrameType::kHello);
  h.length = nc.size();
  SHOAL_RETURN_IF_ERROR(s.send_frame(h, nc.data(), dl).with_context(name));
  SHOAL_ASSIGN_OR_RETURN(std::string chb,
                         recv_reply(s, FrameType::kChallenge, FrameType::kStoreError, 256, dl));
  SHOAL_ASSIGN_OR_RETURN(StoreChallenge ch, parse_store_challenge(chb, name));
  if (!mac_equal(ch.proof, store_proof(token, 'S', nc, ch.nonce)))
    return failed_precondition(
        "{} does not hold this job's token (SHOAL_JOB_TOKEN differs: another job's {}, or "
        "an impostor, is on that port)",
        name, what);
  const std::string proof = store_proof(token, 'C', nc, ch.nonce);
  h.type = static_cast<std::uint16_t>(FrameType::kProof);
  h.length = proof.size();
  SHOAL_RETURN_IF_ERROR(s.send_frame(h, proof.data(), dl).with_context(name));
  SHOAL_RETURN_IF_ERROR(recv_reply(s, FrameType::kProof, FrameType::kStoreError, 0, dl).status());
  return s;
}

Result<std::string> recv_reply(Socket& s, FrameType want, FrameType refusal, std::uint64_t max,
                               Deadline dl) {
  auto h = s.recv_header(std::max<std::uint64_t>(max, 4096), dl);
  if (!h.ok()) return h.status().with_context(s.peer());
  std::string v(h->length, '\0');
  SHOAL_RETURN_IF_ERROR(s.recv_all(v.data(), v.size(), dl).with_context(s.peer()));
  if (h->type == static_cast<std::uint16_t>(refusal))
    return failed_precondition("{} refused: {}", s.peer(), v);
  if (h->type != static_cast<std::uint16_t>(want) || v.size() > max)
    return invalid_argument("{}: expected frame type {} of at most {} bytes, got type {} of {}",
                            s.peer(), static_cast<int>(want), max, h->type, v.size());
  return v;
}

}  // namespace shoal::net
