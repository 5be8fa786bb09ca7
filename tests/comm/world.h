// run_world: a world of Communicators on threads of this process, over a
// TCP store on loopback (tests/comm: the collectives and their faults).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/net/store.h"

namespace shoal::comm::testing {

// Runs body(comm) on `world` threads; returns each rank's status.
inline std::vector<Status> run_world(int world, const std::function<Status(Communicator&)>& body,
                                     CommOptions o = {},
                                     const std::function<void(int, CommOptions&)>& per_rank = {}) {
  auto srv = net::TcpStoreServer::start("127.0.0.1", 0, "");
  EXPECT_TRUE(srv.ok());
  std::vector<Status> out(static_cast<std::size_t>(world));
  std::vector<std::thread> ts;
  if (o.timeout_seconds == 300) o.timeout_seconds = 60;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      auto store =
          net::TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(10), "");
      if (!store.ok()) {
        out[static_cast<std::size_t>(r)] = store.status();
        return;
      }
      CommOptions ro = o;
      if (ro.token == "rank1-differs" && r == 1) ro.token = "something else";
      if (per_rank) per_rank(r, ro);
      auto c = Communicator::create(r, world, **store, ro);
      if (!c.ok()) {
        out[static_cast<std::size_t>(r)] = c.status();
        return;
      }
      out[static_cast<std::size_t>(r)] = body(**c);
    });
  for (auto& t : ts) t.join();
  return out;
}

inline void expect_all_ok(const std::vector<Status>& st) {
  for (std::size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
}

}  // namespace shoal::comm::testing
