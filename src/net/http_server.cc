#include "shoal/net/http_server.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <list>
#include <vector>

#include "shoal/core/logging.h"

namespace shoal::net {

namespace {

using Clock = std::chrono::steady_clock;

std::string render(const HttpResponse& r, bool close) {
  std::string out = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
                                r.status, http_reason(r.status), r.content_type, r.body.size());
  if (close) out += "Connection: close\r\n";
  out += "\r\n";
  return out + r.body;
}

HttpResponse error_response(int status, const std::string& why) {
  return {status, "text/plain; charset=utf-8", why + "\n"};
}

}  // namespace

// One client: what it sent that is not yet a whole request, what it has
// not yet read, and when it is dropped.
struct Conn {
  Socket s;
  std::string in, out;
  std::size_t out_at = 0;
  bool close_after = false, continued = false;
  Clock::time_point deadline;
};

class HttpServer::Loop {
 public:
  explicit Loop(HttpServer& srv) : srv_(srv) {}

  void run() {
    while (!srv_.stop_.load()) {
      std::vector<pollfd> fds;
      fds.push_back({srv_.wake_fd_, POLLIN, 0});
      bool room = static_cast<int>(conns_.size()) < srv_.limits_.max_clients;
      fds.push_back({room ? srv_.listener_.fd() : -1, POLLIN, 0});
      for (Conn& c : conns_)
        fds.push_back(
            {c.s.fd(), static_cast<short>(c.out_at < c.out.size() ? POLLOUT : POLLIN), 0});
      int n = ::poll(fds.data(), fds.size(), 200);
      if (n < 0 && errno != EINTR) {
        SHOAL_LOG_WARN("http server: poll: {}", std::strerror(errno));
        return;
      }
      std::size_t i = 2;
      auto now = Clock::now();
      for (auto it = conns_.begin(); it != conns_.end(); ++i) {
        bool keep = fds[i].revents ? serve(*it, fds[i].revents) : true;
        if (keep && now >= it->deadline) keep = false;
        it = keep ? std::next(it) : conns_.erase(it);
      }
      if (fds[1].revents & POLLIN) accept_all();
    }
  }

 private:
  void accept_all() {
    for (int k = 0; k < 64; ++k) {
      auto s = srv_.listener_.accept(Deadline::after(std::chrono::milliseconds(0)));
      if (!s.ok()) return;
      Conn c;
      c.s = std::move(*s);
      c.deadline = idle_deadline();
      conns_.push_back(std::move(c));
    }
  }
  Clock::time_point idle_deadline() const {
    return Clock::now() +
           std::chrono::milliseconds(static_cast<long>(srv_.limits_.idle_seconds * 1000));
  }
  Clock::time_point request_deadline() const {
    return Clock::now() +
           std::chrono::milliseconds(static_cast<long>(srv_.limits_.request_seconds * 1000));
  }

  // False: drop the connection.
  bool serve(Conn& c, short revents) {
    if (revents & (POLLERR | POLLNVAL)) return false;
    if (c.out_at < c.out.size()) return flush(c);
    char buf[64 << 10];
    ssize_t got = ::recv(c.s.fd(), buf, sizeof buf, 0);
    if (got == 0) return false;
    if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (c.in.empty()) c.deadline = request_deadline();
    c.in.append(buf, static_cast<std::size_t>(got));
    while (!c.close_after && take_request(c)) {
    }
    return c.out_at < c.out.size() ? flush(c) : !c.close_after;
  }

  // Answers the first whole request in c.in, if there is one.
  bool take_request(Conn& c) {
    const HttpLimits& lim = srv_.limits_;
    std::size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (c.in.size() > lim.max_header_bytes)
        answer(c,
               error_response(431, fmt::format("request head over {} bytes", lim.max_header_bytes)),
               true);
      return false;
    }
    HttpHead h = parse_http_head(std::string_view(c.in).substr(0, end), lim);
    if (h.refuse) {
      answer(c, error_response(h.refuse, h.why), true);
      return false;
    }
    std::size_t total = end + 4 + h.body_bytes;
    if (c.in.size() < total) {
      if (h.expect_continue && !c.continued) {
        c.out += "HTTP/1.1 100 Continue\r\n\r\n";
        c.continued = true;
      }
      return false;
    }
    h.req.body = c.in.substr(end + 4, h.body_bytes);
    c.in.erase(0, total);
    c.continued = false;
    HttpResponse r;
    try {
      r = srv_.handler_(h.req);
    } catch (const std::exception& e) {
      r = error_response(500, fmt::format("the handler failed: {}", e.what()));
    }
    answer(c, r, h.close);
    return !c.in.empty();
  }

  void answer(Conn& c, const HttpResponse& r, bool close) {
    c.out += render(r, close);
    c.close_after = c.close_after || close;
    c.deadline = request_deadline();
    srv_.answered_.fetch_add(1);
  }

  bool flush(Conn& c) {
    while (c.out_at < c.out.size()) {
      ssize_t sent =
          ::send(c.s.fd(), c.out.data() + c.out_at, c.out.size() - c.out_at, MSG_NOSIGNAL);
      if (sent < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.out_at += static_cast<std::size_t>(sent);
    }
    c.out.clear();
    c.out_at = 0;
    if (c.close_after) return false;
    c.deadline = c.in.empty() ? idle_deadline() : request_deadline();
    return true;
  }

  HttpServer& srv_;
  std::list<Conn> conns_;
};

Result<std::unique_ptr<HttpServer>> HttpServer::start(const std::string& host, int port,
                                                      Handler handler, HttpLimits limits) {
  std::unique_ptr<HttpServer> s(new HttpServer());
  SHOAL_ASSIGN_OR_RETURN(s->listener_, Socket::listen(host, port));
  SHOAL_ASSIGN_OR_RETURN(s->port_, s->listener_.local_port());
  s->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd_ < 0) return unavailable("eventfd: {}", std::strerror(errno));
  s->handler_ = std::move(handler);
  s->limits_ = limits;
  HttpServer* raw = s.get();
  s->thread_ = std::thread([raw] { Loop(*raw).run(); });
  return s;
}

HttpServer::~HttpServer() {
  stop_.store(true);
  if (wake_fd_ >= 0) {
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

}  // namespace shoal::net
