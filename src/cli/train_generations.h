// One generation of `shoal train` over the launcher's ranks (train.cc),
// and an elastic job's generations (train_elastic.cc: `shoal run
// --elastic`), which train each generation as one. Private to cli.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "shoal/core/status.h"
#include "shoal/dist/elastic.h"
#include "shoal/dist/job.h"
#include "shoal/train/trainer.h"

namespace shoal::cli {

// How one generation of training ended: the exit code, and for an elastic
// job the step's error and the state kept at the last step boundary.
struct Ended {
  int code = 0;
  Status failed;
  std::shared_ptr<const train::CheckpointState> committed;
  std::int64_t reached = 0;  // steps the trainer had finished
};

// Several ranks in the environment (shoal run, mpirun, srun, torchrun),
// or a parameter-server job's variables: join them, and train.
Ended train_once(train::TrainOptions o, const dist::JoinOptions& jo, const std::string& flags_yaml,
                 const PlanPrediction* plan = nullptr);

// `shoal run --elastic MIN`: this rank's generations, under a lease.
int train_elastic(train::TrainOptions o, const dist::JoinOptions& jo, const std::string& flags_yaml,
                  dist::ElasticEnv el);

}  // namespace shoal::cli
