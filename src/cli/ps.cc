// `shoal ps server`: one parameter server process (ps/server.h) that
// serves until SIGINT or SIGTERM, then writes its last snapshot and prints
// what it served. Workers prove the job token (SHOAL_JOB_TOKEN).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "shoal/core/env.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/net/store.h"
#include "shoal/ps/attach.h"
#include "shoal/ps/server.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"

namespace shoal::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

}  // namespace

PsCommand add_ps_command(CLI::App& app) {
  PsCommand c;
  c.opts = std::make_shared<PsServerFlags>();
  auto& f = *c.opts;
  CLI::App* ps = app.add_subcommand("ps", "Parameter-server roles");
  ps->require_subcommand(1);
  c.server = ps->add_subcommand("server", "Serve a shard of the parameters until SIGTERM");
  c.server->add_option("--host", f.host, "Address to listen on")->capture_default_str();
  c.server->add_option("--port", f.port, "Port (0 = any free one, printed)")
      ->check(CLI::Range(0, 65535));
  c.server->add_option("--mode", f.mode, "sync, async or bounded")
      ->check(CLI::IsMember({"sync", "async", "bounded"}))
      ->capture_default_str();
  c.server->add_option("--staleness", f.staleness, "bounded: steps ahead of the slowest worker")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c.server
      ->add_option("--optimizer", f.optimizer, "sgd, momentum, nesterov, adam, adamw, lars, lamb")
      ->capture_default_str();
  c.server->add_option("--lr", f.lr, "Learning rate")->check(positive());
  c.server->add_option("--momentum", f.momentum, "Momentum")->check(CLI::Range(0.0, 0.999999));
  c.server->add_option("--snapshot", f.snapshot,
                       "Snapshot file: restored at start when it exists, written every "
                       "--snapshot-every updates and at exit");
  c.server->add_option("--metrics", f.metrics,
                       "Append a JSON line per second: bytes in/out, answers waiting, pushes, "
                       "updates, rounds, mean round-close time, each worker's lag");
  c.server
      ->add_option("--compress", f.compress,
                   "How workers push and pull: none, f16, bf16, 2bit:THRESHOLD[,f16|bf16]")
      ->capture_default_str();
  c.server->add_option("--snapshot-every", f.snapshot_every, "Updates between snapshots")
      ->check(CLI::NonNegativeNumber);
  c.server->add_flag("--stale-lr", f.stale_lr,
                     "async/bounded: divide each push's learning rate by its staleness");
  c.sched = std::make_shared<PsSchedulerFlags>();
  c.scheduler = ps->add_subcommand(
      "scheduler",
      "The job's rendezvous point: servers register, workers find them; exits when every worker "
      "that joined has left");
  c.scheduler->add_option("--host", c.sched->host, "Address to listen on")->capture_default_str();
  c.scheduler->add_option("--port", c.sched->port, "Port (default DMLC_PS_ROOT_PORT)")
      ->check(CLI::Range(0, 65535));
  c.join_flags = std::make_shared<PsJoinFlags>();
  c.join = add_ps_join_command(*ps, *c.join_flags);
  return c;
}

namespace {

// In a job (DMLC_ROLE=server): publishes this server's address with the
// scheduler under its index (SHOAL_PS_SERVER_INDEX from `shoal run --ps`,
// which keeps it across a restart; else the next free one).
Result<std::unique_ptr<net::Store>> register_server(const std::string& host, int port,
                                                    const std::string& snapshot) {
  SHOAL_ASSIGN_OR_RETURN(ps::JobEnv e, ps::job_env());
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<net::Store> store, ps::connect_scheduler(e));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t index, env::get_int("SHOAL_PS_SERVER_INDEX", -1));
  // Started again by hand on its snapshot: the index it registered under
  // before (kept beside the snapshot), so workers find it where they lost it.
  const std::string kept = snapshot.empty() ? "" : snapshot + ".index";
  if (index < 0 && !kept.empty() && std::filesystem::exists(kept)) {
    SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(kept));
    SHOAL_ASSIGN_OR_RETURN(index, env::parse_int(text, kept));
  }
  if (index < 0) {
    SHOAL_ASSIGN_OR_RETURN(std::int64_t n, store->add("ps/servers", 1));
    index = n - 1;
  }
  if (index >= e.num_servers)
    return invalid_argument(
        "server index {} is beyond DMLC_NUM_SERVER={}: every server slot of this job is taken "
        "(a server started again without its --snapshot? SHOAL_PS_SERVER_INDEX=i takes slot i)",
        index, e.num_servers);
  // Listening on every interface, it is reached by its node's name.
  std::string self = host;
  if (host == "0.0.0.0") {
    char name[256] = {0};
    if (gethostname(name, sizeof name - 1) == 0) self = name;
  }
  const std::string advertised = env::get("DMLC_NODE_HOST").value_or(self);
  SHOAL_RETURN_IF_ERROR(
      store->set(ps::server_key(static_cast<int>(index)), fmt::format("{}:{}", advertised, port)));
  if (!kept.empty()) SHOAL_RETURN_IF_ERROR(write_file_atomic(kept, std::to_string(index)));
  fmt::print("ps server: registered as server {} of {} with the scheduler at {}\n", index,
             e.num_servers, e.root);
  return store;
}

