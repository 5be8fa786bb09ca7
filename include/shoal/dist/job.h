// One training process's place in its job. Reads the launcher environment
// (shoal run, torchrun, mpirun, srun, or DMLC_* for a parameter-server
// job), applies what it asks of the trainer (the default run directory
// named by the job id, resuming after a restart, per-rank traces), and joins
// the other processes the way `how.dist` says: data parallel over a
// Communicator (dist::attach, layout.h) or as a parameter-server worker (ps). One
// process alone joins nothing. The CLI and the Python bindings both start
// training through it, so a script behaves as `shoal train` does.
#pragma once

#include <memory>
#include <string>

#include "shoal/core/status.h"
#include "shoal/dist/layout.h"
#include "shoal/dp/allreduce.h"
#include "shoal/train/trainer.h"

namespace shoal::comm {
class Communicator;
}
namespace shoal::ps {
class WorkerJob;
}

namespace shoal::dist {

struct JoinOptions {
  std::string dist = "auto";  // allreduce, ps, or auto (ps when DMLC_ROLE is set)
  dp::DpOptions dp;           // --dist allreduce
  Layout layout;              // --dist allreduce: --dp x --tp x --pp
  std::string ps_mode = "sync";
  int staleness = 2;  // --ps-mode bounded
  // ps/codec.h parse_compression; "" follows the precision (bf16 under
  // --precision bf16, else none).
  std::string ps_compress;
  bool ps_stale_lr = false;  // ps::ShardOptions::stale_lr
};

class Job {
 public:
  // Joins the job described by the environment, filling o (rank, world,
  // threads, hooks, out, resume, trace). The Job must outlive the trainer
  // built from o.
  static Result<std::unique_ptr<Job>> join(train::TrainOptions& o, const JoinOptions& j);
  ~Job();

  bool parameter_server() const { return ps_ != nullptr; }
  int rank() const { return rank_; }
  int world() const { return world_; }

 private:
  Job() = default;
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<ps::WorkerJob> ps_;
  int rank_ = 0, world_ = 1;
};

}  // namespace shoal::dist
