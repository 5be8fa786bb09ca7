// `shoal run`: starts the N ranks of a synchronous job and supervises them
// as one (gang semantics). Engines:
//   local   forks N ranks here, each in its own process group, with
//           SHOAL_RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/STORE/JOB_TOKEN/
//           JOB_ID set; prefixes each output line with "[rank r] ".
//   mpirun  runs OpenMPI's mpirun -n N (ranks read OMPI_COMM_WORLD_*),
//           exporting SHOAL_STORE/JOB_TOKEN/JOB_ID.
//   srun    runs a Slurm job step, srun -n N --kill-on-bad-exit=1 (inside an
//           allocation, or asking for one); ranks read SLURM_PROCID/NTASKS.
// In every engine the launcher serves the rendezvous store and makes a
// fresh random job token per attempt. When one rank exits non-zero or dies,
// all are stopped (SIGTERM, SIGKILL after a grace period) and the launcher
// reports the rank, its exit code or signal and its last lines, and exits
// with that rank's code (128 + signal). With max_restarts > 0 it then starts
// all ranks again with SHOAL_RESTART_COUNT=k, which `shoal train` turns
// into a resume from the run's newest checkpoint. With `trace` set, every
// rank writes its Chrome trace (SHOAL_TRACE) and the launcher merges them
// into one file and prints the exposed communication time per step.
#pragma once

#include <string>
#include <vector>

#include "shoal/core/status.h"

namespace shoal::launch {

struct LaunchOptions {
  int ranks = 1;
  std::string engine = "local";  // local, mpirun, srun
  double timeout_s = 0;          // per attempt; 0 = none
  int max_restarts = 0;
  // Before restart k: restart_delay_s x 2^(k-1) seconds, at most 30 (a
  // link or host that is coming back gets time to; 0 = at once).
  double restart_delay_s = 1;
  std::string trace;                     // merged trace path ("" = no tracing)
  std::string store_host = "127.0.0.1";  // where the store listens
  int store_port = 0;                    // 0 = any free port
  double grace_s = 5;                    // SIGTERM -> SIGKILL
  std::vector<std::string> engine_args;  // extra arguments for mpirun/srun
  // none; cores: each local rank bound to its block of the launcher's CPUs;
  // layout: SHOAL_BIND=layout for the ranks to bind themselves by their
  // place in the training layout (shoal/core/cpus.h; local engine only).
  std::string bind = "none";
  std::vector<std::string> cmd;
  // A parameter-server job (--ps S,W): S servers and W workers running
  // cmd, local engine only; see launch_ps.
  int ps_servers = 0, ps_workers = 0;
  int ps_server_restarts = 3;  // a dead server restarts from its snapshot up to this many times
  std::string ps_snapshots;    // servers' snapshot directory ("" = runs/ps-<job id>)
  // Updates between a server's snapshots. 1: every update is in the
  // snapshot before a worker hears of it, so a dead server restarts from it
  // and nothing is lost (a sync job needs that: its round numbers must match
  // the workers'); each update then writes the server's whole shard (see
  // docs/ps.md for the cost). 0 (default): no snapshots, and a dead server
  // stops the job, named.
  int ps_snapshot_every = 0;
  // --ps-elastic MIN:MAX (async or bounded jobs): a failed worker is
  // replaced while fewer than MIN are training, and `shoal ps join` asks
  // for more, up to MAX. 0:0 = not elastic.
  int ps_elastic_min = 0, ps_elastic_max = 0;
  // --elastic MIN[:MAX] (data parallel, local engine): a rank that dies,
  // freezes or is cut off leaves the job, which goes on in-process with the
  // others while at least MIN remain (dist/elastic.h). 0 = not elastic.
  // MAX above -n: `shoal join --job <job_dir>` adds ranks up to MAX.
  int elastic_min = 0, elastic_max = 0;
  // Where an elastic job leaves job.env (the store's address and token,
  // mode 0600) for `shoal join`; "" = runs/job-<id>.
  std::string job_dir;
};
Status validate(const LaunchOptions& o);

// Runs the job; returns the process exit code for the launcher.
int launch(const LaunchOptions& o);

// `shoal run --ps S,W -- CMD` (what launch() runs when ps_servers > 0):
// the launcher serves the job's store as its scheduler, starts S `shoal ps
// server` processes and W workers running CMD with DMLC_ROLE,
// DMLC_PS_ROOT_URI/PORT, DMLC_NUM_SERVER/WORKER and a fresh job token. The
// job ends when every worker has finished (the servers are then stopped);
// a failed worker stops a sync job and is named, an async job goes on
// without it; a failed server stops the job.
int launch_ps(const LaunchOptions& o, const std::string& job_id);

// `shoal run-rank -- CMD` (hidden; what the mpirun engine starts on each
// rank): runs CMD as a child that dies with it, forwards SIGINT/SIGTERM,
// and when CMD fails prints "shoal-rank-exit: rank R <how>" to stderr so
// the launcher can name the rank (mpirun itself does not), then exits with
// CMD's code (128 + signal).
int exec_rank(const std::vector<std::string>& cmd);

// The directory the ranks write their traces into until the launcher
// merges them: a new one beside `trace_file`, which ranks on other hosts
// reach when it is on a shared file system, as --out must be (the
// launcher's own /tmp they cannot: each host has its own).
Result<std::string> make_trace_dir(const std::string& trace_file);

// Trace merging (exposed for tests): reads each rank's Chrome trace,
// writes one file with pid = rank, and summarizes per rank the mean step
// time and the mean time per step the compute thread waited for
// communication (the part of it not hidden behind compute).
struct TraceSummary {
  int rank = 0;
  int steps = 0;
  double step_ms = 0, exposed_comm_ms = 0, comm_ms = 0;
};
// `server_metrics` (a PS job): each parameter server's JSONL metrics
// (`shoal ps server --metrics`), added as counter tracks after the ranks'
// processes: traffic in and out (MB/s), answers waiting, mean round-close
// time and each worker's lag. `rank_name` labels the ranks ("rank",
// "worker").
Result<std::vector<TraceSummary>> merge_traces(const std::vector<std::string>& rank_files,
                                               const std::string& out,
                                               const std::vector<std::string>& server_metrics = {},
                                               const std::string& rank_name = "rank");

}  // namespace shoal::launch
