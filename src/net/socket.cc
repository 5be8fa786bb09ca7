#include "shoal/net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "shoal/core/env.h"

namespace shoal::net {

namespace {

void put_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint64_t get_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Status set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return unavailable("fcntl(O_NONBLOCK): {}", std::strerror(errno));
  return ok_status();
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

// Waits for `events` on fd until the deadline.
Status wait_fd(int fd, short events, Deadline dl, const char* what, const std::string& peer) {
  while (true) {
    pollfd p{fd, events, 0};
    auto ms = static_cast<int>(std::min<long long>(dl.remaining().count(), 1000));
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) {
      if (p.revents & (POLLERR | POLLNVAL)) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        return unavailable("{} {}: {}", what, peer.empty() ? "peer" : peer,
                           err ? std::strerror(err) : "socket error");
      }
      return ok_status();
    }
    if (rc < 0 && errno != EINTR) return unavailable("poll: {}", std::strerror(errno));
    if (dl.expired())
      return deadline_exceeded("{} {}: deadline passed", what, peer.empty() ? "peer" : peer);
  }
}

std::string addr_str(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
  port = ntohs(a->sin6_port);
  return fmt::format("[{}]:{}", host, port);
}

}  // namespace

void encode_header(const FrameHeader& h, std::uint8_t out[kHeaderBytes]) {
  put_u32(out, h.magic);
  put_u16(out + 4, h.version);
  put_u16(out + 6, h.type);
  put_u64(out + 8, h.length);
  put_u64(out + 16, h.seq);
  put_u64(out + 24, h.fingerprint);
}

Result<FrameHeader> decode_header(std::span<const std::uint8_t> in, std::uint64_t max_length,
                                  std::string_view peer) {
  if (in.size() < kHeaderBytes)
    return invalid_argument("frame from {}: header has {} bytes, needs {}", peer, in.size(),
                            kHeaderBytes);
  FrameHeader h;
  h.magic = static_cast<std::uint32_t>(get_le(in.data(), 4));
  h.version = static_cast<std::uint16_t>(get_le(in.data() + 4, 2));
  h.type = static_cast<std::uint16_t>(get_le(in.data() + 6, 2));
  h.length = get_le(in.data() + 8, 8);
  h.seq = get_le(in.data() + 16, 8);
  h.fingerprint = get_le(in.data() + 24, 8);
  if (h.magic != kMagic)
    return invalid_argument(
        "frame from {}: bad magic 0x{:08x} (expected 0x{:08x}): not a Shoal "
        "peer or a corrupted stream",
        peer, h.magic, kMagic);
  if (h.version != kProtocolVersion)
    return failed_precondition("frame from {}: protocol version {}, this build speaks {}", peer,
                               h.version, kProtocolVersion);
  if (h.type < static_cast<std::uint16_t>(FrameType::kHello) ||
      h.type > static_cast<std::uint16_t>(kLastFrameType))
    return invalid_argument("frame from {}: unknown frame type {}", peer, h.type);
  std::uint64_t bound = std::min(max_length, kMaxFrame);
  if (h.length > bound)
    return invalid_argument("frame from {}: length {} exceeds the bound {} for this read", peer,
                            h.length, bound);
  return h;
}

Socket::~Socket() { close(); }

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    peer_ = std::move(o.peer_);
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<Socket> Socket::listen(const std::string& host_in, int port, int backlog) {
  std::string host = host_in.empty() ? "127.0.0.1" : host_in;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string ps = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res); rc != 0)
    return invalid_argument("listen on {}:{}: {}", host, port, gai_strerror(rc));
  std::string last = "no address";
  bool in_use = false;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, backlog) == 0) {
      freeaddrinfo(res);
      Socket s(fd);
      SHOAL_RETURN_IF_ERROR(set_nonblocking(fd));
      return s;
    }
    in_use = in_use || errno == EADDRINUSE;
    last = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  // Another process holds the port: a code of its own, so that callers say
  // "port in use" only when it is.
  if (in_use) return already_exists("listen on {}:{}: {}", host, port, last);
  return unavailable("listen on {}:{}: {}", host, port, last);
}

