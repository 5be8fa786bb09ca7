// A worker's heartbeat: a thread with its own connections to the servers
// that sends a heartbeat frame every `interval_s`, so that servers can tell
// a worker that is waiting (its client thread blocked on a sync round)
// from one that is frozen. A server that stops answering is skipped, and
// reconnected once `lookup` gives it an address other than the one that
// failed (a server restarted from its snapshot registers again); the
// others keep getting theirs. Private to ps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/net/socket.h"

namespace shoal::ps {

class Heartbeat {
 public:
  // Server i's address as registered now ("" when unknown); must not block.
  using Lookup = std::function<std::string(int server)>;
  static Result<std::unique_ptr<Heartbeat>> start(const std::vector<std::string>& servers,
                                                  const std::string& token, int worker,
                                                  double interval_s, Lookup lookup = {});
  ~Heartbeat();  // stops the thread

 private:
  Heartbeat() = default;
  void loop();
  // One heartbeat to server i; false when its connection failed.
  bool beat(std::size_t i, const std::string& msg, std::uint64_t seq);
  // Reconnects to server i when it registered a new address.
  void revive(std::size_t i);
  std::vector<std::optional<net::Socket>> socks_;  // empty: failed, waiting for a new address
  std::vector<std::string> addrs_;
  std::string token_;
  Lookup lookup_;
  int worker_ = -1;
  double interval_s_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shoal::ps
