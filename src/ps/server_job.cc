// ps::ServerJob (ps/roles.h): one server process of a job, moved out of
// the CLI so that every front end runs the same role.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "shoal/core/env.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/core/ps_keys.h"
#include "shoal/net/interfaces.h"
#include "shoal/net/store.h"
#include "shoal/ps/attach.h"
#include "shoal/ps/roles.h"
#include "shoal/runtime/backend.h"

namespace shoal::ps {
namespace {

// In a job: publishes this server's address with the scheduler under its
// index (SHOAL_PS_SERVER_INDEX from `shoal run --ps`, which keeps it across
// a restart; else the next free one).
Result<std::unique_ptr<net::Store>> register_server(const JobEnv& e, const std::string& host,
                                                    int port, const std::string& snapshot) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<net::Store> store, connect_scheduler(e));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t index, env::get_int("SHOAL_PS_SERVER_INDEX", -1));
  // Started again by hand on its snapshot: the index it registered under
  // before (kept beside the snapshot), so workers find it where they lost it.
  const std::string kept = snapshot.empty() ? "" : snapshot + ".index";
  if (index < 0 && !kept.empty() && std::filesystem::exists(kept)) {
    SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(kept));
    SHOAL_ASSIGN_OR_RETURN(index, env::parse_int(text, kept));
  }
  if (index < 0) {
    SHOAL_ASSIGN_OR_RETURN(std::int64_t n, store->add(ps_keys::kServers, 1));
    index = n - 1;
  }
  if (index >= e.num_servers)
    return invalid_argument(
        "server index {} is beyond DMLC_NUM_SERVER={}: every server slot of this job is taken "
        "(a server started again without its --snapshot? SHOAL_PS_SERVER_INDEX=i takes slot i)",
        index, e.num_servers);
  // Listening on every interface, it is reached by the address of the one
  // that routes to the scheduler (or SHOAL_SOCKET_IFNAME's), as the ranks
  // of a data-parallel job are: its host name may resolve to 127.0.1.1
  // (Debian's /etc/hosts), which no other host can reach.
  std::string self = host;
  if (host == "0.0.0.0" && !env::get("DMLC_NODE_HOST")) {
    SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(e.root, "DMLC_PS_ROOT_URI"));
    std::string why;
    auto ifc = net::choose_interface(hp.first, &why);
    if (!ifc.ok()) return ifc.status().with_context("the address this server publishes");
    self = ifc->addr;
    fmt::print("ps server: publishing {} (interface {}, chosen by {})\n", self, ifc->name, why);
  }
  const std::string advertised = env::get("DMLC_NODE_HOST").value_or(self);
  SHOAL_RETURN_IF_ERROR(
      store->set(ps_keys::server(static_cast<int>(index)), fmt::format("{}:{}", advertised, port)));
  if (!kept.empty()) SHOAL_RETURN_IF_ERROR(write_file_atomic(kept, std::to_string(index)));
  fmt::print("ps server: registered as server {} of {} with the scheduler at {}\n", index,
             e.num_servers, e.root);
  return store;
}

// One line of the server's metrics (what `--metrics` appends each second).
std::string metrics_line(const Server& s, double elapsed) {
  const ShardStats st = s.stats();
  const Server::Traffic tr = s.traffic();
  nlohmann::json lag = nlohmann::json::object();
  for (const auto& [w, l] : st.lag) lag[std::to_string(w)] = l;
  nlohmann::json j = {
      {"kind", "ps_server"},
      {"elapsed_seconds", elapsed},
      {"trace_us", runtime::trace_clock_us()},  // the workers' trace clock
      {"bytes_in", tr.bytes_in},
      {"bytes_out", tr.bytes_out},
      {"shm_bytes_in", tr.shm_in},
      {"shm_bytes_out", tr.shm_out},
      {"queue", tr.queue},
      {"pushes", st.pushes},
      {"updates", st.applied},
      {"rounds", st.rounds},
      {"duplicates", st.duplicates},
      {"round_close_ms", st.rounds ? 1e3 * st.round_seconds / static_cast<double>(st.rounds) : 0.0},
      {"staleness_mean", st.staleness_pushes ? static_cast<double>(st.staleness_sum) /
                                                   static_cast<double>(st.staleness_pushes)
                                             : 0.0},
      {"lag", lag},
  };
  return j.dump();
}

// "" while the job runs; else why this server should stop. A sync job
// that lost a worker (`lost`, "id why"; "" if none) ends once the others
// have left: the lost one never will. Nor will a worker that died in an
// asynchronous job (killed, its connection closed, as a worker started by
// hand on another host may be): once no worker is connected, those count
// as gone. Before, the job's server waited for them until `shoal run`
// ended it 10 s after its own workers, cutting off any still training.
std::string job_over(net::Store& store, int num_workers, const std::string& lost,
                     Server::Presence now) {
  auto joined = store.add(ps_keys::kWorkers, 0);
  auto left = store.add(ps_keys::kLeft, 0);
  if (!joined.ok() || !left.ok()) return "the scheduler is gone";
  if (ps_keys::job_over(*joined, *left, num_workers))
    return fmt::format("all {} workers have left", *joined);
  if (now.connected == 0 && now.gone > 0 &&
      ps_keys::job_over(*joined, *left + now.gone, num_workers))
    return fmt::format("all {} workers have left ({} by a closed connection)", *joined, now.gone);
  if (!lost.empty() && *left + 1 >= *joined) return ps_keys::lost_reason(lost);
  return "";
}

