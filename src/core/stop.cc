#include "shoal/core/stop.h"

#include <signal.h>

#include <atomic>

namespace shoal {
namespace {

std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free, "read in a signal handler");

void on_stop(int sig) {
  if (g_stop.exchange(sig) != 0) {  // the second: now
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

}  // namespace

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or write in flight goes on; the loop checks between steps
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int stop_signal() { return g_stop.load(std::memory_order_relaxed); }

}  // namespace shoal
