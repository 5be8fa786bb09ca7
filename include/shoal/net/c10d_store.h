// A client of PyTorch's c10d TCPStore, the store torchrun's agent serves on
// MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True): under torchrun's default
// static rendezvous the ranks meet through it instead of a store of their
// own, which could not bind a port the agent already holds. The wire
// format is torch 1.13's (Debian bookworm's python3-torch): a query-type
// byte, then keys and values as a u64 length in host byte order and the
// bytes; get() first waits for the key. The c10d store has no
// authentication: say so to the user. Not thread-safe: one per thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "shoal/net/store.h"

namespace shoal::net {

class C10dStore final : public Store {
 public:
  static Result<std::unique_ptr<C10dStore>> connect(const std::string& host, int port, Deadline dl);
  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, Deadline dl) override;
  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override;
  Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) override;
  void set_io_timeout(std::chrono::milliseconds t) override { io_timeout_ = t; }

 private:
  Status send(const std::string& bytes, Deadline dl);
  Result<std::string> recv_bytes(Deadline dl);
  template <typename T>
  Result<T> recv_value(Deadline dl);
  Socket sock_;
  std::chrono::milliseconds io_timeout_{30000};
};

}  // namespace shoal::net