// Serves until stop or the job's end; returns why it stopped.
std::string serve(Server& s, net::Store* store, int num_workers, const std::string& metrics_path,
                  const std::atomic<bool>& stop) {
  std::ofstream metrics;
  if (!metrics_path.empty()) metrics.open(metrics_path, std::ios::app);
  const auto t0 = std::chrono::steady_clock::now();
  // A line at start, each second, and at the end: rates need two, however
  // short the job.
  auto write_metrics = [&] {
    if (!metrics.is_open()) return;
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    metrics << metrics_line(s, t) << "\n" << std::flush;
  };
  write_metrics();
  std::string why = "SIGTERM";
  int lost_at = -1;  // the tick a lost worker ended the sync job
  for (int tick = 0; !stop; ++tick) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (tick % 20 == 19) write_metrics();
    if (store && tick % 4 == 0) {
      // The scheduler (and `shoal run --ps`) learns of workers dropped for
      // silence: a sync job cannot go on without them.
      for (const auto& [w, line] : s.take_drops())
        (void)store->set(ps_keys::kDropped, fmt::format("{} {}", w, line));
      // A sync job that lost a worker: the others are refused at their next
      // push and leave. Stop when they have, or after 10 s.
      const std::string lost = s.lost();
      if (!lost.empty() && lost_at < 0) {
        lost_at = tick;
        (void)store->set(ps_keys::kLost, lost);
      }
      if (std::string done = job_over(*store, num_workers, lost, s.presence()); !done.empty()) {
        why = done;
        break;
      }
      if (lost_at >= 0 && tick - lost_at >= 200) {
        why = ps_keys::lost_reason(lost);
        break;
      }
    }
  }
  write_metrics();
  return why;
}

void print_served(const ShardStats& st, const Server::Traffic& tr) {
  fmt::print("ps server: stopped; {} pushes{}, {} updates, {} sync rounds, {} duplicates ignored\n",
             st.pushes, st.row_pushes ? fmt::format(" ({} of them rows)", st.row_pushes) : "",
             st.applied, st.rounds, st.duplicates);
  std::string per;
  for (const auto& [w, n] : st.by_worker)
    per += fmt::format("{}worker {}: {}", per.empty() ? "" : ", ", w, n);
  if (!per.empty()) fmt::print("ps server: pushes by worker: {}\n", per);
  fmt::print(
      "ps server: traffic: {} bytes in and {} out over sockets, {} read from and {} written to "
      "workers' shared memory\n",
      tr.bytes_in, tr.bytes_out, tr.shm_in, tr.shm_out);
}

}  // namespace

Status ServerJob::run(ServerJobOptions o, const std::atomic<bool>& stop) {
  // The environment, read once: the whole job's in a job; alone, what a
  // server reads of it.
  JobEnv e;
  const bool in_job = in_ps_job();
  if (in_job) {
    SHOAL_ASSIGN_OR_RETURN(e, job_env());
  } else {
    SHOAL_RETURN_IF_ERROR(read_server_env(e));
  }
  o.server.heartbeat_s = e.heartbeat_s;
  if (in_job) o.server.job_workers = e.num_workers;
  o.server.shard.slice_bound = e.slice_bound;
  if (e.token.empty())
    SHOAL_LOG_WARN(
        "no job token (SHOAL_JOB_TOKEN): any process that reaches this port can push and pull");
  if (o.host.empty()) {  // workers on other hosts reach it when the scheduler is on one
    std::string root_host;
    if (in_job) {
      SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(e.root, "DMLC_PS_ROOT_URI"));
      root_host = hp.first;
    }
    o.host = default_listen_host(root_host);
  }
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Server> s,
                         Server::start(o.host, o.port, e.token, o.server));
  const ShardOptions& sh = o.server.shard;
  if (o.server.configured)
    fmt::print("ps server: listening on {}:{} ({}, {} lr {})\n", o.host, s->port(),
               mode_name(sh.mode), sh.optimizer.name, sh.lr);
  else
    fmt::print("ps server: listening on {}:{} (options from the first worker)\n", o.host,
               s->port());
  std::unique_ptr<net::Store> store;
  if (in_job) {
    SHOAL_ASSIGN_OR_RETURN(store, register_server(e, o.host, s->port(), o.server.snapshot));
  }
  std::fflush(stdout);
  const std::string why = serve(*s, store.get(), e.num_workers, o.metrics, stop);
  fmt::print("ps server: stopping: {}\n", why);
  std::fflush(stdout);  // a pipe buffers: out before the last snapshot
  const ShardStats st = s->stats();
  const Server::Traffic tr = s->traffic();
  const std::string lost = s->lost();
  s.reset();  // stops serving and writes the last snapshot
  print_served(st, tr);
  if (!lost.empty()) return aborted("{}", ps_keys::lost_reason(lost));
  return ok_status();
}

}  // namespace shoal::ps
