#include "shoal/core/launch_env.h"

#include <string_view>

#include "shoal/core/env.h"

namespace shoal {

Result<LaunchEnv> launch_env() {
  LaunchEnv e;
  auto pick = [&](const char* r, const char* w, const char* lr, const char* src) -> Result<bool> {
    auto rv = env::get(r);
    auto wv = env::get(w);
    if (!rv || !wv) return false;
    SHOAL_ASSIGN_OR_RETURN(std::int64_t rank, env::parse_int(*rv, r));
    SHOAL_ASSIGN_OR_RETURN(std::int64_t world, env::parse_int(*wv, w));
    if (world < 1 || rank < 0 || rank >= world)
      return invalid_argument("{}={} / {}={}: rank must be in [0, world size)", r, rank, w, world);
    e.rank = static_cast<int>(rank);
    e.world = static_cast<int>(world);
    if (lr) {
      SHOAL_ASSIGN_OR_RETURN(std::int64_t l, env::get_int(lr, 0));
      e.local_rank = static_cast<int>(l);
    }
    e.source = src;
    return true;
  };
  struct Src {
    const char *r, *w, *lr, *name;
  } srcs[] = {
      {"SHOAL_RANK", "SHOAL_WORLD_SIZE", "SHOAL_LOCAL_RANK", "SHOAL_*"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun (RANK/WORLD_SIZE)"},
      // A Kubernetes Indexed Job's pod whose manifest sets no RANK.
      {"JOB_COMPLETION_INDEX", "WORLD_SIZE", nullptr, "Kubernetes Indexed Job"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OpenMPI"},
      {"PMIX_RANK", "PMI_SIZE", nullptr, "PMIx"},
      {"PMI_RANK", "PMI_SIZE", nullptr, "PMI"},
      {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "Slurm"},
  };
  // A batch script's shell (sbatch -n 2) has SLURM_PROCID=0 and
  // SLURM_NTASKS=2 but is no job step: a process started there is one
  // process, not rank 0 of 2 waiting for peers that srun never started.
  const auto step = env::get("SLURM_STEP_ID");
  const bool slurm_step = step && *step != "batch" && *step != "extern" && *step != "4294967294" &&
                          *step != "4294967293";
  bool found = false;
  for (const auto& s : srcs) {
    if (std::string_view(s.name) == "Slurm" && !slurm_step) continue;
    SHOAL_ASSIGN_OR_RETURN(found, pick(s.r, s.w, s.lr, s.name));
    if (found) break;
  }
  if (!found)
    e.source = env::get("SLURM_PROCID") && !slurm_step
                   ? "none (single process: a Slurm batch shell, not a job step)"
                   : "none (single process)";
  if (auto st = env::get("SHOAL_STORE")) {
    e.store = *st;
  } else if (auto ma = env::get("MASTER_ADDR")) {
    auto mp = env::get("MASTER_PORT");
    if (!mp) return invalid_argument("MASTER_ADDR is set but MASTER_PORT is not");
    e.store = (ma->find(':') != std::string::npos ? "[" + *ma + "]" : *ma) + ":" + *mp;
  }
  e.job_id = env::get("SHOAL_JOB_ID").value_or("");
  SHOAL_ASSIGN_OR_RETURN(std::int64_t restart, env::get_int("SHOAL_RESTART_COUNT", 0));
  e.restart = static_cast<int>(restart);
  e.trace = env::get("SHOAL_TRACE").value_or("");
  return e;
}

}  // namespace shoal
