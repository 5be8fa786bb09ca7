// Runs one function per rank on threads, each rank with its own real
// Communicator over a loopback TCP store (the harness of the dp and mp tests).
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/net/store.h"

namespace shoal::testing {

// The tests' communicator options: a 60 s deadline.
inline comm::CommOptions test_comm_options() {
  comm::CommOptions o;
  o.timeout_seconds = 60;
  return o;
}

// A communicator of one rank, for graphs that name a communicator but run
// no exchange (its store, never read, lives for the process).
inline Result<std::unique_ptr<comm::Communicator>> one_rank_communicator() {
  static net::FileStore unused("/nonexistent");
  return comm::Communicator::create(0, 1, unused, {});
}

// fn(rank, communicator) on `world` threads; each rank's result, or the
// error that kept it from running. Every rank gets options `o`, its prefix
// followed by a number per job, then what `per_rank` changes in its copy.
template <typename T>
std::vector<Result<T>> run_on_ranks(
    int world, const std::string& prefix,
    const std::function<Result<T>(int, comm::Communicator&)>& fn,
    const comm::CommOptions& o = test_comm_options(),
    const std::function<void(int, comm::CommOptions&)>& per_rank = {}) {
  std::vector<Result<T>> got(static_cast<std::size_t>(world), internal_error("not run"));
  auto srv = net::TcpStoreServer::start("127.0.0.1", 0, "");
  if (!srv.ok()) {
    got[0] = srv.status();
    return got;
  }
  static int jobs = 0;
  const int job = jobs++;
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      auto& out = got[static_cast<std::size_t>(r)];
      auto store =
          net::TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(10), "");
      if (!store.ok()) {
        out = store.status();
        return;
      }
      comm::CommOptions mine = o;
      mine.prefix = prefix + std::to_string(job);
      if (per_rank) per_rank(r, mine);
      auto c = comm::Communicator::create(r, world, **store, mine);
      if (!c.ok()) {
        out = c.status();
        return;
      }
      out = fn(r, **c);
    });
  for (auto& t : ts) t.join();
  return got;
}

}  // namespace shoal::testing
