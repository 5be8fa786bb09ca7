#include "shoal/dist/job.h"

#include <cstdlib>

#include "shoal/comm/communicator.h"
#include "shoal/core/launch_env.h"
#include "shoal/core/logging.h"
#include "shoal/dist/plan.h"
#include "shoal/mp/accumulate.h"
#include "shoal/ps/attach.h"
#include "shoal/runtime/kernel.h"

namespace shoal::dist {

namespace {

// FILE.json -> FILE.rank<r>.json
std::string rank_path(const std::string& path, int rank) {
  std::string stem = path, ext;
  if (auto dot = path.rfind('.');
      dot != std::string::npos && path.find('/', dot) == std::string::npos) {
    stem = path.substr(0, dot);
    ext = path.substr(dot);
  }
  return fmt::format("{}.rank{}{}", stem, rank, ext.empty() ? ".json" : ext);
}

// What the launcher asks of the trainer, whatever the strategy.
void apply_launch_env(train::TrainOptions& o, const LaunchEnv& env) {
  // Started by `shoal run`: its job id names the default run directory (the
  // same for every rank and every attempt), and a restarted attempt resumes
  // from that directory's newest checkpoint.
  if (!env.job_id.empty() && o.out.empty()) {
    std::string model = o.model;
    if (auto slash = model.rfind('/'); slash != std::string::npos) model = model.substr(slash + 1);
    o.out = fmt::format("runs/{}-{}", model, env.job_id);
  }
  if (env.restart > 0) {
    if (!o.resume && env.rank == 0)
      SHOAL_LOG_INFO("restart {} of this job: resuming from the newest checkpoint in {}",
                     env.restart, o.out);
    o.resume = true;
  }
  if (!env.trace.empty() && o.trace.empty())
    o.trace = rank_path(env.trace, env.rank);  // the launcher merges these
  else if (!o.trace.empty() && env.world > 1)
    o.trace = rank_path(o.trace, env.rank);
}

// Data parallel over the job's ranks.
Result<std::unique_ptr<comm::Communicator>> join_allreduce(train::TrainOptions& o,
                                                           const JoinOptions& j) {
  if (o.deterministic) setenv("SHOAL_DETERMINISTIC", "1", 1);
  // `--plan auto` joined the ranks already, to calibrate on them.
  std::unique_ptr<comm::Communicator> comm = take_plan_communicator();
  if (!comm) {
    auto c = comm::Communicator::from_env();
    if (!c.ok()) return c.status().with_context("joining the job's ranks");
    comm = std::move(c).value();
  }
  // Ranks sharing this host split its cores unless --threads says
  // otherwise (before attach, which decides on overlap from the threads).
  // The count is the communicator's own (ranks grouped by host at
  // connect), so it holds under every launcher, not only those that
  // export a local world size; dp::attach logs the choice.
  if (o.threads == 0)
    o.threads = std::max(1, runtime::num_cores() / std::max(1, comm->local_size()));
  SHOAL_RETURN_IF_ERROR(attach(o, *comm, j.layout, j.dp));
  return comm;
}

// A worker of a parameter-server job.
Result<std::unique_ptr<ps::WorkerJob>> join_ps(train::TrainOptions& o, const JoinOptions& j) {
  if (j.dp.zero > 0 || j.layout.tp > 1 || j.layout.pp > 1)
    return invalid_argument(
        "--zero, --tp and --pp shard the model over all-reduce ranks; a parameter-server job "
        "(--dist ps) shards it over its servers: drop them or use --dist allreduce");
  if (micro_batches(j.layout) > 1)
    return invalid_argument(
        "--micro-batches {}: a parameter-server worker pushes the gradient of each batch it "
        "trains on; gradient accumulation is not built for --dist ps (use --dist allreduce, or "
        "a smaller --batch)",
        micro_batches(j.layout));
  SHOAL_ASSIGN_OR_RETURN(ps::JobEnv e, ps::job_env());
  if (!e.role.empty() && e.role != "worker")
    return invalid_argument("--dist ps trains as a worker, but DMLC_ROLE={}", e.role);
  SHOAL_ASSIGN_OR_RETURN(ps::Mode mode, ps::parse_mode(j.ps_mode));
  ps::ShardOptions so = ps::shard_options(o, mode, j.staleness);
  SHOAL_RETURN_IF_ERROR(ps::check_options(so));
  // Pushes and pulls follow --precision unless --ps-compress is given, as
  // --wire does for the all-reduce: a bf16 step's gradients travel as bf16.
  const std::string compress = !j.ps_compress.empty()  ? j.ps_compress
                               : o.precision == "bf16" ? "bf16"
                                                       : "none";
  SHOAL_ASSIGN_OR_RETURN(so.compression, ps::parse_compression(compress));
  so.stale_lr = j.ps_stale_lr;
  so.slice_bound = e.slice_bound;
  SHOAL_ASSIGN_OR_RETURN(auto job, ps::WorkerJob::join(e, so));
  // The job's workers share this host's cores (servers mostly wait).
  if (o.threads == 0) o.threads = std::max(1, runtime::num_cores() / e.num_workers);
  SHOAL_RETURN_IF_ERROR(job->attach(o));
  return job;
}

}  // namespace

Job::~Job() = default;

Result<std::unique_ptr<Job>> Job::join(train::TrainOptions& o, const JoinOptions& j) {
  if (j.dist != "auto" && j.dist != "allreduce" && j.dist != "ps")
    return invalid_argument("--dist {} is not one of auto, allreduce, ps", j.dist);
  SHOAL_ASSIGN_OR_RETURN(LaunchEnv env, launch_env());
  apply_launch_env(o, env);
  std::unique_ptr<Job> job(new Job());
  // auto: a worker of a parameter-server job when DMLC_ROLE says so
  // (scripts written for MXNet/ps-lite set only the variables).
  if (j.dist == "ps" || (j.dist == "auto" && ps::in_ps_job())) {
    SHOAL_ASSIGN_OR_RETURN(job->ps_, join_ps(o, j));
    // Workers are told apart by their ids, not a launcher rank.
    if (!env.trace.empty()) o.trace = rank_path(env.trace, job->ps_->worker());
  } else if (env.world > 1) {
    SHOAL_ASSIGN_OR_RETURN(job->comm_, join_allreduce(o, j));
  } else if (Status bad = validate(j.layout, j.dp); !bad.ok()) {
    return bad;  // the flags themselves, whatever the ranks
  } else if (Status st = check_layout(j.layout, j.dp, 1); !st.ok()) {
    // --tp 2 in one process would train unsplit, as if the flag were not there.
    return st.with_context(
        "this is one process (no launcher's ranks in the environment): start the ranks with "
        "`shoal run -n N -- shoal train ...`, mpirun, srun or torchrun");
  } else {
    SHOAL_RETURN_IF_ERROR(mp::attach_accumulation(o, micro_batches(j.layout)));
  }
  job->rank_ = o.rank;
  job->world_ = o.world;
  return job;
}

}  // namespace shoal::dist
