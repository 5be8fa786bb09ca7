// A worker's connections to the parameter servers: join, init keys, push
// gradients (each with the next sequence number, so a retry is recognized)
// and pull values. A key lives on one server, chosen by a stable hash of
// its name. Not thread-safe: one per thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shoal/core/deadline.h"
#include "shoal/net/socket.h"
#include "shoal/ps/shard.h"

namespace shoal::ps {

class Worker {
 public:
  // `servers` are "host:port"; every connection proves `token`.
  static Result<std::unique_ptr<Worker>> connect(const std::vector<std::string>& servers,
                                                 const std::string& token, int worker, Deadline dl);
  ~Worker();  // leaves, when it has not

  int id() const { return worker_; }
  Status init(const std::string& key, const Tensor& value);
  // Pushes, waiting and retrying while a bounded-staleness server says
  // kWait, until `dl`.
  Result<PushResult> push(const std::string& key, std::int64_t step, const Tensor& grad,
                          Deadline dl);
  // The key's value once its version reaches `min_version` (sync: after
  // round min_version - 1 closed).
  Result<std::pair<std::uint64_t, Tensor>> pull(const std::string& key, std::uint64_t min_version,
                                                Deadline dl);
  // Leaves every server: sync rounds stop waiting for this worker.
  Status leave();

 private:
  Worker() = default;
  net::Socket& server_of(const std::string& key);
  Result<std::string> call(net::Socket& s, const std::string& payload, Deadline dl);
  std::vector<net::Socket> servers_;
  int worker_ = -1;
  std::uint64_t seq_ = 0, frame_ = 0;
  bool left_ = false;
};

}  // namespace shoal::ps
