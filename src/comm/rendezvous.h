// How the ranks of a job find their store, from what the launcher set:
// a shared directory (SHOAL_STORE_DIR); torchrun's own agent store
// (TORCHELASTIC_USE_AGENT_STORE, spoken as a c10d TCPStore client); a TCP
// store that rank 0 or `shoal run` serves (SHOAL_STORE, MASTER_ADDR); or,
// under a bare srun or mpirun on one host, a store rank 0 serves on a port
// derived from the job and step ids. Private to comm.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "shoal/comm/communicator.h"
#include "shoal/core/launch_env.h"
#include "shoal/net/store.h"

namespace shoal::comm {

struct Rendezvous {
  std::unique_ptr<net::TcpStoreServer> server;  // when this rank serves it
  std::unique_ptr<net::Store> store;
  // Another client of the same store (for a thread of its own: a store
  // client is not shared between threads), and where it is.
  std::function<Result<std::unique_ptr<net::Store>>()> connect_again;
  std::string where;
  std::string host;  // the store's host; "" for a file store
};

// For a world of more than one. May set o.prefix (keys of one torchrun
// attempt) and says once, on rank 0, what it chose when it was not told.
Result<Rendezvous> open_rendezvous(const LaunchEnv& e, CommOptions& o);

// Where a store derived from a launcher's job ids would be, "" with the
// reason in `why` when this launcher's ranks cannot derive one (several
// hosts and no known rank-0 address). Exposed for tests.
std::string derived_store(const LaunchEnv& e, std::string* why);

}  // namespace shoal::comm
