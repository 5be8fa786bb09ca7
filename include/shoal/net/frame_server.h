// An authenticated request/response server over Shoal's frames, shared by
// the rendezvous store and the parameter server: one thread, one poll
// loop, nonblocking sockets. Each connection is a small state machine
// (hello -> proof -> serving: the token handshake of net/auth.h) with its
// own buffers and deadlines, so a client that sends nothing, sends a byte
// a second, or never reads its replies is dropped when its own deadline
// passes while every other client is served; connection counts and request
// sizes are bounded (ServerLimits). What a request means is the Handler's:
// it answers on the serving thread, at once or later (a blocked get, a
// pull waiting for a round).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "shoal/core/status.h"
#include "shoal/net/socket.h"

namespace shoal::net {

// What one server lets its clients take. A client past a limit gets an
// error reply naming it (or is dropped, for connection limits and
// deadlines), and the others are served on.
struct ServerLimits {
  std::uint64_t max_request_bytes = 64 << 20;              // one request frame
  std::uint64_t max_keys = 1 << 20;                        // keys held (store)
  std::uint64_t max_total_bytes = std::uint64_t{1} << 30;  // keys + values held (store)
  std::uint64_t max_reply_backlog = 256 << 20;             // unsent replies per client
  int max_clients = 4096;
  int max_clients_per_address = 1024;  // ranks of one host share an address
  int max_unproven_per_address = 64;   // connections still in the handshake
  double handshake_seconds = 10;       // to finish the handshake
  double io_seconds = 30;              // to finish a frame once begun, or to read a reply
};

class FrameServer {
 public:
  using ConnId = std::uint64_t;
  class Handler {
   public:
    virtual ~Handler() = default;
    // A frame from an authenticated client. Answer with reply(), now or
    // later; return an error text to drop the client ("" = served).
    virtual std::string on_request(FrameServer& s, ConnId c, const FrameHeader& h,
                                   std::string_view body) = 0;
    // The client is gone (closed, dropped, or the server stops).
    virtual void on_close(FrameServer& /*s*/, ConnId /*c*/) {}
    // About every 100 ms, after every batch of requests, and soon after
    // wake(), on the serving thread.
    virtual void on_tick(FrameServer& /*s*/) {}
  };

  // Serves `handler` (which must outlive the server) on host:port for
  // clients that prove `token`; `name` ("store", "ps server") names it in
  // logs and in refusals sent to clients.
  static Result<std::unique_ptr<FrameServer>> start(const std::string& host, int port,
                                                    const std::string& token, Handler* handler,
                                                    ServerLimits limits, std::string name);
  ~FrameServer();  // stops the thread; on_close for every client still there
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  const ServerLimits& limits() const { return limits_; }
  // Connections refused so far (bad proof, limits, deadlines).
  int refused() const { return refused_.load(); }

  // Serving thread only (from the handler): queue a reply frame; `seq` is
  // the request's. A client whose unread replies pass the backlog limit is
  // dropped. A reply to a client that is gone is ignored.
  void reply(ConnId c, FrameType type, std::uint64_t seq, std::string_view payload);
  // The same with the payload in pieces (e.g. a reply's fields, then a
  // tensor's bytes where they lie): sent from their memory while the
  // socket takes them, and copied only for what must wait. At most 7
  // pieces go out without a copy.
  void reply(ConnId c, FrameType type, std::uint64_t seq, std::span<const std::string_view> parts);
  // Serving thread only: the client's address ("host:port").
  std::string peer(ConnId c) const;
  // Any thread: the serving thread calls on_tick soon (a background job of
  // the handler's has finished).
  void wake();

 private:
  class Loop;
  FrameServer() = default;
  void serve();
  Socket listener_;
  int wake_fd_ = -1;  // an eventfd in the poll set
  std::string host_, token_, name_;
  ServerLimits limits_;
  Handler* handler_ = nullptr;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

// The client side of the handshake: connects, proves `token` and checks
// the server's proof; errors name `what` and the address.
Result<Socket> connect_authenticated(const std::string& host, int port, Deadline dl,
                                     const std::string& token, const std::string& what);
// A frame of `want` type (at most `max` bytes) from `s`, or the server's
// refusal (`refusal` type: the payload says why) as an error naming `s`.
Result<std::string> recv_reply(Socket& s, FrameType want, FrameType refusal, std::uint64_t max,
                               Deadline dl);

}  // namespace shoal::net
