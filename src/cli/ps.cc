// `shoal ps server`: one parameter server process (ps/server.h) that
// serves until SIGINT or SIGTERM, then writes its last snapshot and prints
// what it served. Workers prove the job token (SHOAL_JOB_TOKEN).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <thread>

#include "cli/commands.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/ps/server.h"

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
  c.server->add_option("--lr", f.lr, "Learning rate")->check(CLI::PositiveNumber);
  c.server->add_option("--momentum", f.momentum, "Momentum")->check(CLI::Range(0.0, 0.999999));
  c.server->add_option("--snapshot", f.snapshot,
                       "Snapshot file: restored at start when it exists, written every "
                       "--snapshot-every updates and at exit");
  c.server->add_option("--snapshot-every", f.snapshot_every, "Updates between snapshots")
      ->check(CLI::NonNegativeNumber);
  return c;
}

int run_ps_server(const PsServerFlags& f) {
  ps::ServerOptions o;
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
  o.snapshot = f.snapshot;
  o.snapshot_every = f.snapshot_every;
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
  fmt::print("ps server: listening on {}:{} ({}, {} lr {})\n", f.host, (*s)->port(), f.mode,
             f.optimizer, f.lr);
  std::fflush(stdout);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const ps::ShardStats st = (*s)->stats();
  s->reset();  // stops serving and writes the last snapshot
  fmt::print("ps server: stopped; {} pushes, {} updates, {} sync rounds, {} duplicates ignored\n",
             st.pushes, st.applied, st.rounds, st.duplicates);
  return 0;
}

}  // namespace shoal::cli
