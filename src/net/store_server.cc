// The TCP store's server: one thread, one poll loop, nonblocking sockets.
// Each connection is a small state machine (hello -> proof -> serving)
// with its own input and output buffers and deadlines, so a client that
// sends nothing, sends a byte a second, or never reads its replies is
// dropped when its own deadline passes while every other client is served.
// The wire format is in docs/launch.md (security model).
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/net/auth.h"
#include "shoal/net/store.h"

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
  std::string in, out;
  std::size_t out_pos = 0;
  Phase phase = Phase::kHello;
  std::string client_nonce, server_nonce;
  Clock::time_point handshake_until{}, frame_until{}, reply_until{};
  bool frame_begun = false, close_after_flush = false, dead = false;
};

// The map, its bounds and the clients blocked in get().
class Table {
 public:
  explicit Table(const StoreLimits& l) : limits_(l) {}
  // An error text when storing key=value would pass a limit.
  std::string check(const std::string& key, std::size_t value_bytes) const {
    auto it = kv_.find(key);
    std::uint64_t after_keys = kv_.size() + (it == kv_.end() ? 1 : 0);
    std::uint64_t after_bytes = bytes_ + value_bytes + (it == kv_.end() ? key.size() : 0) -
                                (it == kv_.end() ? 0 : it->second.size());
    if (after_keys > limits_.max_keys)
      return fmt::format("store full: {} keys held, the limit is {}", kv_.size(), limits_.max_keys);
    if (after_bytes > limits_.max_total_bytes)
      return fmt::format("store full: {} bytes held, setting '{}' ({} bytes) passes the limit {}",
                         bytes_, key, value_bytes, limits_.max_total_bytes);
    return "";
  }
  void put(const std::string& key, std::string value) {
    auto it = kv_.find(key);
    if (it == kv_.end()) {
      bytes_ += key.size() + value.size();
      kv_.emplace(key, std::move(value));
    } else {
      bytes_ = bytes_ - it->second.size() + value.size();
      it->second = std::move(value);
    }
  }
  const std::string* find(const std::string& key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
  }
  std::multimap<std::string, std::pair<std::uint64_t, std::uint64_t>> waiters;  // key -> conn, seq

 private:
  const StoreLimits& limits_;
  std::map<std::string, std::string> kv_;
  std::uint64_t bytes_ = 0;
};

