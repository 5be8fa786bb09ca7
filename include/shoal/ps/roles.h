// A parameter-server job's processes other than the workers, in
// ps-lite/MXNet's roles: a server (one shard of the parameters) and the
// scheduler (the job's rendezvous store). `shoal ps server` and `shoal ps
// scheduler` parse flags into these and install the signal handlers; what
// the processes do is here. Each reads the job's environment once.
#pragma once

#include <atomic>
#include <string>

#include "shoal/core/status.h"
#include "shoal/ps/server.h"

namespace shoal::ps {

struct ServerJobOptions {
  // "": 127.0.0.1 unless the job's scheduler is on another address, then
  // every interface, publishing the one that routes to the scheduler.
  std::string host;
  int port = 0;  // 0: any free one (printed)
  // The shard's options; server.configured false: the first worker's.
  // heartbeat_s and shard.slice_bound come from the environment.
  ServerOptions server;
  std::string metrics;  // appends a JSON line per second when set
};

class ServerJob {
 public:
  // Serves until `stop` is set, or, in a job (DMLC_ROLE=server), until
  // every worker that joined has left or the scheduler is gone. In a job
  // it registers its address with the scheduler first (slot
  // SHOAL_PS_SERVER_INDEX, or the one kept beside its snapshot, or the
  // next free one) and publishes the workers it drops for silence. At the
  // end it writes its last snapshot and prints what it served.
  static Status run(ServerJobOptions o, const std::atomic<bool>& stop);
};

class Scheduler {
 public:
  // Serves the job's store on host:port (port < 0: DMLC_PS_ROOT_PORT),
  // prints the servers and workers as they come and go, and returns when
  // DMLC_NUM_WORKER workers have joined and every one that joined has
  // left, or when `stop` is set.
  static Status run(const std::string& host, int port, const std::atomic<bool>& stop);
};

}  // namespace shoal::ps
