// A training job as the cluster sees it: how many ranks, what each needs,
// which links its accelerators must share, and how it tolerates losing
// ranks. Parsed from YAML; every error names the field and the value.
#pragma once

#include <cstdint>
#include <string>

#include "shoal/core/status.h"

namespace shoal::cluster {

// The accelerator links a job's collectives need. kRing: its accelerators
// are a contiguous arc of a node's chip ring (or whole consecutive nodes of
// one switch when larger than a node); kMesh: an axis-aligned W×H block of a
// node's chip mesh. kNone: the data-centre fabric, anywhere.
enum class LinkNeed { kNone, kRing, kMesh };

// kSync: a gang, all ranks at once or none (data/model parallel all-reduce).
// kElastic: min..max ranks, shrinks instead of dying. kPs: parameter-server
// job: `servers` extra ranks that need no accelerator, workers elastic.
enum class JobKind { kSync, kElastic, kPs };

struct JobSpec {
  std::string name;
  int ranks = 1;      // the ranks wanted (max for elastic and ps workers)
  int min_ranks = 0;  // elastic/ps: fewest workers that still train (0: = ranks)
  int servers = 0;    // ps only
  int cpus_per_rank = 1;
  std::int64_t mem_mb_per_rank = 0;
  int accels_per_rank = 0;
  LinkNeed links = LinkNeed::kNone;
  int mesh_w = 0, mesh_h = 0;  // kMesh: the block; ranks·accels_per_rank = w·h
  JobKind kind = JobKind::kSync;
  std::string queue = "default";
  int priority = 0;               // larger runs first within a queue, and may preempt
  double max_runtime_s = 0;       // the limit the scheduler plans with (0: none)
  double checkpoint_every_s = 0;  // work lost on a restart is at most this
  // For the placement cost: gradient bytes all-reduced per step and the part
  // of a step spent in that all-reduce on an ideal placement.
  double allreduce_mb = 100;
  double comm_fraction = 0.3;

  int total_accels() const { return ranks * accels_per_rank; }
  int fewest_ranks() const { return kind == JobKind::kSync ? ranks : min_ranks; }
};

const char* link_need_name(LinkNeed l);
const char* job_kind_name(JobKind k);

// Checks the fields against each other (ring size, mesh area, min ≤ max).
Status validate(const JobSpec& j);
// `text` is YAML; `where` names it in errors (a path).
Result<JobSpec> parse_job_spec(const std::string& text, const std::string& where);
Result<JobSpec> load_job_spec(const std::string& path);

}  // namespace shoal::cluster
