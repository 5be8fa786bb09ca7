// One attempt of a `shoal run` job (launcher.cc restarts it): the
// rendezvous store and the ranks' environment, the ranks started under the
// engine, watched until they end or one fails, and the report of how they
// ended. Private to launch.
#pragma once

#include <string>

#include "shoal/launch/launcher.h"

namespace shoal::launch {

struct Outcome {
  int code = 0;
  bool restartable = false;  // a rank failed (not a signal to us, not the timeout)
};

Outcome run_attempt(const LaunchOptions& o, int attempt, const std::string& job_id,
                    const std::string& trace_prefix);

}  // namespace shoal::launch
