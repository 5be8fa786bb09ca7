// ps::Scheduler (ps/roles.h): a parameter-server job's rendezvous point in
// the ps-lite/MXNet role. It serves the job's store (authenticated by
// SHOAL_JOB_TOKEN) where servers publish their addresses and workers take
// ids, and reports who registered.
#include <chrono>
#include <thread>

#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/core/ps_keys.h"
#include "shoal/net/interfaces.h"
#include "shoal/net/store.h"
#include "shoal/ps/attach.h"
#include "shoal/ps/roles.h"

namespace shoal::ps {
namespace {

Result<int> scheduler_port(int port) {
  if (port >= 0) return port;
  SHOAL_ASSIGN_OR_RETURN(std::int64_t p, env::get_int("DMLC_PS_ROOT_PORT", 0));
  if (p < 0 || p > 65535) return invalid_argument("DMLC_PS_ROOT_PORT={} is not a port", p);
  return static_cast<int>(p);
}

// A sync job that lost a worker (a server published why): the waits of
// the workers left end with the reason; the scheduler stops once they have
// left, or after 10 s, with the reason as its error.
Status end_lost(net::Store& s, net::TcpStoreServer& server, const std::string& lost) {
  const std::string why = ps_keys::lost_reason(lost);
  fmt::print("ps scheduler: {}\n", why);
  std::fflush(stdout);
  server.end_waits(why);
  for (int i = 0; i < 100; ++i) {
    SHOAL_ASSIGN_OR_RETURN(std::int64_t j, s.add(ps_keys::kWorkers, 0));
    SHOAL_ASSIGN_OR_RETURN(std::int64_t l, s.add(ps_keys::kLeft, 0));
    if (l + 1 >= j) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return aborted("{}", why);
}

// Watches the store through a client of its own; returns when the job is
// over or `stop` is set.
Status watch(net::Store& s, net::TcpStoreServer& server, int num_servers, int num_workers,
             const std::atomic<bool>& stop) {
  int servers = 0;
  std::int64_t joined = 0, left = 0;
  while (!stop) {
    while (servers < num_servers) {
      SHOAL_ASSIGN_OR_RETURN(std::string addr, s.peek(ps_keys::server(servers)));
      if (addr.empty()) break;
      fmt::print("ps scheduler: server {} at {}\n", servers++, addr);
    }
    SHOAL_ASSIGN_OR_RETURN(std::int64_t j, s.add(ps_keys::kWorkers, 0));
    SHOAL_ASSIGN_OR_RETURN(std::int64_t l, s.add(ps_keys::kLeft, 0));
    if (j != joined || l != left) {
      fmt::print("ps scheduler: {} worker{} joined, {} left\n", j, j == 1 ? "" : "s", l);
      joined = j;
      left = l;
    }
    std::fflush(stdout);
    if (ps_keys::job_over(joined, left, num_workers)) return ok_status();
    SHOAL_ASSIGN_OR_RETURN(std::string lost, s.peek(ps_keys::kLost));
    if (!lost.empty()) return end_lost(s, server, lost);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return ok_status();
}

}  // namespace

Status Scheduler::run(const std::string& host_flag, int port_flag, const std::atomic<bool>& stop) {
  SHOAL_ASSIGN_OR_RETURN(int port, scheduler_port(port_flag));
  // The roles on other hosts reach it at DMLC_PS_ROOT_URI, whose name may
  // resolve to 127.0.1.1 here (Debian): listen on every interface then.
  const std::string host = host_flag.empty()
                               ? default_listen_host(env::get("DMLC_PS_ROOT_URI").value_or(""))
                               : host_flag;
  // As every role reads them: set, and >= 1 (a default here would let the
  // scheduler wait for a job its workers refuse to join).
  SHOAL_ASSIGN_OR_RETURN(int num_servers, role_count("DMLC_NUM_SERVER"));
  SHOAL_ASSIGN_OR_RETURN(int num_workers, role_count("DMLC_NUM_WORKER"));
  const std::string token = env::get("SHOAL_JOB_TOKEN").value_or("");
  if (token.empty())
    SHOAL_LOG_WARN("no job token (SHOAL_JOB_TOKEN): any process that reaches this port can join");
  SHOAL_ASSIGN_OR_RETURN(auto server, net::TcpStoreServer::start(host, port, token));
  const std::string self = host == "0.0.0.0" ? "127.0.0.1" : host;
  SHOAL_ASSIGN_OR_RETURN(auto client, net::TcpStore::connect(self, server->port(),
                                                             Deadline::after_seconds(10), token));
  SHOAL_RETURN_IF_ERROR(agree_on_counts(*client, num_servers, num_workers, "the scheduler"));
  fmt::print("ps scheduler: listening on {}:{} for {} servers and {} workers\n", host,
             server->port(), num_servers, num_workers);
  std::fflush(stdout);
  SHOAL_RETURN_IF_ERROR(watch(*client, *server, num_servers, num_workers, stop));
  fmt::print("ps scheduler: {}\n", stop ? "stopped" : "every worker has left; done");
  return ok_status();
}

}  // namespace shoal::ps
