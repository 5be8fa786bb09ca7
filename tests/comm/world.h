// run_world: a world of Communicators on threads of this process, over a
// TCP store on loopback, each rank's status (tests/comm: the collectives
// and their faults).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "ranks.h"
#include "shoal/comm/communicator.h"

namespace shoal::comm::testing {

// body(comm) on `world` threads, each rank with its own Communicator
// (tests/ranks.h's run_on_ranks; a 60 s deadline unless `o` sets one);
// each rank's status.
inline std::vector<Status> run_world(int world, const std::function<Status(Communicator&)>& body,
                                     CommOptions o = {},
                                     const std::function<void(int, CommOptions&)>& per_rank = {}) {
  if (o.timeout_seconds == 300) o.timeout_seconds = 60;
  const auto got = ::shoal::testing::run_on_ranks<bool>(
      world, "world",
      [&](int, Communicator& c) -> Result<bool> {
        SHOAL_RETURN_IF_ERROR(body(c));
        return true;
      },
      o, per_rank);
  std::vector<Status> out;
  for (const Result<bool>& r : got) out.push_back(r.status());
  return out;
}

inline void expect_all_ok(const std::vector<Status>& st) {
  for (std::size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
}

}  // namespace shoal::comm::testing
