// `shoal ps scheduler`: runs ps::Scheduler (ps/roles.h), the job's
// rendezvous point, until the job is over or SIGINT/SIGTERM.
#include <signal.h>

#include <atomic>

#include "cli/commands.h"
#include "shoal/core/logging.h"
#include "shoal/ps/roles.h"

namespace shoal::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

}  // namespace

int run_ps_scheduler(const PsSchedulerFlags& f) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (Status st = ps::Scheduler::run(f.host, f.port, g_stop); !st.ok()) {
    SHOAL_LOG_ERROR("shoal ps scheduler: {}", st.to_string());
    return 2;
  }
  return 0;
}

}  // namespace shoal::cli
