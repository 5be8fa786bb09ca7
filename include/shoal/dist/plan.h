// `shoal plan`: which layout (--dp x --tp x --pp, --zero, --micro-batches)
// to train a model with on N ranks, predicted from the model's graph and a
// short measurement of this host, never from a formula alone:
//   - compute: the model's own step, run on N concurrent processes (as the
//     job's ranks would share the cores) at each micro-batch size the
//     layouts need, its kernels' time split into products (matmul, conv),
//     other kernels and the optimizer update (train::StepProfile);
//   - how each split changes that: tensor parallelism's rewrite of the
//     forward graph (mp::shard_tensor_parallel) gives the share of products
//     and other work a rank keeps and the bytes its collectives carry; the
//     pipeline's plan (mp::plan_pipeline) its largest stage's share of the
//     cost and the bytes crossing each cut;
//   - communication: all-reduces measured among the same processes, in
//     groups of each size the layouts use, all groups at once, fitted as
//     t = alpha + bytes * beta.
// docs/plan.md: the model, and where it is known to be wrong.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/core/status.h"
#include "shoal/dist/layout.h"
#include "shoal/train/trainer.h"

namespace shoal::dist {

struct PlanRequest {
  int ranks = 2;                  // the job's ranks
  std::int64_t global_batch = 0;  // samples per step over the job
  double mem_per_rank = 0;        // bytes a rank may hold (0: no budget)
  int cores = 0;                  // this host's cores (0: the allowed CPUs)
  // The --precision and --recompute values to search (empty: the base
  // options' own). Recomputation applies to layouts without micro-batches
  // or a pipeline (what the trainer builds).
  std::vector<std::string> precisions, recomputes;
};

// A group of ranks a layout communicates in: `size` ranks, `stride` apart
// (rank r = g*P*T + s*T + t: tensor-parallel groups are T ranks 1 apart,
// a pipeline's neighbours 2 ranks T apart, data-parallel groups D ranks
// P*T apart). Across hosts the stride says which links a group crosses.
// `span` > 0 forms the groups inside each block of `span` ranks (a
// pipeline: P*T), `shift` 1 one stride on: the pairs of stages (1, 2),
// (3, 4), ... where shift 0 pairs (0, 1), (2, 3), ..., so every hop of a
// pipeline is measured and none that is not one (a rank with no partner
// in its block sits out).
struct Group {
  int size = 2, stride = 1, shift = 0, span = 0;
  auto operator<=>(const Group&) const = default;
};

// All-reduce time of `bytes` within one group: alpha + bytes * beta, or,
// where sizes were measured (`points`: bytes, seconds, ascending), linear
// between the nearest two (the algorithm the communicator picks changes
// with the size; one line through the smallest and largest misprices the
// sizes between), along the last two beyond.
struct LinkFit {
  double alpha = 0, beta = 0;
  std::vector<std::pair<double, double>> points;
  double time(double bytes) const;
};

// What splitting the model over T tensor-parallel ranks leaves a rank.
struct TpShape {
  std::string refused;  // why the model cannot be split so ("" if it can)
  double product_ratio = 1, other_ratio = 1, param_ratio = 1;
  double arena_ratio = 0;  // the planned arena's (0: unknown, from the others)
  std::vector<double> collective_bytes_per_row;  // each all-reduce, fwd or bwd
  // With --sequence-parallel (mp::shard_sequence): each reduce-scatter or
  // all-gather of the forward (the whole tensor's bytes per row; the
  // backward runs its opposite, so each is a pair a step, an all-reduce's
  // traffic), and the parameters the split rows read, whose gradients are
  // summed over the group (one all-reduce of them all with one
  // micro-batch and no pipeline, else one each).
  std::vector<double> shard_bytes_per_row, param_sum_bytes;
};
// What cutting the model into P pipeline stages leaves the largest stage
// (interleaved, --pp-virtual v: P x v pieces, rank s holding pieces s,
// s + P, ...: the largest rank's pieces together).
struct PpShape {
  std::string refused;
  double stage_share = 1;             // the largest stage's share of the estimated cost
  double param_share = 1;             // the largest share of the parameters a stage holds
  double boundary_bytes_per_row = 0;  // the largest activation crossing a cut
};

struct Calibration {
  int ranks = 1, threads = 1, cores = 1;  // cores: of one host
  // The hosts the ranks ran on, each with ranks / hosts of them (1 host:
  // forked here by calibrate; more: a job's own ranks, calibrate_job).
  int hosts = 1;
  // How much the ranks slow each other when all compute at once: wall time
  // over CPU time of every rank's threads spinning together (2 for 4 ranks
  // on 2 cores; also where "hosts" share a machine's cores, as the netns
  // testbed's do). 0: from the core count.
  double contention = 0;
  bool overlap = false;  // --overlap auto's choice for this many ranks
  std::string precision = "f32";
  std::map<std::int64_t, train::StepProfile> steps;  // by micro-batch rows
  std::map<int, TpShape> tp;                         // by --tp
  std::map<int, TpShape> tp_sequence;                // by --tp, with --sequence-parallel
  std::map<int, PpShape> pp;                         // by --pp
  // Interleaved: by --pp-virtual (kPpVirtual), then by --pp.
  std::map<int, std::map<int, PpShape>> pp_interleaved;
  // What the largest rank holds (bytes: arena, parameters, state) in the
  // step the trainer builds for a family of layouts (family_key), at ZeRO
  // 0, the calibration's precision, no recomputation, on the calibration's
  // ranks (compiled, not run); every layout of the family (ZeRO, bf16) is
  // the formula scaled to it. Built where the formula is known to misjudge
  // memory: interleaved pipelines (at tp 1; their tensor-parallel twins
  // take the same scale) and tensor parallelism with micro-batches.
  std::map<std::string, double> built_held;
  // Likewise for --recompute R (at the calibration's precision) with data
  // parallelism over every rank: what recomputing saves is measured on a
  // step alone, and the data-parallel step keeps more (measured: +15%).
  std::map<std::string, double> recompute_held;
  std::map<Group, LinkFit> allreduce;  // measured in the ranks' places
  // A reduce-scatter then an all-gather of those bytes in the groups
  // that run them (ZeRO's data-parallel groups, sequence parallelism's
  // tensor groups): on a ring across hosts they cost more than the
  // all-reduce the communicator picks. Absent (an older calibration): as
  // that all-reduce.
  std::map<Group, LinkFit> shard;
  // What a collective inside the step costs beyond its transfer: waiting
  // for the group's ranks while all of them compute (on a host with more
  // ranks x threads than cores, for a core), by group.
  std::map<Group, double> sync_s;
  // What each micro-batch after the first adds under gradient
  // accumulation beyond its rows' compute (measured at one size).
  double accumulate_s = 0;
  // Other --precision / --recompute than the base's, measured at
  // variant_rows and applied to every size in proportion to the base's
  // there; keyed "bf16/none", "f32/full", ...
  std::map<std::string, train::StepProfile> variants;
  std::int64_t variant_rows = 0;
  std::string recompute = "none";  // the base's
  double seconds = 0;              // what calibrating took
};

struct Candidate {
  Layout layout;
  int dp = 1, zero = 0;
  std::string precision = "f32", recompute = "none";
  std::int64_t batch = 0;  // --batch: per data-parallel rank
  double compute_s = 0, comm_s = 0, step_s = 0;
  // The parts: kernels on the compute thread (products, other kernels, the
  // optimizer update), collectives (all-reduces, a pipeline's transfers,
  // ZeRO's gathers and reduce-scatters); the rest of compute_s is the
  // pipeline's bubble.
  double product_s = 0, other_s = 0, update_s = 0;
  double allreduce_s = 0, transfer_s = 0, shard_s = 0;
  double memory_bytes = 0;  // the largest rank's
  bool fits = true;
  std::string flags() const;  // "--dp 2 --tp 2 --zero 1 --batch 32 ..." (+ --precision bf16 ...)
};

// The prediction's keys in a plan file (plan_yaml writes them, `shoal
// train --plan` reads them back), each with the Candidate field it holds;
// seconds, and plan-memory-bytes (written as an integer).
struct PlanKey {
  const char* key;
  double Candidate::*field;
};
const std::vector<PlanKey>& plan_keys();

// Every layout of `r`'s ranks and samples dist::attach accepts, with its
// ZeRO stage: --tp x --pp dividing the ranks, a data-parallel share that
// divides the samples, micro-batches 1, 2, 4 (x pp under a pipeline), ZeRO
// 0-3 where there is a data-parallel group (3 only without micro-batches
// or a pipeline); a pipeline also under --pp-schedule gpipe and with each
// --pp-virtual of kPpVirtual; tensor parallelism also with
// --sequence-parallel. Whether the model splits so is the
// calibration's to say.
inline constexpr int kPpVirtual[] = {2, 3, 4};
std::vector<std::pair<Layout, int>> job_layouts(const PlanRequest& r);
// The distinct micro-batch sizes those layouts use, and the groups they
// communicate in.
std::vector<std::int64_t> micro_batch_rows(const PlanRequest& r);
std::vector<Group> job_groups(const PlanRequest& r);
std::vector<Group> job_shard_groups(const PlanRequest& r);  // of those, the ones that shard

// Runs `r.ranks` processes on this host that each train `base` for a few
// steps at each micro-batch size, then measure all-reduces (and, in the
// groups that shard, reduce-scatter + all-gather pairs) among themselves.
// Bounded by `deadline_s`; a process that fails is named.
Result<Calibration> calibrate(const train::TrainOptions& base, const PlanRequest& r,
                              double deadline_s = 600);
// The same measurement on a job's own ranks, wherever they run (several
// hosts: the groups' all-reduces cross the links they will cross).
// Collective over `c` (r.ranks must be its size); rank 0's result holds
// the splits, and every rank's the rest.
Result<Calibration> calibrate_job(const train::TrainOptions& base, const PlanRequest& r,
                                  comm::Communicator& c);

// What a layout's memory depends on besides ZeRO, precision and
// recomputation: "tp2+sp/pp2/1f1b/v1/m4".
std::string family_key(const Layout& l);

// Every layout of `r` the model allows, predicted from `c`, fastest first
// (those over the memory budget after those within it).
std::vector<Candidate> plan_layouts(const PlanRequest& r, const Calibration& c);
// `precision` / `recompute` empty: the calibration's own.
Candidate predict(const PlanRequest& r, const Calibration& c, const Layout& l, int zero,
                  const std::string& precision = "", const std::string& recompute = "");

// The table `shoal plan` prints, and the file it writes for the first
// candidate (the flags as `shoal train --config` reads them, and the
// prediction under plan-* keys `shoal train --plan` checks).
std::string plan_table(const std::vector<Candidate>& cs, std::size_t rows = 20);
std::string plan_yaml(const Candidate& c, const PlanRequest& r, const train::TrainSettings& s);

// Every candidate as JSON (flags, prediction, whether it fits).
std::string candidates_json(const std::vector<Candidate>& cs);

// `shoal train --plan auto` on one rank of a job (any launcher, one host
// or several): the job's ranks calibrate together in their places, rank 0
// plans for them and `base.batch` x ranks samples per step and sends the
// plan to the others; every rank returns the same plan file's text. The
// communicator it joined is kept for the job (take_plan_communicator).
Result<std::string> auto_plan(const train::TrainOptions& base);
// The job's communicator auto_plan joined (null if none): dist::Job trains
// over it rather than joining the ranks a second time.
std::unique_ptr<comm::Communicator> take_plan_communicator();

// Calibration to and from JSON (`shoal plan --calibration FILE` reuses one).
std::string calibration_json(const Calibration& c);
Result<Calibration> parse_calibration(const std::string& text);

}  // namespace shoal::dist
