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
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shoal/core/deadline.h"
#include "shoal/core/status.h"
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
};

// What one server lets its clients take. A client past a limit gets an
// error reply naming it (or is dropped, for connection limits and
// deadlines), and the others are served on.
struct StoreLimits {
  std::uint64_t max_request_bytes = 64 << 20;              // one request frame
  std::uint64_t max_keys = 1 << 20;                        // keys held
  std::uint64_t max_total_bytes = std::uint64_t{1} << 30;  // keys + values held
  std::uint64_t max_reply_backlog = 256 << 20;             // unsent replies per client
  int max_clients = 4096;
  int max_clients_per_address = 1024;  // ranks of one host share an address
  int max_unproven_per_address = 64;   // connections still in the handshake
  double handshake_seconds = 10;       // to finish the handshake
  double io_seconds = 30;              // to finish a frame once begun, or to read a reply
};

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
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  // Connections refused so far (bad proof, limits, deadlines): for tests and logs.
  int refused() const { return refused_.load(); }

 private:
  TcpStoreServer() = default;
  void serve();
  Socket listener_;
  std::string host_, token_;
  StoreLimits limits_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::thread thread_;
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

 private:
  Result<std::string> call(char cmd, const std::string& key, const std::string& a,
                           const std::string& b, Deadline dl);
  Result<std::string> recv_payload(FrameType want, std::uint64_t max, Deadline dl);
  Socket sock_;
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
