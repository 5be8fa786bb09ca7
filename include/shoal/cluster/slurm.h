// Slurm as the engine, the placer as its adviser: the cluster model read
// from the live cluster (scontrol, topology.conf), its nodes' current use
// (GPUs from GresUsed), and a job submitted with sbatch in the shape Slurm
// needs to place it well (nodes, GPUs per task, --switches, --contiguous),
// pinned to the placer's nodes only on request; its ranks run by `shoal run
// --engine srun`. A job that can never fit is refused before sbatch.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shoal/cluster/placer.h"

namespace shoal::cluster {

// Marks on `s` what `scontrol -d show nodes` reports in use (CPUAlloc,
// AllocMem, GPUs from GresUsed, else AllocTRES gres/gpu) and nodes that are
// down or drained.
Status occupy_from_scontrol(ClusterState& s, const std::string& scontrol_nodes);

struct SubmitOptions {
  std::string dir;               // where the script, topology.conf and output go
  std::string shoal;             // the shoal binary the script runs
  std::vector<std::string> cmd;  // each rank's command
  double rank_timeout_s = 0;     // shoal run --timeout (0: none)
  // Slurm does not say how a node's GPUs are linked: what the live
  // cluster's nodes with GPUs have (a ring lets ring jobs be placed there).
  ChipLinks live_links = ChipLinks::kNone;
  // Pin the job to the placer's nodes (--nodelist). Off by default: Slurm
  // places it from its shape (nodes, GPUs per task, one switch, contiguous).
  bool pin = false;
  double switch_wait_s = 300;  // --switches=1@: how long Slurm waits for one switch
};

// The sbatch script for j: its shape (ring and mesh jobs: the nodes they
// span, contiguous, one switch); with `o.pin` and a placement, its nodes
// (--nodelist, -N) instead, and --switches=1 when they share a leaf switch.
std::string sbatch_script(const Topology& t, const JobSpec& j, const std::optional<Placement>& p,
                          const SubmitOptions& o);

// A command run with a deadline (coreutils timeout); its exit code and
// output (stdout and stderr).
struct CommandResult {
  int code = -1;
  std::string out;
};
Result<CommandResult> run_command(const std::vector<std::string>& argv, double timeout_s);

struct Submission {
  std::string script_path, script;
  std::vector<std::string> rank_nodes;  // the placer's node per rank; none: queued until it fits
  std::string why;                      // when it does not fit now: cluster::why_not
  bool one_switch = false;
  std::string job_id;  // empty on a dry run
  int exit_code = 0;   // with `wait`: the job's
  std::string state;   // with `wait`: how it ended (COMPLETED, FAILED, CANCELLED, ...)
  std::string ran_on;  // with `wait`: the nodes Slurm gave it (NodeList)
};
// Places j on the live Slurm cluster (or on `model` when given: a YAML
// cluster model, for a dry run), writes DIR/<name>.sbatch and
// DIR/topology.conf (atomically), and unless `dry_run` submits it with
// sbatch (--wait: until it ends, at most `wait_s`).
Result<Submission> submit_slurm(const JobSpec& j, const SubmitOptions& o, const std::string& model,
                                bool dry_run, bool wait, double wait_s);

}  // namespace shoal::cluster
