// dist/plan.h's parts, shared by its files: what the forward graph says
// of each split (plan_shape.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/dist/plan.h"
#include "shoal/graph/graph.h"
#include "shoal/mp/tensor_parallel.h"

namespace shoal::dist {

std::int64_t forward_rows(const graph::Graph& g);  // input x's first dimension
// Tensor parallelism's plan of `g` over T ranks, or why the model does not
// split so (its message is what the plan shows).
Result<mp::TpPlan> tp_plan(const graph::Graph& g, int T);
// `comm_id`: a registered communicator of T ranks (the rewrite reads its
// rank and size; nothing is sent). `sequence`: with mp::shard_sequence
// after the split (--sequence-parallel).
TpShape tp_shape(const graph::Graph& g, int T, std::int64_t comm_id, bool sequence = false);
PpShape pp_shape(const graph::Graph& g, int P, int chunks = 1);
// The sub-communicator of `world` ranks that `g` puts `rank` in (a split's
// color; -1: none, the rank sits out).
int group_color(const Group& g, int rank, int world);
// Calibration::variants' key: "bf16/none".
std::string variant_key(const std::string& precision, const std::string& recompute);
// What the step at rows[i] (sorted) should take by its neighbours in
// `steps`: the line through the sizes either side (at the ends, through
// the nearest two; below them, halfway up to the next size's period); 0
// with fewer than three sizes (plan_calibrate.cc).
double neighbours_period(const std::map<std::int64_t, train::StepProfile>& steps,
                         const std::vector<std::int64_t>& rows, std::size_t i);

// The links and cores (plan_links.cc): every group of `groups` at once,
// its all-reduce's fit, the wait a collective inside a step adds, and in
// those of `shards` the reduce-scatter + all-gather pair's fit.
Status measure_links(comm::Communicator& c, const std::vector<Group>& groups,
                     const std::vector<Group>& shards, Calibration& cal);
// The mean over ranks of wall time over CPU time while every rank's
// `threads` threads spin at once: how many compete for a core.
Result<double> measure_contention(comm::Communicator& c, int threads);
// The fit of `op(n floats)` timed at 4 KiB to 4 MiB, the slowest rank's
// mean, a size that ran slower per byte than the one before measured again
// (plan_links.cc). Every rank of `world` calls it alike.
Result<LinkFit> fit_sizes(comm::Communicator& world, const std::function<Status(std::size_t)>& op);

// What a pipeline's cuts add to its step (plan_pipeline.cc): its ranks'
// work replayed in `schedule`'s order ("1f1b", "gpipe") over P ranks, m
// micro-batches and v pieces a rank, each `piece` seconds (a third
// forward), with hop[r] the seconds of one message from rank r to the next
// (the last: to rank 0), against the same replay with no hops.
double pipeline_transfer_s(const std::string& schedule, int P, int m, int v, double piece,
                           const std::vector<double>& hop);

}  // namespace shoal::dist
