// Rendezvous key-value stores: a TCP store (a server thread run by rank 0
// or the launcher; clients on every rank) and a file store (a directory on
// a shared file system). get() blocks until the key exists or the deadline
// passes; add() is an atomic counter; compare_set() an atomic swap. Keys
// and values are byte strings. Clients are not thread-safe: one per thread.
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

// The server: owns the listener and the map; serves until destroyed.
class TcpStoreServer {
 public:
  static Result<std::unique_ptr<TcpStoreServer>> start(const std::string& host, int port);
  ~TcpStoreServer();
  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  TcpStoreServer() = default;
  void serve();
  Socket listener_;
  std::string host_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class TcpStore final : public Store {
 public:
  static Result<std::unique_ptr<TcpStore>> connect(const std::string& host, int port, Deadline dl);
  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, Deadline dl) override;
  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override;
  Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) override;

 private:
  Result<std::string> call(char cmd, const std::string& key, const std::string& a,
                           const std::string& b, Deadline dl);
  Socket sock_;
};

class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
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
