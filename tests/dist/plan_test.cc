// dist/plan.h's model without a calibration run: the layouts a job allows
// (and none it does not), how ZeRO, micro-batches, the pipeline's bubble
// and a memory budget move the prediction, the calibration's JSON; and
// what the forward graph says of each split (tensor parallelism on real
// communicators, the pipeline's cuts, a batch-norm model refused).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "dist/plan_internal.h"
#include "plan_fixture.h"
#include "ranks.h"
#include "shoal/collective/registry.h"
#include "shoal/graph/builder.h"
#include "shoal/train/model.h"

namespace shoal::dist {
namespace {

using fixture::calibration;
using fixture::request;

TEST(Plan, EveryLayoutTheJobAllowsAndNoOther) {
  const PlanRequest r = request(4, 64);
  const auto cs = plan_layouts(r, calibration(4, 64));
  std::set<std::tuple<int, int, int, int, int, std::string, int, bool>> seen;
  for (const Candidate& c : cs) {
    const int m = micro_batches(c.layout);
    EXPECT_EQ(c.dp * c.layout.tp * c.layout.pp, 4) << c.flags();
    EXPECT_EQ(c.batch * c.dp, 64) << c.flags();
    EXPECT_EQ(c.batch % m, 0) << c.flags();
    EXPECT_NE(c.layout.tp, 4) << "a refused split was planned: " << c.flags();
    if (c.zero == 3) {
      EXPECT_TRUE(c.layout.pp == 1 && m == 1) << c.flags();
    }
    if (c.dp == 1) {
      EXPECT_EQ(c.zero, 0) << c.flags();
    }
    if (c.layout.pp == 1) {
      EXPECT_TRUE(c.layout.pp_schedule == "1f1b" && c.layout.pp_virtual == 1) << c.flags();
    }
    if (c.layout.pp_virtual > 1) {
      EXPECT_EQ(c.layout.pp, 2) << "an interleaving the calibration refused: " << c.flags();
      EXPECT_EQ(m % c.layout.pp, 0) << c.flags();
      EXPECT_NE(c.flags().find(fmt::format("--pp-virtual {}", c.layout.pp_virtual)),
                std::string::npos)
          << c.flags();
      EXPECT_NE(c.layout.pp_virtual, 3) << "a split the calibration did not measure";
    }
    if (c.layout.sequence_parallel) {
      EXPECT_EQ(c.layout.tp, 2) << c.flags();
      EXPECT_NE(c.flags().find("--sequence-parallel"), std::string::npos) << c.flags();
    }
    EXPECT_TRUE(seen.insert({c.dp, c.layout.tp, c.layout.pp, c.zero, m, c.layout.pp_schedule,
                             c.layout.pp_virtual, c.layout.sequence_parallel})
                    .second)
        << "listed twice: " << c.flags();
  }
  // Counted apart: (tp, pp) in {1x1: dp 4, 1x2: dp 2, 1x4: dp 1, 2x1: dp 2,
  // 2x2: dp 1}; micro-batches 1, 2, 4 (x pp with a pipeline); ZeRO 0-2 where
  // dp > 1, and 3 with one micro-batch and no pipeline; a pipeline as
  // 1F1B, GPipe and (2 stages only) interleaved by 2 and by 4; tensor
  // parallelism with and without sequence parallelism.
  const int dp4 = 3 * 3 + 1, dp2_pp = 3 * 3 * 4, pp4 = 3 * 2, tp2 = 2 * (3 * 3 + 1),
            tp2pp2 = 2 * 3 * 4;
  EXPECT_EQ(cs.size(), static_cast<std::size_t>(dp4 + dp2_pp + pp4 + tp2 + tp2pp2));
  for (std::size_t i = 1; i < cs.size(); ++i) EXPECT_LE(cs[i - 1].step_s, cs[i].step_s);
}

TEST(Plan, ShardingAndMicroBatchesLowerMemoryAndTheBubbleCosts) {
  const PlanRequest r = request(4, 64);
  const Calibration c = calibration(4, 64);
  Layout plain;
  const Candidate z0 = predict(r, c, plain, 0), z1 = predict(r, c, plain, 1),
                  z3 = predict(r, c, plain, 3);
  EXPECT_LT(z1.memory_bytes, z0.memory_bytes);  // the optimizer state sharded
  EXPECT_LT(z3.memory_bytes, z1.memory_bytes);  // the parameters too
  EXPECT_LT(z1.compute_s, z0.compute_s);        // each rank updates a quarter
  EXPECT_GT(z3.comm_s, z1.comm_s);              // gathers in both passes
  Layout accum;
  accum.micro_batches = 4;
  EXPECT_LT(predict(r, c, accum, 0).memory_bytes, z0.memory_bytes);
  // A pipeline of 4 stages: the bubble is (P - 1) slots, less of the step
  // with more micro-batches.
  Layout pp;
  pp.pp = 4;
  pp.micro_batches = 4;
  const Candidate few = predict(r, c, pp, 0);
  pp.micro_batches = 16;
  const Candidate many = predict(r, c, pp, 0);
  EXPECT_GT(few.compute_s, many.compute_s);
  // With 4 ranks on 2 cores the idle stages' cores go to the busy ones.
  const Candidate shared = predict(r, calibration(4, 2), pp, 0);
  EXPECT_LT(shared.compute_s, many.compute_s * 1.0001);
}

// The calibration measures a size again when its step stands above the
// line its neighbours draw (a 12-step window on a busy host): the
// measured case of a disturbed 8 rows; the largest by the nearest two,
// the smallest halfway up to the next size (it keeps the fixed costs).
TEST(Plan, ADisturbedSizeStandsAboveItsNeighboursLine) {
  std::map<std::int64_t, train::StepProfile> steps;
  const std::vector<std::int64_t> rows{4, 8, 16, 32, 64};
  for (auto [r, ms] : {std::pair{4, 20.0}, {8, 60.1}, {16, 78.1}, {32, 153.7}, {64, 300.0}})
    steps[r].period_s = ms / 1e3;
  EXPECT_NEAR(neighbours_period(steps, rows, 1), 0.03937, 1e-5);  // 20 + 58.1 x 4 / 12
  // The smallest halfway between the line through 8 and 16 rows and 8 rows.
  EXPECT_NEAR(neighbours_period(steps, rows, 0), (0.0601 - 0.0180 * 4 / 8 + 0.0601) / 2, 1e-6);
  EXPECT_NEAR(neighbours_period(steps, rows, 4), 0.1537 + 0.0756 * 32 / 16, 1e-6);
  EXPECT_NEAR(neighbours_period(steps, rows, 2), 0.0601 + 0.0936 * 8 / 24, 1e-6);
  EXPECT_EQ(neighbours_period(steps, {4, 8}, 0), 0);  // two sizes say nothing
}

// The pipeline's schedules on 2 stages and 4 micro-batches: GPipe's work
// as 1F1B's, its transfers no longer (PlanPipeline's tests), holding all 4
// micro-batches' activations against 2; two pieces
// a rank halve the bubble, hold 2 (P - 1) + P + 1 = 5 pieces of half a
// stage and cross the link twice as often.
TEST(Plan, GPipeHoldsMoreAndInterleavingShrinksTheBubble) {
  const PlanRequest r = request(4, 64);
  const Calibration c = calibration(4, 64);
  Layout one;
  one.pp = 2;
  one.micro_batches = 4;
  Layout gpipe = one, twice = one;
  gpipe.pp_schedule = "gpipe";
  twice.pp_virtual = 2;
  const Candidate a = predict(r, c, one, 0), g = predict(r, c, gpipe, 0),
                  v = predict(r, c, twice, 0);
  EXPECT_NEAR(g.compute_s, a.compute_s, 1e-12);
  EXPECT_LE(g.transfer_s, a.transfer_s);
  EXPECT_GT(g.memory_bytes, a.memory_bytes);
  EXPECT_LT(v.compute_s, a.compute_s);
  EXPECT_GT(v.transfer_s, a.transfer_s);
  // The arena's part over the stages' (the parameters, state and summed
  // gradients are alike): 4 : 2 : 2.5.
  const double fixed = a.memory_bytes - (g.memory_bytes - a.memory_bytes);
  EXPECT_NEAR((v.memory_bytes - fixed) / (a.memory_bytes - fixed), 2.5 * 1.05 / 1.1 / 2, 1e-9);
  // Four pieces a rank: the bubble shrinks again, the hops grow again, and
  // the first stage holds 9 pieces of a quarter stage (2 (P - 1) + 3 P + 1).
  Layout fourfold = one;
  fourfold.pp_virtual = 4;
  const Candidate v4 = predict(r, c, fourfold, 0);
  EXPECT_LT(v4.compute_s, v.compute_s);
  EXPECT_GT(v4.transfer_s, v.transfer_s);
  EXPECT_NEAR((v4.memory_bytes - fixed) / (a.memory_bytes - fixed), 2.25 * 1.02 / 1.1 / 2, 1e-9);
  EXPECT_NE(v4.flags().find("--pp-virtual 4"), std::string::npos) << v4.flags();
  const std::string yaml = plan_yaml(v, r, train::TrainSettings{});
  EXPECT_NE(yaml.find("pp-virtual: 2"), std::string::npos) << yaml;
  EXPECT_NE(plan_yaml(g, r, train::TrainSettings{}).find("pp-schedule: gpipe"), std::string::npos);
}

// Sequence parallelism: half the rows' norms and adds, half the arena's
// share, the same bytes on the wire in twice the collectives: where an
// all-reduce was, a reduce-scatter or an all-gather in the forward and
// its opposite in the backward, a pair (priced as the all-reduce where
// the pair was not measured) and two waits; plus the parameters' sums
// (one bucket with one micro-batch).
TEST(Plan, SequenceParallelismSplitsTheRowWiseWork) {
  const PlanRequest r = request(2, 64);  // no data-parallel all-reduce
  const Calibration c = calibration(4, 64);
  Layout tp;
  tp.tp = 2;
  Layout sp = tp;
  sp.sequence_parallel = true;
  const Candidate a = predict(r, c, tp, 0), b = predict(r, c, sp, 0);
  EXPECT_NEAR(b.other_s / a.other_s, 0.55 / 0.7, 1e-9);
  EXPECT_EQ(b.product_s, a.product_s);
  EXPECT_LT(b.memory_bytes, a.memory_bytes);
  // Per micro-batch: 4 all-reduces of 4096 x 64 rows against 4 pairs, the
  // syncs of 4 more collectives, and one bucket of 3 KiB.
  const Group g{2, 1};
  const double rows = 64, ar = c.allreduce.at(g).time(4096 * rows), sync = c.sync_s.at(g);
  EXPECT_NEAR(a.allreduce_s, 4 * (ar + sync), 1e-12);
  EXPECT_NEAR(b.allreduce_s, 4 * (ar + 2 * sync) + c.allreduce.at(g).time(3072) + sync, 1e-12);
  // With micro-batches the parameters are summed one by one.
  sp.micro_batches = 2;
  const Candidate m2 = predict(r, c, sp, 0);
  const double one = 4 * (c.allreduce.at(g).time(4096 * 32) + 2 * sync);
  double each = 0;
  for (double bytes : {512.0, 512.0, 2048.0}) each += c.allreduce.at(g).time(bytes) + sync;
  EXPECT_NEAR(m2.allreduce_s, 2 * (one + each), 1e-12);
  const std::string yaml = plan_yaml(b, r, train::TrainSettings{});
  EXPECT_NE(yaml.find("sequence-parallel: true"), std::string::npos) << yaml;
  EXPECT_EQ(plan_yaml(a, r, train::TrainSettings{}).find("sequence-parallel"), std::string::npos);
  EXPECT_NE(candidates_json({b}).find("\"sequence_parallel\": true"), std::string::npos);
}

// A pipeline of tensor-parallel stages sends the cut's activation from
// every rank of the group; with sequence parallelism each rank's 1/T of
// the rows (the residual stream is sharded there).
TEST(Plan, SequenceParallelStagesSendTheirShareOfTheRows) {
  const PlanRequest r = request(4, 64);
  const Calibration c = calibration(4, 64);
  Layout tp;
  tp.tp = 2;
  tp.pp = 2;
  tp.micro_batches = 4;
  Layout sp = tp;
  sp.sequence_parallel = true;
  const Candidate a = predict(r, c, tp, 0), b = predict(r, c, sp, 0);
  const Group hop{2, 2, 0, 4};
  const double rows = 16, slots = 4 + 1;
  auto replayed = [&](const Candidate& k, double bytes) {
    const double h = c.allreduce.at(hop).time(bytes);
    return pipeline_transfer_s("1f1b", 2, 4, 1, (k.compute_s - k.update_s) / slots, {h, h});
  };
  EXPECT_NEAR(a.transfer_s, replayed(a, 8192 * rows), 1e-12);
  EXPECT_NEAR(b.transfer_s, replayed(b, 8192 * rows / 2), 1e-12);
  EXPECT_LT(b.transfer_s, a.transfer_s);
}

// An interleaved pipeline the calibration built: the layout of that build
// (tp 1, ZeRO 0) holds what it measured; others of the same stages, pieces
// and micro-batches are scaled alike; the rest keep the formula.
TEST(Plan, AnInterleavedPipelineHoldsWhatItsBuiltStepHeld) {
  const PlanRequest r = request(4, 64);
  Calibration c = calibration(4, 64);
  Layout l;
  l.pp = 2;
  l.pp_virtual = 2;
  l.micro_batches = 4;
  const Candidate before = predict(r, c, l, 0), before_z1 = predict(r, c, l, 1);
  c.built_held[family_key(l)] = 0.8 * before.memory_bytes;
  EXPECT_EQ(family_key(l), "tp1/pp2/1f1b/v2/m4");
  EXPECT_NEAR(predict(r, c, l, 0).memory_bytes, 0.8 * before.memory_bytes, 1e-6);
  EXPECT_NEAR(predict(r, c, l, 1).memory_bytes, 0.8 * before_z1.memory_bytes, 1e-6);
  EXPECT_EQ(predict(r, c, l, 0).step_s, before.step_s);
  Layout other = l;
  other.micro_batches = 8;  // not built: the formula
  Calibration plain = calibration(4, 64);
  EXPECT_EQ(predict(r, c, other, 0).memory_bytes, predict(r, plain, other, 0).memory_bytes);
  Layout one = l;
  one.pp_virtual = 1;  // 1F1B: the formula
  EXPECT_EQ(predict(r, c, one, 0).memory_bytes, predict(r, plain, one, 0).memory_bytes);
  auto back = parse_calibration(calibration_json(c));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->built_held, c.built_held);
  // Its tensor-parallel twin takes the same scale (built at tp 1 only).
  Layout twin = l;
  twin.tp = 2;
  EXPECT_NEAR(predict(request(4, 64), c, twin, 0).memory_bytes,
              0.8 * predict(request(4, 64), plain, twin, 0).memory_bytes, 1e-6);
  // A tensor-parallel family built on its own.
  Layout tp;
  tp.tp = 2;
  tp.micro_batches = 2;
  const double formula = predict(r, plain, tp, 0).memory_bytes;
  c.built_held[family_key(tp)] = 1.1 * formula;
  EXPECT_NEAR(predict(r, c, tp, 0).memory_bytes, 1.1 * formula, 1e-6);
  tp.sequence_parallel = true;  // another family: not built
  EXPECT_EQ(predict(r, c, tp, 0).memory_bytes, predict(r, plain, tp, 0).memory_bytes);
}

TEST(Plan, AMemoryBudgetPutsWhatFitsFirst) {
  PlanRequest r = request(4, 64);
  const Calibration c = calibration(4, 64);
  const Candidate plain = predict(r, c, Layout{}, 0);
  r.mem_per_rank = 0.8 * plain.memory_bytes;
  const auto cs = plan_layouts(r, c);
  ASSERT_FALSE(cs.empty());
  EXPECT_TRUE(cs.front().fits);
  EXPECT_LE(cs.front().memory_bytes, r.mem_per_rank);
  bool over = false;
  for (const Candidate& k : cs) {
    if (!k.fits) over = true;
    EXPECT_TRUE(!over || !k.fits) << "a layout that fits after one that does not: " << k.flags();
    EXPECT_EQ(k.fits, k.memory_bytes <= r.mem_per_rank) << k.flags();
  }
  EXPECT_TRUE(over);
  EXPECT_NE(plan_table(cs, cs.size()).find("over the budget"), std::string::npos);
}

// A variant measured at one size scales every size: recomputation that
// halves the activations and costs a third more products; bf16 products
// twice as fast with gradients half as wide on the wire.
TEST(Plan, PrecisionAndRecomputationAreSearchedWhereTheyApply) {
  const PlanRequest r = request(4, 64);
  Calibration c = calibration(4, 64);
  c.variant_rows = 16;
  train::StepProfile full = c.steps.at(16);
  full.product_s *= 4.0 / 3.0;
  full.arena_bytes = 8'000'000 + 8'000'000;  // the gradients, half the activations
  c.variants[variant_key("f32", "full")] = full;
  train::StepProfile bf16 = c.steps.at(16);
  bf16.product_s /= 2;
  c.variants[variant_key("bf16", "none")] = bf16;
  const Layout plain;
  const Candidate base = predict(r, c, plain, 1), rec = predict(r, c, plain, 1, "f32", "full"),
                  half = predict(r, c, plain, 1, "bf16", "none");
  EXPECT_LT(rec.memory_bytes, base.memory_bytes);
  EXPECT_GT(rec.compute_s, base.compute_s);
  EXPECT_LT(half.compute_s, base.compute_s);
  EXPECT_LT(half.comm_s, base.comm_s);  // bf16 on the wire below ZeRO-3
  EXPECT_NE(rec.flags().find("--recompute full"), std::string::npos) << rec.flags();
  EXPECT_NE(half.flags().find("--precision bf16"), std::string::npos) << half.flags();
  int recomputed = 0, halves = 0;
  for (const Candidate& k : plan_layouts(r, c)) {
    if (k.precision == "bf16") ++halves;
    if (k.recompute == "none") continue;
    ++recomputed;
    EXPECT_TRUE(k.layout.tp == 1 && k.layout.pp == 1 && micro_batches(k.layout) == 1 && k.zero < 3)
        << "recomputation priced where it was not measured: " << k.flags();
  }
  EXPECT_EQ(recomputed, 3);  // dp 4, ZeRO 0-2
  EXPECT_EQ(halves, static_cast<int>(plan_layouts(r, calibration(4, 64)).size()));
  const std::string yaml = plan_yaml(rec, r, train::TrainSettings{});
  EXPECT_NE(yaml.find("recompute: full"), std::string::npos) << yaml;
  // Built with data parallelism over every rank, the step held 15% more
  // than the formula: every recomputing layout is scaled alike.
  const Candidate rec0 = predict(r, c, plain, 0, "f32", "full");
  c.recompute_held["full"] = 1.15 * rec0.memory_bytes;
  EXPECT_NEAR(predict(r, c, plain, 0, "f32", "full").memory_bytes, 1.15 * rec0.memory_bytes, 1e-6);
  EXPECT_NEAR(predict(r, c, plain, 1, "f32", "full").memory_bytes, 1.15 * rec.memory_bytes, 1e-6);
  EXPECT_EQ(predict(r, c, plain, 1).memory_bytes, base.memory_bytes);  // no recomputation
  auto back = parse_calibration(calibration_json(c));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->recompute_held, c.recompute_held);
}

