// A worker's heartbeat: a thread with its own connections to the servers
// that sends a heartbeat frame every `interval_s`, so that servers can tell
// a worker that is waiting (its client thread blocked on a sync round)
// from one that is frozen. Private to ps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/net/socket.h"

namespace shoal::ps {

class Heartbeat {
 public:
  static Result<std::unique_ptr<Heartbeat>> start(const std::vector<std::string>& servers,
                                                  const std::string& token, int worker,
                                                  double interval_s);
  ~Heartbeat();  // stops the thread

 private:
  Heartbeat() = default;
  void loop();
  std::vector<net::Socket> socks_;
  int worker_ = -1;
  double interval_s_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shoal::ps
