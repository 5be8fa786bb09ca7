// A trace-driven simulator of a cluster under a scheduling policy: jobs
// arrive, wait, run for their duration stretched by their placement's
// all-reduce cost, and finish; nodes fail and come back. Reports
// utilization, waits, fragmentation, fairness across queues and whether
// any gang was ever partly started (it must not be).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "shoal/cluster/placer.h"

namespace shoal::cluster {

struct TraceJob {
  JobSpec spec;
  double submit = 0;    // seconds
  double duration = 0;  // at full ranks on an ideal placement
};
struct NodeFailure {
  double at = 0;
  int node = 0;
  double repair_s = 0;
};
struct Trace {
  std::vector<TraceJob> jobs;  // by submit time
  std::vector<NodeFailure> failures;
  std::string source;  // what it came from, for reports
};

struct SyntheticOptions {
  int jobs = 10000;
  std::uint64_t seed = 1;
  double load = 1.3;            // offered accelerator-seconds over the cluster's
  int queues = 3;               // tenants, submitting 50%, 30%, 20%, … of the jobs
  double ring_share = 0.25;     // of multi-chip sync jobs: links: ring
  double elastic_share = 0.15;  // of multi-rank jobs: elastic, min = ranks/2
  double urgent_share = 0.03;   // priority 10: may preempt
  double failures_per_node_day = 0;
  double comm_fraction = 0.3;  // of a multi-chip job's step, on an ideal placement
};
// Job sizes, durations and arrivals in the shape the Philly and PAI
// studies report: most jobs one chip, a tail of large gangs in powers of
// two, log-normal durations, Poisson arrivals at the given load.
Trace synthetic_trace(const Topology& t, const SyntheticOptions& o);
// The goodput no policy can beat over the trace's arrival window: every
// job from its submit on, at full size, on the best placement, capacity no
// object. On the default trace (1,000 nodes, a 7-hour window) it is ~84%:
// the cluster starts empty and the long jobs run past the window.
double goodput_ceiling(const Topology& t, const Trace& tr);
// Alibaba PAI's GPU trace (cluster-trace-gpu-v2020), pai_task_table.csv:
// headerless, columns job_name, task_name, inst_num, status, start_time,
// end_time, plan_cpu (percent of a core), plan_mem (GB), plan_gpu (percent
// of a GPU), gpu_type. One job per job_name; its tasks' instances are its
// ranks (a `ps` task makes it a ps job); only Terminated jobs are kept;
// fractional GPUs round up to one. `max_jobs` 0: all.
Result<Trace> load_pai_trace(const std::string& path, int max_jobs);

enum class Policy {
  kFifoFirstFit,  // one queue in submit order, head-of-line blocking, first fit
  kBackfill,      // Slurm-like: priority then submit order, EASY backfill, first fit
  // As Slurm with topology/tree: EASY backfill, best-fit node, else the
  // best-fit leaf switch (the one with the least room that holds the job),
  // else the fewest switches; no chip adjacency. What Shoal is measured
  // against.
  kTopoBackfill,
  kShoal,  // fair share across queues (DRF), EASY backfill, best fit,
           // ring/mesh adjacency, elastic shrink before preemption
};
const char* policy_name(Policy p);

struct SimOptions {
  int max_tries = 100;  // jobs looked at per scheduling pass (Slurm: bf_max_job_test)
  // The baselines place ring/mesh jobs on any chips, as a scheduler that
  // knows only chip counts does (the cost shows as slowdown); true: they
  // honour adjacency too (first fit), to compare the scheduling alone.
  bool baseline_adjacency = false;
  // Shoal's policy: seconds a running job loses when it is moved (a
  // checkpoint written, its ranks restarted elsewhere) to give a waiting
  // gang whole linked nodes, or suspended for a reservation's holder; a
  // negative value: neither.
  double move_s = 300;
};

// Why a job waited: the reason of its last failed try before it first
// started. kQueued: never tried (behind the queue's head, past the pass's
// tries, or another queue's turn); kNoRoom: fewer chips free in all than
// it needs; kShape: enough free, but not where its ranks and links fit;
// kReservation: it would have delayed the backfill reservation.
enum class WaitReason { kQueued, kNoRoom, kShape, kReservation };
inline constexpr int kWaitReasons = 4;
const char* wait_reason_text(WaitReason r);

struct SimReport {
  std::string policy;
  int jobs = 0, finished = 0, never_fit = 0;
  double makespan_s = 0;
  // Over the arrival window (first to last submit): chips (CPUs on a
  // chipless cluster) held by jobs over capacity, and the same with each
  // job's chips divided by its placement slowdown (the work done).
  double utilization = 0, goodput = 0;
  // The same two while some job waits (the time a policy can be blamed for
  // idle chips), and that time's share of the makespan.
  double backlog_utilization = 0, backlog_goodput = 0, backlog_share = 0;
  // Idle chips (CPUs) over the arrival window, in unit-seconds: while some
  // job waited, and while none did (the cluster filling up at the start).
  double idle_waiting = 0, idle_none_waiting = 0;
  double wait_p50 = 0, wait_p90 = 0, wait_p99 = 0;
  double fragmentation = 0;  // time-weighted ClusterState::fragmentation, same window
  double jain = 1;           // time-weighted Jain index of backlogged queues' dominant shares
  int partial_gangs = 0;     // starts of a sync job with fewer ranks than asked: must be 0
  int overcommits = 0;       // refused takes: must be 0
  int linked_jobs = 0, linked_adjacent = 0;  // ring/mesh jobs, and those placed adjacent
  int linked_never = 0;      // of them, those whose links this cluster cannot give (run unlinked)
  double mean_slowdown = 1;  // over multi-rank jobs
  int shrinks = 0, kills = 0, restarts = 0;
  int moves = 0;      // running jobs moved to make room for a gang (Shoal's policy)
  int suspends = 0;   // jobs on a reservation's chips stopped for its holder (Shoal's policy)
  double wall_s = 0;  // the simulation's own run time
  std::vector<double> first_start, end;  // per job (−1: never)
  std::vector<WaitReason> wait_reason;   // per job; meaningful where it waited
  // Jobs that waited, and their waits' sum in seconds, by WaitReason.
  std::array<int, kWaitReasons> waited{};
  std::array<double, kWaitReasons> wait_s{};
};

SimReport simulate(const Topology& t, const Trace& trace, Policy p, const SimOptions& o);
// A text table, one row per report, and the legend of its columns.
std::string format_reports(const std::vector<SimReport>& r);
std::string report_legend();
// Per policy: how many jobs waited for each reason and for how long.
std::string format_wait_reasons(const std::vector<SimReport>& r);
// A PNG (gnuplot): utilization and goodput per policy, and each policy's
// wait-time distribution over the trace's jobs.
Status plot_reports(const std::vector<SimReport>& r, const Trace& trace, const std::string& png);

}  // namespace shoal::cluster
