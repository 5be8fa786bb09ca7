// `shoal ps ...`: the parameter-server roles' flags. `shoal ps server` runs
// ps::ServerJob (ps/roles.h) until SIGINT or SIGTERM or the job's end.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "shoal/core/logging.h"
#include "shoal/ps/codec.h"
#include "shoal/ps/roles.h"
#include "shoal/ps/shard.h"

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
  c.server->add_option("--host", f.host,
                       "Address to listen on (default: 127.0.0.1, or every interface when the "
                       "job's DMLC_PS_ROOT_URI is not loopback, publishing the address that "
                       "routes to it)");
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
  c.scheduler->add_option("--host", c.sched->host,
                          "Address to listen on (default: 127.0.0.1 when DMLC_PS_ROOT_URI is "
                          "unset or loopback, else every interface, for the other hosts)");
  c.scheduler->add_option("--port", c.sched->port, "Port (default DMLC_PS_ROOT_PORT)")
      ->check(CLI::Range(0, 65535));
  c.join_flags = std::make_shared<PsJoinFlags>();
  c.join = add_ps_join_command(*ps, *c.join_flags);
  return c;
}

int run_ps_server(const PsServerFlags& f) {
  auto fail = [](const Status& st) {
    SHOAL_LOG_ERROR("shoal ps server: {}", st.to_string());
    return 2;
  };
  ps::ServerJobOptions o;
  o.host = f.host;
  o.port = f.port;
  o.metrics = f.metrics;
  o.server.configured = f.configured;
  auto mode = ps::parse_mode(f.mode);
  if (!mode.ok()) return fail(mode.status());
  o.server.shard.mode = *mode;
  o.server.shard.staleness = f.staleness;
  o.server.shard.optimizer.name = f.optimizer;
  o.server.shard.optimizer.momentum = f.momentum;
  o.server.shard.lr = f.lr;
  o.server.shard.stale_lr = f.stale_lr;
  auto compression = ps::parse_compression(f.compress);
  if (!compression.ok()) return fail(compression.status());
  o.server.shard.compression = *compression;
  o.server.snapshot = f.snapshot;
  o.server.snapshot_every = f.snapshot_every;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (Status st = ps::ServerJob::run(o, g_stop); !st.ok()) return fail(st);
  return 0;
}

}  // namespace shoal::cli
