// What the launcher that started this process says about it: rank, world,
// where the rendezvous store is, and (under `shoal run`) the job id, the
// restart count and where traces go. One place reads launcher variables;
// the communicator and the command line ask it. Sources, first found wins:
// SHOAL_* (shoal run), torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT),
// a Kubernetes Indexed Job (JOB_COMPLETION_INDEX with WORLD_SIZE),
// OpenMPI (OMPI_COMM_WORLD_*), PMI/PMIx (MPICH's Hydra), a Slurm job step
// (SLURM_PROCID/SLURM_STEP_NUM_TASKS; a batch shell without SLURM_STEP_ID
// is one process).
#pragma once

#include <string>

#include "shoal/core/status.h"

namespace shoal {

struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string store;   // host:port of the TCP store ("" when none is set)
  std::string source;  // which variables were used
  std::string job_id;  // SHOAL_JOB_ID: one id for every attempt of a job ("" = none)
  int restart = 0;     // SHOAL_RESTART_COUNT: 0, then 1, 2... after restarts
  std::string trace;   // SHOAL_TRACE: the prefix the launcher merges traces from
};
// Errors name the variable and its value (a rank outside the world, a
// malformed number, MASTER_ADDR without MASTER_PORT).
Result<LaunchEnv> launch_env();

}  // namespace shoal
