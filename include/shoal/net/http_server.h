// A small HTTP/1.1 server for JSON webhooks (kube-scheduler's extender
// calls): one thread, one poll loop, nonblocking sockets, keep-alive.
// Requests carry their body with Content-Length (what Go's net/http sends
// for a JSON body); chunked bodies are refused with 411. Every connection
// has deadlines and every request a size bound, so a client that sends
// nothing, trickles, or sends too much is answered or dropped while the
// others are served. The handler runs on the serving thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "shoal/core/status.h"
#include "shoal/net/socket.h"

namespace shoal::net {

struct HttpRequest {
  std::string method, path, body;
  std::string content_type;
};
struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

struct HttpLimits {
  std::size_t max_header_bytes = 64 << 10;
  std::size_t max_body_bytes = 64 << 20;  // a NodeList of thousands of nodes
  int max_clients = 256;
  double idle_seconds = 90;     // a keep-alive connection with no request begun
  double request_seconds = 30;  // to send a request once begun, or to read its answer
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  // Serves on host:port (port 0: any free one; host "" = loopback).
  static Result<std::unique_ptr<HttpServer>> start(const std::string& host, int port,
                                                   Handler handler, HttpLimits limits = {});
  ~HttpServer();  // stops the thread and closes every connection
  int port() const { return port_; }
  // Requests answered so far (any status).
  long answered() const { return answered_.load(); }

 private:
  class Loop;
  HttpServer() = default;
  Socket listener_;
  int wake_fd_ = -1;
  int port_ = 0;
  Handler handler_;
  HttpLimits limits_;
  std::atomic<bool> stop_{false};
  std::atomic<long> answered_{0};
  std::thread thread_;
};

// The reason phrase of a status code ("OK", "Bad Request", ...).
const char* http_reason(int status);

// A request's head (request line and fields, up to the blank line) as the
// server reads it: the method and path, how many body bytes follow, and
// whether to close after the answer; `refuse` a status to answer with
// (400, 411, 413) and `why` the reason, then close.
struct HttpHead {
  HttpRequest req;
  std::size_t body_bytes = 0;
  bool close = false, expect_continue = false;
  int refuse = 0;
  std::string why;
};
HttpHead parse_http_head(std::string_view head, const HttpLimits& lim);

}  // namespace shoal::net
