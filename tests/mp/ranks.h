// Runs one function per rank on threads, each rank with its own real
// Communicator over a loopback TCP store (the mp tests' harness).
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/net/store.h"

namespace shoal::testing {

// fn(rank, communicator) on `world` threads; each rank's result, or the
// error that kept it from running.
template <typename T>
std::vector<Result<T>> run_on_ranks(int world, const std::string& prefix,
                                    const std::function<Result<T>(int, comm::Communicator&)>& fn) {
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
      comm::CommOptions o;
      o.timeout_seconds = 60;
      o.prefix = prefix + std::to_string(job);
      auto c = comm::Communicator::create(r, world, **store, o);
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
