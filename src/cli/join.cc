// `shoal join --job DIR [--ranks K]`: asks the launcher of an elastic
// data-parallel job (`shoal run -n N --elastic MIN:MAX --job-dir DIR`) for K
// more ranks. The request is a counter in the job's store
// (elastic_keys::grow); the launcher starts the ranks up to MAX, and each
// joins at a step boundary with the state of rank 0 (docs/elastic.md).
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/job_env.h"
#include "shoal/core/elastic_keys.h"
#include "shoal/core/logging.h"

namespace shoal::cli {
namespace {

Status join(const JoinFlags& f) {
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
