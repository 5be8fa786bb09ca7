// The plan tests' job and calibration: a model whose costs are round
// numbers, so each test can say what the plan must predict.
#pragma once

#include "shoal/dist/plan.h"

namespace shoal::dist::fixture {

inline PlanRequest request(int ranks, std::int64_t batch) {
  PlanRequest r;
  r.ranks = ranks;
  r.global_batch = batch;
  r.cores = 64;
  return r;
}

// A model of 8 MB of parameters (50 tensors) whose step costs 1 ms a row
// (60% products), with Adam's two slots; tensor parallelism over 2 splits
// it, over 4 cannot; the pipeline cuts in 2 and 4, and interleaves (two
// pieces a rank) over 2 stages only.
inline Calibration calibration(int ranks, int cores) {
  Calibration c;
  c.ranks = ranks;
  c.threads = 1;
  c.cores = cores;
  for (std::int64_t rows : {1, 2, 4, 8, 16, 32, 64}) {
    train::StepProfile p;
    p.steps = 8;
    p.product_s = 0.6e-3 * static_cast<double>(rows);
    p.other_s = 0.4e-3 * static_cast<double>(rows);
    p.update_s = 2e-3;
    p.param_bytes = 8'000'000;
    p.state_bytes = 16'000'000;
    p.arena_bytes = 8'000'000 + 1'000'000 * static_cast<std::size_t>(rows);
    p.param_tensors = 50;
    c.steps[rows] = p;
  }
  TpShape t2;
  t2.product_ratio = 0.5;
  t2.other_ratio = 0.7;
  t2.param_ratio = 0.55;
  t2.arena_ratio = 0.6;
  t2.collective_bytes_per_row = {4096, 4096, 4096, 4096};
  c.tp[2] = t2;
  // With sequence parallelism the norms and residual adds run on half the
  // rows: less other work and arena, each all-reduce a reduce-scatter or
  // an all-gather (and its opposite in the backward), and the parameters
  // the rows read summed.
  TpShape sp = t2;
  sp.other_ratio = 0.55;
  sp.arena_ratio = 0.5;
  sp.collective_bytes_per_row = {};
  sp.shard_bytes_per_row = {4096, 4096, 4096, 4096};
  sp.param_sum_bytes = {512, 512, 2048};
  c.tp_sequence[2] = sp;
  if (ranks >= 4) c.tp[4].refused = c.tp_sequence[4].refused = "heads do not divide";
  for (int p : {2, 4}) {
    if (p > ranks) continue;
    PpShape s;
    s.stage_share = 1.1 / p;
    s.param_share = 1.05 / p;
    s.boundary_bytes_per_row = 8192;
    c.pp[p] = s;
    s.stage_share = 1.05 / p;  // finer pieces balance better
    if (p == 4) s.refused = "8 pieces of a 6-layer model";
    c.pp_interleaved[2][p] = s;
    s.stage_share = 1.02 / p;  // finer still (3 is not calibrated here: never listed)
    if (p == 4) s.refused = "16 pieces of a 6-layer model";
    c.pp_interleaved[4][p] = s;
  }
  for (const Group g : job_groups(request(ranks, 64))) {
    c.allreduce[g] = g.size == 2 ? LinkFit{10e-6, 0.2e-9, {}} : LinkFit{20e-6, 0.3e-9, {}};
    c.sync_s[g] = 50e-6;
  }
  return c;
}

}  // namespace shoal::dist::fixture
