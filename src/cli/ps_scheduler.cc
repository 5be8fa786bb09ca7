// `shoal ps scheduler`: a parameter-server job's rendezvous point, in the
// ps-lite/MXNet role. It serves the job's store (authenticated by
// SHOAL_JOB_TOKEN) where servers publish their addresses and workers take
// ids, reports who registered, and exits once DMLC_NUM_WORKER workers have
// joined and every worker that joined has left (or on SIGINT/SIGTERM).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "cli/commands.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/net/store.h"
#include "shoal/ps/attach.h"

namespace shoal::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

Result<int> scheduler_port(const PsSchedulerFlags& f) {
  if (f.port >= 0) return f.port;
  SHOAL_ASSIGN_OR_RETURN(std::int64_t p, env::get_int("DMLC_PS_ROOT_PORT", 0));
  if (p < 0 || p > 65535) return invalid_argument("DMLC_PS_ROOT_PORT={} is not a port", p);
  return static_cast<int>(p);
}

// Watches the store through a client of its own; returns when the job is over.
Status watch(net::Store& s, int num_servers, int num_workers) {
  int servers = 0;
  std::int64_t joined = 0, left = 0;
  while (!g_stop) {
    while (servers < num_servers) {
      SHOAL_ASSIGN_OR_RETURN(std::string addr, s.peek(ps::server_key(servers)));
      if (addr.empty()) break;
      fmt::print("ps scheduler: server {} at {}\n", servers++, addr);
    }
    SHOAL_ASSIGN_OR_RETURN(std::int64_t j, s.add("ps/workers", 0));
    SHOAL_ASSIGN_OR_RETURN(std::int64_t l, s.add("ps/left", 0));
    if (j != joined || l != left) {
      fmt::print("ps scheduler: {} worker{} joined, {} left\n", j, j == 1 ? "" : "s", l);
      joined = j;
      left = l;
    }
    std::fflush(stdout);
    if (joined >= num_workers && left >= joined) return ok_status();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return ok_status();
}

}  // namespace

int run_ps_scheduler(const PsSchedulerFlags& f) {
  auto fail = [](const Status& st) {
    SHOAL_LOG_ERROR("shoal ps scheduler: {}", st.to_string());
    return 2;
  };
  auto port = scheduler_port(f);
  if (!port.ok()) return fail(port.status());
  // As every role reads them: set, and >= 1 (a default here would let the
  // scheduler wait for a job its workers refuse to join).
  auto n_servers = ps::role_count("DMLC_NUM_SERVER"), n_workers = ps::role_count("DMLC_NUM_WORKER");
  if (!n_servers.ok()) return fail(n_servers.status());
  if (!n_workers.ok()) return fail(n_workers.status());
  const std::string token = env::get("SHOAL_JOB_TOKEN").value_or("");
  if (token.empty())
    SHOAL_LOG_WARN("no job token (SHOAL_JOB_TOKEN): any process that reaches this port can join");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto server = net::TcpStoreServer::start(f.host, *port, token);
  if (!server.ok()) return fail(server.status());
  auto client =
      net::TcpStore::connect(f.host, (*server)->port(), Deadline::after_seconds(10), token);
  if (!client.ok()) return fail(client.status());
  if (Status st = ps::agree_on_counts(**client, *n_servers, *n_workers, "the scheduler"); !st.ok())
    return fail(st);
  fmt::print("ps scheduler: listening on {}:{} for {} servers and {} workers\n", f.host,
             (*server)->port(), *n_servers, *n_workers);
  std::fflush(stdout);
  if (Status st = watch(**client, static_cast<int>(*n_servers), static_cast<int>(*n_workers));
      !st.ok())
    return fail(st);
  fmt::print("ps scheduler: {}\n", g_stop ? "stopped" : "every worker has left; done");
  return 0;
}

}  // namespace shoal::cli
