// `shoal ps join --job DIR [--workers K]`: asks the launcher of an elastic
// parameter-server job (`shoal run --ps S,W --ps-elastic MIN:MAX`) for K
// more workers. The launcher left the job's store address and token in
// DIR/job.env; the request is a counter in that store (ps/grow), which the
// launcher honours up to MAX.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/job_env.h"
#include "shoal/core/logging.h"
#include "shoal/core/ps_keys.h"

namespace shoal::cli {
namespace {

Status join(const PsJoinFlags& f) {
  SHOAL_ASSIGN_OR_RETURN(
      Asked a,
      ask_job(f.job, "the --ps-snapshots directory of a job run with --ps-elastic",
              ps_keys::kElastic, ps_keys::kGrow, f.workers, "was not started with --ps-elastic"));
  fmt::print(
      "shoal ps join: asked job {} for {} more worker{} (--ps-elastic {}; {} asked for in "
      "all)\n",
      a.job, f.workers, f.workers == 1 ? "" : "s", a.limit, a.total);
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