void queue_frame(Conn& c, FrameType type, std::uint64_t seq, std::string_view payload) {
  FrameHeader h;
  h.type = static_cast<std::uint16_t>(type);
  h.length = payload.size();
  h.seq = seq;
  std::uint8_t hb[kHeaderBytes];
  encode_header(h, hb);
  c.out.append(reinterpret_cast<const char*>(hb), kHeaderBytes);
  c.out.append(payload);
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

// Reads what the socket has now (bounded per round, so one fast client
// cannot starve the loop); false on EOF or error.
bool fill(Conn& c) {
  char buf[65536];
  for (int round = 0; round < 16; ++round) {
    ssize_t n = ::recv(c.sock.fd(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      c.in.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    return false;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& host, int port,
                                                              const std::string& token,
                                                              StoreLimits limits) {
  SHOAL_RETURN_IF_ERROR(init_crypto());
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  SHOAL_ASSIGN_OR_RETURN(s->listener_, Socket::listen(host, port));
  SHOAL_ASSIGN_OR_RETURN(s->port_, s->listener_.local_port());
  SHOAL_ASSIGN_OR_RETURN(s->host_, s->listener_.local_host());
  s->token_ = token;
  s->limits_ = limits;
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

namespace {

// One server's loop state; TcpStoreServer::serve drives it.
class Loop {
 public:
  Loop(const std::string& token, const StoreLimits& limits, std::atomic<int>& refused)
      : token_(token), limits_(limits), table_(limits), refused_(refused) {}

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
      std::erase_if(table_.waiters, [&](const auto& w) { return w.second.first == it->first; });
      it = conns_.erase(it);
    }
  }

  std::map<std::uint64_t, Conn>& conns() { return conns_; }

 private:
  void refuse(const std::string& peer, const std::string& why) {
    ++refused_;
    SHOAL_LOG_WARN("store: refused the client at {}: {}", peer, why);
  }
  void drop(Conn& c, const std::string& why) {
    refuse(c.peer, why);
    c.dead = true;
  }
  void reply(Conn& c, FrameType type, std::uint64_t seq, std::string_view payload) {
    if (c.out.empty()) c.reply_until = after(limits_.io_seconds);
    queue_frame(c, type, seq, payload);
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
    c.in.erase(0, pos);
  }

  void handle(std::uint64_t id, Conn& c, const FrameHeader& h, std::string_view body) {
    const auto type = static_cast<FrameType>(h.type);
    if (c.phase == Conn::Phase::kHello) {
      if (type != FrameType::kHello || body.size() != kNonceBytes)
        return drop(c, fmt::format("sent frame type {} ({} bytes) instead of a store hello", h.type,
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
    char cmd = 0;
    std::string parts[3];
    if (type != FrameType::kStoreRequest || !parse_store_request(body, &cmd, parts))
      return drop(c, fmt::format("sent a malformed request (frame type {}, {} bytes)", h.type,
                                 body.size()));
    serve(id, c, h.seq, cmd, parts);
  }

  void serve(std::uint64_t id, Conn& c, std::uint64_t seq, char cmd, std::string* parts) {
    const std::string& key = parts[0];
    if (cmd == 'G') {
      if (const std::string* v = table_.find(key)) return reply(c, FrameType::kStoreReply, seq, *v);
      table_.waiters.emplace(key, std::pair{id, seq});
      return;
    }
    std::string value;
    if (cmd == 'S') {
      value = parts[1];
    } else if (cmd == 'A') {
      const std::string* cur = table_.find(key);
      auto base = cur ? env::parse_int(*cur, key) : Result<std::int64_t>(std::int64_t{0});
      auto delta = env::parse_int(parts[1], "delta");
      if (!base.ok() || !delta.ok())
        return reply(c, FrameType::kStoreError, seq,
                     fmt::format("add to '{}': {}", key,
                                 (!base.ok() ? base.status() : delta.status()).message()));
      value = std::to_string(*base + *delta);
    } else if (cmd == 'C') {
      const std::string* cur = table_.find(key);
      if ((cur ? *cur : std::string()) != parts[1])
        return reply(c, FrameType::kStoreReply, seq, cur ? *cur : "");
      value = parts[2];
    } else {
      return drop(c, fmt::format("sent unknown command '{}'", cmd));
    }
    if (std::string full = table_.check(key, value.size()); !full.empty())
      return reply(c, FrameType::kStoreError, seq, full);
    table_.put(key, value);
    reply(c, FrameType::kStoreReply, seq, cmd == 'S' ? "" : value);
    auto [lo, hi] = table_.waiters.equal_range(key);
    for (auto it = lo; it != hi; ++it) {
      auto w = conns_.find(it->second.first);
      if (w != conns_.end() && !w->second.dead)
        reply(w->second, FrameType::kStoreReply, it->second.second, value);
    }
    table_.waiters.erase(lo, hi);
  }

  const std::string& token_;
  const StoreLimits& limits_;
  Table table_;
  std::atomic<int>& refused_;
  std::map<std::uint64_t, Conn> conns_;
  std::uint64_t next_id_ = 1;
};

}  // namespace

void TcpStoreServer::serve() {
  Loop loop(token_, limits_, refused_);
  std::vector<pollfd> fds;
  std::vector<std::uint64_t> ids;
  while (!stop_) {
    fds.assign(1, pollfd{listener_.fd(), POLLIN, 0});
    ids.assign(1, 0);
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
      for (std::size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) loop.on_ready(ids[i], fds[i].revents);
    }
    loop.expire();
    loop.reap();
  }
}

}  // namespace shoal::net
