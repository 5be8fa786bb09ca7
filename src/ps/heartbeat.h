// A worker's heartbeat: a thread with its own connections to the servers
// that sends a heartbeat frame every `interval_s`, so that servers can tell
// a worker that is waiting (its client thread blocked on a sync round)
// from one that is frozen. It never blocks on one server: a beat goes out
// only when the last was answered, and answers are read as they come, so
// a frozen server does not starve the others of this worker's beats (they
// would drop it as silent and blame it). A server whose beat is unanswered
// for `deadline_s` is named by silent(): the worker's push-pulls to it
// fail with that. A server whose connection fails is skipped, and
// reconnected once `lookup` gives it an address other than the one that
// failed (a server restarted from its snapshot registers again). Private
// to ps.
#pragma once

#include <atomic>
#include <chrono>
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
                                                  double interval_s, double deadline_s,
                                                  Lookup lookup = {});
  ~Heartbeat();  // stops the thread
  // "" while server i answers; else why it is taken for stopped or hung
  // (thread-safe).
  std::string silent(std::size_t i) const;

 private:
  using Clock = std::chrono::steady_clock;
  Heartbeat() = default;
  void loop();
  // Server i's turn: reads its answer if one came, sends the next beat
  // when due, names it when its beat is unanswered past the deadline.
  void tend(std::size_t i, const std::string& msg, std::uint64_t seq);
  // Reconnects to server i when it registered a new address.
  void revive(std::size_t i);
  std::vector<std::optional<net::Socket>> socks_;        // empty: failed, waiting for a new address
  std::vector<std::optional<Clock::time_point>> asked_;  // the unanswered beat's send time
  std::vector<Clock::time_point> last_sent_;
  std::vector<std::string> silent_;  // guarded by mu_
  double deadline_s_ = 30;
  std::vector<std::string> addrs_;
  std::string token_;
  Lookup lookup_;
  int worker_ = -1;
  double interval_s_ = 1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shoal::ps
