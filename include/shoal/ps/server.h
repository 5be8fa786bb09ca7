// A parameter server process's service: one Shard (ps/shard.h) behind an
// authenticated FrameServer (the rendezvous store's transport). Workers
// join, init keys, push gradients and pull values (ps/wire.h); a pull for
// a version not reached yet is answered when a round closes. A worker
// whose connection closes leaves the quorum at once, named in the log, so
// its rounds do not hang the others. With a snapshot path the shard is
// written every `snapshot_every` updates and restored at start.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shoal/net/frame_server.h"
#include "shoal/ps/shard.h"

namespace shoal::ps {

struct ServerOptions {
  ShardOptions shard;
  // false: the server waits for the first worker's options (wire op 'C')
  // and adopts them; later workers must agree. true: `shard` is the
  // server's and a worker that asks for other options is refused by name.
  bool configured = true;
  std::string snapshot;              // "" = none
  std::uint64_t snapshot_every = 0;  // updates between snapshots (0 = only at exit)
  net::ServerLimits limits;
  // CPU threads for the updates (OpenMP, on the serving thread). The
  // updates are element-wise and small next to the workers' steps: one
  // thread keeps the server off the cores the workers train on (an idle
  // OpenMP team spins: 46% of a server's cycles in a 2-worker CNN job).
  int threads = 1;
  // A member worker from which nothing (not even a heartbeat) came for this
  // long is dropped from the quorum, named in the log: a frozen worker
  // (SIGSTOP, a hung host) does not hold sync rounds or the bounded
  // window forever. Workers send heartbeats every quarter of it. 0 = off.
  double heartbeat_s = 30;
  // Sync jobs: the number of workers the job has (DMLC_NUM_WORKER). When
  // set, a round closes only with every one of them: a member lost (its
  // connection closed before it left, silent past the heartbeat deadline,
  // or gone while others still push) ends the job instead, and every
  // waiting and later push is refused naming it. 0 = rounds over the
  // members present (a server used alone, as in the unit tests).
  int job_workers = 0;
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> start(const std::string& host, int port,
                                               const std::string& token, const ServerOptions& o);
  ~Server();  // stops serving; writes a last snapshot when configured
  int port() const;
  ShardStats stats() const;  // thread-safe
  // What crossed the wire and what waits (thread-safe).
  struct Traffic {
    std::uint64_t bytes_in = 0, bytes_out = 0;  // request and reply bodies
    std::size_t queue = 0;                      // answers waiting for a round to close
    // Gradients read from and values written into same-host workers'
    // shared memory (wire op 'Y'), which do not cross the socket.
    std::uint64_t shm_in = 0, shm_out = 0;
  };
  Traffic traffic() const;
  int refused() const;
  // Workers dropped for silence since the last call, each as a line
  // naming the worker (thread-safe): `shoal ps server` tells the scheduler.
  std::vector<std::pair<int, std::string>> take_drops();
  // The member whose loss ended a sync job of `job_workers` and why; ""
  // while none was lost (thread-safe).
  std::string lost() const;
  // Workers connected now, and workers whose connection closed before they
  // left and who have not come back (thread-safe): an asynchronous job
  // whose last workers died rather than left ends by these.
  struct Presence {
    int connected = 0, gone = 0;
  };
  Presence presence() const;

 private:
  class Handler;
  Server() = default;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<net::FrameServer> server_;
};

}  // namespace shoal::ps