Result<Socket> Socket::connect(const std::string& host, int port, Deadline dl) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  std::string ps = std::to_string(port);
  std::string last;
  for (int attempt = 0;; ++attempt) {
    addrinfo* res = nullptr;
    if (int rc = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res); rc != 0) {
      // A name that does not resolve yet is worth waiting for, as a refused
      // connection is: a Kubernetes headless Service publishes a pod's
      // record seconds after the pod starts. The caller decides how long
      // (connect_with_retries in comm's rendezvous: SHOAL_STORE_WAIT).
      if (rc == EAI_NONAME || rc == EAI_AGAIN || rc == EAI_FAIL
#ifdef EAI_NODATA
          || rc == EAI_NODATA
#endif
      )
        return unavailable("connect to {}:{}: {} (the name does not resolve)", host, port,
                           gai_strerror(rc));
      return invalid_argument("connect to {}:{}: {}", host, port, gai_strerror(rc));
    }
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      Socket s(fd);
      SHOAL_RETURN_IF_ERROR(set_nonblocking(fd));
      int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        Status w = wait_fd(fd, POLLOUT, dl, "connecting to", fmt::format("{}:{}", host, port));
        if (!w.ok()) {
          freeaddrinfo(res);
          return w;
        }
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc == 0) {
        freeaddrinfo(res);
        tune(fd);
        s.set_peer(fmt::format("{}:{}", host, port));
        return s;
      }
      last = std::strerror(errno);
    }
    freeaddrinfo(res);
    if (dl.expired())
      return unavailable("connect to {}:{}: {} (gave up at the deadline after {} attempts)", host,
                         port, last, attempt + 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10 * (attempt + 1), 200)));
  }
}

Result<Socket> Socket::accept(Deadline dl) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      tune(fd);
      Socket s(fd);
      s.set_peer(addr_str(ss));
      return s;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return unavailable("accept: {}", std::strerror(errno));
    SHOAL_RETURN_IF_ERROR(wait_fd(fd_, POLLIN, dl, "accepting a connection on", peer_));
  }
}

Result<int> Socket::local_port() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return unavailable("getsockname: {}", std::strerror(errno));
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

Result<std::string> Socket::local_host() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return unavailable("getsockname: {}", std::strerror(errno));
  std::string s = addr_str(ss);
  return s.substr(0, s.rfind(':'));
}

Status Socket::send_all(const void* p, std::size_t n, Deadline dl) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::send(fd_, c, n, MSG_NOSIGNAL);
    if (k > 0) {
      c += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      SHOAL_RETURN_IF_ERROR(wait_fd(fd_, POLLOUT, dl, "sending to", peer_));
      continue;
    }
    return unavailable("sending to {}: {}", peer_, k < 0 ? std::strerror(errno) : "closed");
  }
  return ok_status();
}

Status Socket::recv_all(void* p, std::size_t n, Deadline dl) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = ::recv(fd_, c, n, 0);
    if (k > 0) {
      c += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) return unavailable("{} closed the connection", peer_.empty() ? "peer" : peer_);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      SHOAL_RETURN_IF_ERROR(wait_fd(fd_, POLLIN, dl, "receiving from", peer_));
      continue;
    }
    return unavailable("receiving from {}: {}", peer_, std::strerror(errno));
  }
  return ok_status();
}

Status Socket::send_frame(const FrameHeader& h, const void* payload, Deadline dl) {
  std::uint8_t hb[kHeaderBytes];
  encode_header(h, hb);
  SHOAL_RETURN_IF_ERROR(send_all(hb, kHeaderBytes, dl));
  if (h.length > 0) SHOAL_RETURN_IF_ERROR(send_all(payload, h.length, dl));
  return ok_status();
}

Result<FrameHeader> Socket::recv_header(std::uint64_t max_length, Deadline dl) {
  std::uint8_t hb[kHeaderBytes];
  SHOAL_RETURN_IF_ERROR(recv_all(hb, kHeaderBytes, dl));
  return decode_header(hb, max_length, peer_);
}

// Store requests: cmd, then three length-prefixed strings (key, a, b).
std::string pack_store_request(char cmd, const std::string& key, const std::string& a,
                               const std::string& b) {
  std::string out(1, cmd);
  for (const std::string* s : {&key, &a, &b}) {
    auto n = static_cast<std::uint32_t>(s->size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
    out += *s;
  }
  return out;
}

bool parse_store_request(std::string_view in, char* cmd, std::string* parts) {
  if (in.empty()) return false;
  *cmd = in[0];
  std::size_t pos = 1;
  for (int i = 0; i < 3; ++i) {
    if (pos + 4 > in.size()) return false;
    std::uint32_t n = 0;
    for (int k = 3; k >= 0; --k)
      n = (n << 8) | static_cast<unsigned char>(in[pos + static_cast<std::size_t>(k)]);
    pos += 4;
    if (pos + n > in.size()) return false;
    parts[i] = std::string(in.substr(pos, n));
    pos += n;
  }
  return pos == in.size();
}

Result<std::pair<std::string, int>> split_host_port(std::string_view s, std::string_view what) {
  std::string host;
  std::string_view port;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return invalid_argument("{}: '{}' is not [v6-address]:port", what, s);
    host = std::string(s.substr(1, close - 1));
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string_view::npos || colon == 0)
      return invalid_argument("{}: '{}' is not host:port", what, s);
    host = std::string(s.substr(0, colon));
    port = s.substr(colon + 1);
  }
  SHOAL_ASSIGN_OR_RETURN(std::int64_t p, env::parse_int(port, what));
  if (p < 0 || p > 65535) return invalid_argument("{}: port {} out of range", what, p);
  return std::make_pair(host, static_cast<int>(p));
}

}  // namespace shoal::net
