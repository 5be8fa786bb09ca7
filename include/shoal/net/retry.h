// Waiting for a store that is not up yet: ranks, pods and launchers start
// in any order, so a refused connection is tried again, up to a bound. Any
// other failure (a refused token, a malformed address) fails at once.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "shoal/core/logging.h"
#include "shoal/core/status.h"

namespace shoal::net {

// Calls connect() every 100 ms while it fails as unavailable, for up to
// wait_s seconds; says once that it waits for the store at `where`. When
// the wait runs out the error says how long it retried and what set the
// bound (`bound`, e.g. "SHOAL_STORE_WAIT").
template <typename Connect>
auto connect_with_retries(const std::string& where, double wait_s, const std::string& bound,
                          Connect connect) -> decltype(connect()) {
  const double wait = std::max(0.0, wait_s);
  const Deadline until = Deadline::after_seconds(wait);
  for (int attempt = 0;; ++attempt) {
    auto c = connect();
    if (c.ok() || c.status().code() != StatusCode::kUnavailable || until.expired()) {
      // Only a wait that ran out says it waited.
      if (!c.ok() && c.status().code() == StatusCode::kUnavailable)
        return c.status().with_context(fmt::format("after {:.0f} s of retries ({})", wait, bound));
      return c;
    }
    if (attempt == 0)
      SHOAL_LOG_INFO("waiting for the store at {} (up to {:.0f} s): {}", where, wait,
                     c.status().message());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace shoal::net
