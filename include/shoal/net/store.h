// Rendezvous key-value stores: a TCP store (a server thread run by rank 0
// or the launcher; clients on every rank) and a file store (a directory on
// a shared file system). get() blocks until the key exists or the deadline
// passes; add() is an atomic counter; compare_set() an atomic swap. Keys
// and values are byte strings. Every TCP connection first proves the job
// token both ways (net/auth.h); the server serves no key to a client that
// has not, and bounds what any client can take (StoreLimits). Clients are
// not thread-safe: one per thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shoal/core/deadline.h"
#include "shoal/core/status.h"
#include "shoal/net/frame_server.h"
#include "shoal/net/socket.h"

namespace shoal::net {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  virtual Result<std::string> get(const std::string& key, Deadline dl) = 0;
  virtual Result<std::int64_t> add(const std::string& key, std::int64_t delta) = 0;
  // Sets key to `desired` if its value is `expected` ("" = absent); returns
  // the value after the call.
  virtual Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                          const std::string& desired) = 0;
  Status wait(const std::vector<std::string>& keys, Deadline dl);
  // How long set/add/compare_set wait for the store's answer (default 30 s;
  // a watchdog wants its heartbeat deadline). No-op for a file store.
  virtual void set_io_timeout(std::chrono::milliseconds) {}
  // The key's value now, "" while it is absent, without waiting (a get()
  // that times out would leave its reply on a TCP connection). A swap that
  // expects a value no key holds, so it never writes.
  Result<std::string> peek(const std::string& key);
};

// The store's limits are the frame server's (net/frame_server.h).
using StoreLimits = ServerLimits;

// The server: owns the listener and the map; serves until destroyed. One
// thread, nonblocking sockets: a slow or silent client never delays another.
class TcpStoreServer {
 public:
  // `token` is the job token clients must prove ("" = the empty token: any
  // client that knows there is none gets in; say so to the user).
  static Result<std::unique_ptr<TcpStoreServer>> start(const std::string& host, int port,
                                                       const std::string& token,
                                                       StoreLimits limits = {});
  ~TcpStoreServer();
  int port() const;
  const std::string& host() const;
  // Connections refused so far (bad proof, limits, deadlines): for tests and logs.
  int refused() const;
  // The job is over: every get waiting now, and every later get of an
  // absent key, is answered with `why` as an error (a client waiting for
  // a peer that died hears why instead of waiting out its deadline).
  void end_waits(const std::string& why);

 private:
  class Handler;
  TcpStoreServer() = default;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<FrameServer> server_;
};

class TcpStore final : public Store {
 public:
  // Connects and runs the handshake: fails, naming the store, when it is
  // unreachable or does not hold `token` (or refuses this client's proof).
  static Result<std::unique_ptr<TcpStore>> connect(const std::string& host, int port, Deadline dl,
                                                   const std::string& token);
  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, Deadline dl) override;
  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override;
  Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) override;
  void set_io_timeout(std::chrono::milliseconds t) override { io_timeout_ = t; }

 private:
  Result<std::string> call(char cmd, const std::string& key, const std::string& a,
                           const std::string& b, Deadline dl);
  Socket sock_;
  std::chrono::milliseconds io_timeout_{30000};
};

// Keys are files under dir/<job>/ (mode 0700: only the job's user reads
// them), so jobs sharing a directory never read each other's keys; `job`
// "" puts them in dir itself (one job per directory, the caller's promise).
class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir, const std::string& job = "");
  // The directory the keys are in.
  const std::string& dir() const { return dir_; }
  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, Deadline dl) override;
  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override;
  Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) override;

 private:
  std::string path(const std::string& key) const;
  std::string dir_;
};

}  // namespace shoal::net
