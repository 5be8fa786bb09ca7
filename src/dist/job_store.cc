#include "dist/job_store.h"

#include "shoal/core/env.h"
#include "shoal/core/launch_env.h"
#include "shoal/net/socket.h"

namespace shoal::dist {

Result<std::unique_ptr<net::Store>> connect_job_store(double seconds) {
  SHOAL_ASSIGN_OR_RETURN(LaunchEnv le, launch_env());
  SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(le.store, "SHOAL_STORE"));
  SHOAL_ASSIGN_OR_RETURN(
      auto s, net::TcpStore::connect(hp.first, hp.second, Deadline::after_seconds(seconds),
                                     env::get("SHOAL_JOB_TOKEN").value_or("")));
  return std::unique_ptr<net::Store>(std::move(s));
}

}  // namespace shoal::dist