TEST(Plan, MicroBatchSizesAreThoseTheLayoutsUse) {
  const auto rows = micro_batch_rows(request(2, 24));
  // dp 2: 12 per rank / 1, 2, 4; dp 1 (tp 2 or pp 2): 24 / 1, 2, 4 and 24 / 2, 4, 8.
  EXPECT_EQ(rows, (std::vector<std::int64_t>{3, 6, 12, 24}));
}

TEST(Plan, TheCalibrationRoundTripsAndBadTextIsNamed) {
  Calibration c = calibration(4, 2);
  c.hosts = 2;
  auto back = parse_calibration(calibration_json(c));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(calibration_json(*back), calibration_json(c));
  EXPECT_EQ(back->tp.at(4).refused, "heads do not divide");
  EXPECT_EQ(back->tp_sequence.at(2).shard_bytes_per_row.size(), 4u);
  EXPECT_EQ(back->tp_sequence.at(2).param_sum_bytes, (std::vector<double>{512, 512, 2048}));
  EXPECT_EQ(back->tp.at(2).other_ratio, 0.7);
  EXPECT_EQ(back->pp_interleaved.at(2).at(4).refused, "8 pieces of a 6-layer model");
  EXPECT_EQ(back->pp_interleaved.at(2).at(2).stage_share, 1.05 / 2);
  EXPECT_EQ(back->pp_interleaved.at(4).at(2).stage_share, 1.02 / 2);
  EXPECT_EQ(back->hosts, 2);
  EXPECT_EQ(back->allreduce.size(), 7u);
  c.hosts = 3;  // 4 ranks cannot be spread evenly over 3 hosts
  EXPECT_FALSE(parse_calibration(calibration_json(c)).ok());
  auto bad = parse_calibration("{\"ranks\": 2}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("plan calibration"), std::string::npos);
  EXPECT_FALSE(parse_calibration("not json").ok());
}

// The forward graph of `model` at `rows` rows, as the trainer builds it.
graph::Graph forward(const train::Model& model, Shape x, std::int64_t labels) {
  graph::Graph g;
  graph::Builder b(g);
  graph::Value xv = b.input("x", DType::kF32, x);
  graph::Value y = b.input("labels", DType::kI32, {labels});
  train::ModelContext mc(b, true);
  b.cross_entropy(model.forward(mc, xv), y);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return g;
}

train::GptConfig small_gpt() {
  train::GptConfig c;
  c.layers = 2;
  c.heads = 4;
  c.dim = 32;
  c.context = 8;
  return c;
}

TEST(PlanShape, APipelineOfTheGptAndNoneOfABatchNormModel) {
  auto gpt = train::gpt_model(small_gpt(), 40);
  ASSERT_TRUE(gpt.ok());
  const graph::Graph g = forward(*gpt, {4, 8}, 32);
  const PpShape two = pp_shape(g, 2);
  ASSERT_EQ(two.refused, "");
  EXPECT_GT(two.stage_share, 0.45);
  EXPECT_LT(two.stage_share, 0.8);
  EXPECT_GT(two.param_share, 0.2);
  EXPECT_LT(two.param_share, 0.95);
  EXPECT_EQ(two.boundary_bytes_per_row, 8 * 32 * 4.0);  // [rows, T, dim] f32 per row
  EXPECT_LT(pp_shape(g, 4).stage_share, two.stage_share);
  // Two pieces a rank (4 in all, each balanced on its own as the trainer
  // cuts them): the rank holding pieces 0 and 2 of this 2-layer model
  // carries more than a stage of 2 did, still short of the whole.
  const PpShape interleaved = pp_shape(g, 2, 2);
  ASSERT_EQ(interleaved.refused, "");
  EXPECT_GE(interleaved.stage_share, two.stage_share - 1e-9);
  EXPECT_LT(interleaved.stage_share, 0.8);
  EXPECT_GT(interleaved.param_share, 0.2);
  EXPECT_LT(interleaved.param_share, 0.95);
  auto resnet = train::make_model("resnet", 10);
  ASSERT_TRUE(resnet.ok());
  const PpShape bn = pp_shape(forward(*resnet, {2, 1, 28, 28}, 2), 2);
  EXPECT_NE(bn.refused.find("running statistics"), std::string::npos) << bn.refused;
}

TEST(PlanShape, TensorParallelismHalvesTheProductsOnRealCommunicators) {
  auto gpt = train::gpt_model(small_gpt(), 40);
  ASSERT_TRUE(gpt.ok());
  const graph::Graph g = forward(*gpt, {4, 8}, 32);
  auto shapes = testing::run_on_ranks<TpShape>(2, "plan", [&](int, comm::Communicator& c) {
    return Result<TpShape>(tp_shape(g, 2, collective::register_communicator(&c, false)));
  });
  for (const auto& s : shapes) {
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    ASSERT_EQ(s->refused, "");
    // The blocks' products are split in two; the head's (vocabulary) too.
    EXPECT_NEAR(s->product_ratio, 0.5, 0.05);
    EXPECT_LT(s->param_ratio, 0.75);
    EXPECT_GT(s->arena_ratio, 0.3);
    EXPECT_LT(s->arena_ratio, 1.0);
    // Per block: the attention and MLP regions' sums, forward and backward;
    // the embedding's sum.
    EXPECT_GE(s->collective_bytes_per_row.size(), 2u * 2 + 1);
  }
}

// The same split with sequence parallelism: the norms and residual adds
// on half the rows, every region's sum a reduce-scatter and each region's
// input an all-gather, the norms' scales and biases summed.
TEST(PlanShape, SequenceParallelismHalvesTheRowWiseWork) {
  auto gpt = train::gpt_model(small_gpt(), 40);
  ASSERT_TRUE(gpt.ok());
  const graph::Graph g = forward(*gpt, {4, 8}, 32);
  auto shapes = testing::run_on_ranks<std::pair<TpShape, TpShape>>(
      2, "plan", [&](int, comm::Communicator& c) {
        const std::int64_t id = collective::register_communicator(&c, false);
        return Result<std::pair<TpShape, TpShape>>(
            std::pair{tp_shape(g, 2, id), tp_shape(g, 2, id, true)});
      });
  for (const auto& s : shapes) {
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    const auto& [tp, sp] = *s;
    ASSERT_EQ(sp.refused, "");
    EXPECT_EQ(sp.product_ratio, tp.product_ratio);
    EXPECT_LT(sp.other_ratio, tp.other_ratio);
    EXPECT_LT(sp.arena_ratio, tp.arena_ratio);
    EXPECT_TRUE(tp.shard_bytes_per_row.empty());
    // Two regions a block, each opened by an all-gather and closed by a
    // reduce-scatter.
    EXPECT_GE(sp.shard_bytes_per_row.size(), 2u * 2 * 2);
    EXPECT_LT(sp.collective_bytes_per_row.size(), tp.collective_bytes_per_row.size());
    EXPECT_FALSE(sp.param_sum_bytes.empty());  // the norms' scales, at least
  }
}

}  // namespace
}  // namespace shoal::dist
