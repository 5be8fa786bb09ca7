// `shoal join --job DIR [--ranks K]`: asks the launcher of an elastic
// data-parallel job (`shoal run -n N --elastic MIN:MAX --job-dir DIR`) for K
// more ranks. The request is a counter in the job's store
// (elastic_keys::grow); the launcher starts the ranks up to MAX, and each
// joins at a step boundary with the state of rank 0 (docs/elastic.md).
// `shoal join --job DIR -- CMD`: runs one rank here, on any host that
// reaches the store: CMD with the job's address and SHOAL_ELASTIC=join, so
// it claims its id (a place in the first generation while one is free,
// else a newcomer's); the way ranks of `shoal run --engine external` start.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>

#include "cli/commands.h"
#include "cli/job_env.h"
#include "shoal/core/elastic_keys.h"
#include "shoal/core/logging.h"

namespace shoal::cli {
namespace {

// Becomes CMD (exec), with the job's variables; returns only on failure.
Status run_here(const JoinFlags& f) {
  SHOAL_ASSIGN_OR_RETURN(auto env, read_job_env(f.job,
                                                "the --job-dir of a job run with "
                                                "`shoal run --elastic`"));
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  setenv("SHOAL_ELASTIC", "join", 1);
  // The launcher's rank variables of this shell, if any, are not this job's.
  for (const char* k : {"SHOAL_RANK", "SHOAL_WORLD_SIZE", "SHOAL_LOCAL_RANK",
                        "SHOAL_LOCAL_WORLD_SIZE", "SHOAL_ELASTIC_ID", "SHOAL_ELASTIC_JOIN"})
    unsetenv(k);
  std::vector<char*> argv;
  for (const auto& a : f.cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  return unavailable("cannot start '{}': {}", f.cmd[0], std::strerror(errno));
}

Status join(const JoinFlags& f) {
  if (!f.cmd.empty() && f.ranks != 1)
    return invalid_argument(
        "--ranks {} with a command: a command runs one rank here (start it {} times, or leave "
        "the command out to have the launcher start them)",
        f.ranks, f.ranks);
  if (!f.cmd.empty()) return run_here(f);
  SHOAL_ASSIGN_OR_RETURN(
      Asked a,
      ask_job(f.job,
              "the --job-dir of a job run with `shoal run --elastic` (default runs/job-<id>)",
              elastic_keys::max(), elastic_keys::grow(), f.ranks,
              "is not an elastic data-parallel job"));
  fmt::print(
      "shoal join: asked job {} for {} more rank{} (--elastic max {}; {} asked for in all)\n",
      a.job, f.ranks, f.ranks == 1 ? "" : "s", a.limit, a.total);
  return ok_status();
}

}  // namespace

CLI::App* add_join_command(CLI::App& app, JoinFlags& f) {
  CLI::App* j = app.add_subcommand(
      "join", "Ask an elastic data-parallel job's launcher (shoal run --elastic) for more ranks");
  j->add_option("--job", f.job, "The job's --job-dir (holds job.env)")->required();
  j->add_option("--ranks", f.ranks, "How many more")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  j->add_option("cmd", f.cmd,
                "A rank to run here instead (after --), e.g. -- shoal train ...: it joins the "
                "job's first generation while a place is free, else at a step boundary");
  return j;
}

int run_join(const JoinFlags& f) {
  if (Status st = join(f); !st.ok()) {
    SHOAL_LOG_ERROR("shoal join: {}", st.to_string());
    return 2;
  }
  return 0;
}

}  // namespace shoal::cli