// One line of the server's metrics (what `--metrics` appends each second).
std::string metrics_line(const ps::Server& s, double elapsed) {
  const ps::ShardStats st = s.stats();
  const ps::Server::Traffic tr = s.traffic();
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

// "" while the job runs; else why this server should stop: every worker
// that joined has left, or the scheduler is gone.
std::string job_over(net::Store& store) {
  auto joined = store.add("ps/workers", 0);
  auto left = store.add("ps/left", 0);
  if (!joined.ok() || !left.ok()) return "the scheduler is gone";
  auto e = ps::job_env();
  if (e.ok() && *joined >= e->num_workers && *left >= *joined)
    return fmt::format("all {} workers have left", *joined);
  return "";
}

}  // namespace

int run_ps_server(const PsServerFlags& f) {
  ps::ServerOptions o;
  o.configured = f.configured;
  auto mode = ps::parse_mode(f.mode);
  if (!mode.ok()) {
    SHOAL_LOG_ERROR("shoal ps server: {}", mode.status().message());
    return 2;
  }
  o.shard.mode = *mode;
  o.shard.staleness = f.staleness;
  o.shard.optimizer.name = f.optimizer;
  o.shard.optimizer.momentum = f.momentum;
  o.shard.lr = f.lr;
  o.shard.stale_lr = f.stale_lr;
  auto compression = ps::parse_compression(f.compress);
  if (!compression.ok()) {
    SHOAL_LOG_ERROR("shoal ps server: {}", compression.status().message());
    return 2;
  }
  o.shard.compression = *compression;
  auto bound = ps::slice_bound_env();
  if (!bound.ok()) {
    SHOAL_LOG_ERROR("shoal ps server: {}", bound.status().message());
    return 2;
  }
  o.shard.slice_bound = *bound;
  o.snapshot = f.snapshot;
  o.snapshot_every = f.snapshot_every;
  auto hb = env::get_double("SHOAL_PS_HEARTBEAT", 30);
  if (!hb.ok() || *hb < 0) {
    SHOAL_LOG_ERROR("shoal ps server: SHOAL_PS_HEARTBEAT must be a number >= 0 (0 = off)");
    return 2;
  }
  o.heartbeat_s = *hb;
  const std::string token = env::get("SHOAL_JOB_TOKEN").value_or("");
  if (token.empty())
    SHOAL_LOG_WARN(
        "no job token (SHOAL_JOB_TOKEN): any process that reaches this port can push and pull");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto s = ps::Server::start(f.host, f.port, token, o);
  if (!s.ok()) {
    SHOAL_LOG_ERROR("shoal ps server: {}", s.status().to_string());
    return 2;
  }
  if (f.configured)
    fmt::print("ps server: listening on {}:{} ({}, {} lr {})\n", f.host, (*s)->port(), f.mode,
               f.optimizer, f.lr);
  else
    fmt::print("ps server: listening on {}:{} (options from the first worker)\n", f.host,
               (*s)->port());
  std::unique_ptr<net::Store> store;
  if (ps::in_ps_job()) {
    auto r = register_server(f.host, (*s)->port(), f.snapshot);
    if (!r.ok()) {
      SHOAL_LOG_ERROR("shoal ps server: {}", r.status().to_string());
      return 2;
    }
    store = std::move(r).value();
  }
  std::fflush(stdout);
  std::string why = "SIGTERM";
  std::ofstream metrics;
  if (!f.metrics.empty()) metrics.open(f.metrics, std::ios::app);
  const auto t0 = std::chrono::steady_clock::now();
  // A line at start, each second, and at the end: rates need two, however
  // short the job.
  auto write_metrics = [&] {
    if (!metrics.is_open()) return;
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    metrics << metrics_line(**s, t) << "\n" << std::flush;
  };
  write_metrics();
  for (int tick = 0; !g_stop; ++tick) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (tick % 20 == 19) write_metrics();
    if (store && tick % 4 == 0) {
      // The scheduler (and `shoal run --ps`) learns of workers dropped for
      // silence: a sync job cannot go on without them.
      for (const auto& [w, line] : (*s)->take_drops())
        (void)store->set("ps/dropped", fmt::format("{} {}", w, line));
      if (std::string done = job_over(*store); !done.empty()) {
        why = done;
        break;
      }
    }
  }
  write_metrics();
  fmt::print("ps server: stopping: {}\n", why);
  std::fflush(stdout);  // a pipe buffers: out before the last snapshot
  const ps::ShardStats st = (*s)->stats();
  const ps::Server::Traffic tr = (*s)->traffic();
  s->reset();  // stops serving and writes the last snapshot
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
  return 0;
}

}  // namespace shoal::cli
