// A rank's heartbeat and its watch over the next rank, through the job's
// store: each rank counts up its own key every tick and watches rank+1's
// (a ring: N store reads a tick for the whole job, not N^2). A rank whose
// count stops for `deadline_s` (SIGSTOP, a hung host, a link gone) is named
// in the store's abort key; every rank reads that key each tick and stops,
// saying why, so that a frozen rank costs the job seconds, not the
// collectives' SHOAL_COMM_TIMEOUT, under any launcher (torchrun, srun and
// mpirun watch exits, not frozen processes). A collective may legitimately
// wait far longer than the deadline: the beat comes from this thread, not
// from progress of the training loop. Private to comm.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "shoal/core/status.h"
#include "shoal/net/store.h"

namespace shoal::comm {

class Watchdog {
 public:
  struct Options {
    int rank = 0, world = 1;
    std::string prefix;       // the job's store keys
    double deadline_s = 15;   // SHOAL_HEARTBEAT
    std::string store_where;  // for messages: where the store is
    // What the watchdog does when the job must stop (default: log, exit 1).
    std::function<void(const std::string& why)> stop;
  };
  static Result<std::unique_ptr<Watchdog>> start(std::unique_ptr<net::Store> store, Options o);
  // Says this rank is done (its watcher stops watching it) and stops the thread.
  ~Watchdog();

 private:
  using Clock = std::chrono::steady_clock;
  Watchdog() = default;
  void loop();
  // One tick; a reason to stop the job, or "".
  std::string tick();
  std::unique_ptr<net::Store> store_;
  Options o_;
  std::uint64_t beats_ = 0;
  bool watching_ = true;   // false once the store is gone (the job ends)
  std::string next_seen_;  // the watched rank's last count
  Clock::time_point next_changed_, store_ok_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// SHOAL_HEARTBEAT (seconds, default 15; 0 = off).
Result<double> heartbeat_deadline();

}  // namespace shoal::comm
