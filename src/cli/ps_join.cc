// `shoal ps join --job DIR [--workers K]`: asks the launcher of an elastic
// parameter-server job (`shoal run --ps S,W --ps-elastic MIN:MAX`) for K
// more workers. The launcher left the job's store address and token in
// DIR/job.env; the request is a counter in that store (ps/grow), which the
// launcher honours up to MAX.
#include <CLI/CLI.hpp>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "cli/commands.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/core/ps_keys.h"
#include "shoal/net/socket.h"
#include "shoal/net/store.h"

namespace shoal::cli {
namespace {

Result<std::map<std::string, std::string>> read_job_env(const std::string& dir) {
  const std::string path = dir + "/job.env";
  auto text = read_file(path);
  if (!text.ok())
    return not_found(
        "{} is not there ({}): is {} the --ps-snapshots directory of a job run with "
        "--ps-elastic?",
        path, text.status().message(), dir);
  std::map<std::string, std::string> env;
  std::istringstream in(*text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos)
      return invalid_argument("{} line {}: '{}' is not KEY=VALUE", path, n, line);
    env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  for (const char* k : {"SHOAL_STORE", "SHOAL_JOB_TOKEN"})
    if (!env.count(k)) return invalid_argument("{} has no {}", path, k);
  return env;
}

// The job's store and its ps/elastic key. A store under a flood of
// connections refuses new ones until its handshake window drops them
// (10 s): a refusal is retried with backoff within 30 s, as workers do.
Result<std::pair<std::unique_ptr<net::TcpStore>, std::string>> reach_job(
    const std::pair<std::string, int>& hp, const std::string& token) {
  const Deadline dl = Deadline::after_seconds(30);
  for (int wait_ms = 50, tries = 1;; wait_ms = std::min(wait_ms * 2, 1000), ++tries) {
    auto store = net::TcpStore::connect(hp.first, hp.second, dl, token);
    Result<std::string> elastic =
        store.ok() ? (*store)->peek(ps_keys::kElastic) : Result<std::string>(store.status());
    if (elastic.ok()) return std::pair{std::move(store).value(), *elastic};
    if (elastic.status().code() != StatusCode::kUnavailable || dl.expired())
      return elastic.status().with_context(
          fmt::format("reaching the job's store at {}:{} ({} tries)", hp.first, hp.second, tries));
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  }
}

Status join(const PsJoinFlags& f) {
  SHOAL_ASSIGN_OR_RETURN(auto env, read_job_env(f.job));
  SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(env["SHOAL_STORE"], "the job's store"));
  SHOAL_ASSIGN_OR_RETURN(auto reached, reach_job(hp, env["SHOAL_JOB_TOKEN"]));
  auto& [store, elastic] = reached;
  if (elastic.empty())
    return failed_precondition("the job at {} was not started with --ps-elastic",
                               env["SHOAL_STORE"]);
  SHOAL_ASSIGN_OR_RETURN(std::int64_t asked, store->add(ps_keys::kGrow, f.workers));
  fmt::print(
      "shoal ps join: asked job {} for {} more worker{} (--ps-elastic {}; {} asked for in "
      "all)\n",
      env.count("SHOAL_JOB_ID") ? env["SHOAL_JOB_ID"] : env["SHOAL_STORE"], f.workers,
      f.workers == 1 ? "" : "s", elastic, asked);
  return ok_status();
}

}  // namespace

CLI::App* add_ps_join_command(CLI::App& ps, PsJoinFlags& f) {
  CLI::App* j = ps.add_subcommand(
      "join", "Ask an elastic job's launcher (shoal run --ps-elastic) for more workers");
  j->add_option("--job", f.job, "The job's --ps-snapshots directory (holds job.env)")->required();
  j->add_option("--workers", f.workers, "How many more")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  return j;
}

int run_ps_join(const PsJoinFlags& f) {
  if (Status st = join(f); !st.ok()) {
    SHOAL_LOG_ERROR("shoal ps join: {}", st.to_string());
    return 2;
  }
  return 0;
}

}  // namespace shoal::cli
