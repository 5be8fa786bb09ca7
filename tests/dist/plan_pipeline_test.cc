// dist/plan_internal.h's pipeline_transfer_s: a pipeline's ranks replayed
// in the trainer's order, worked by hand on small cases, and every
// schedule the plan enumerates replayed to its end.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dist/plan_internal.h"

namespace shoal::dist {
namespace {

// One micro-batch goes down the pipeline and back: each cut once each
// way, in series, whatever the schedule.
TEST(PlanPipeline, OneMicroBatchCrossesEveryCutTwice) {
  const std::vector<double> hop = {0.25, 0.5, 0.25, 9.0};  // the last: back to rank 0, unused
  for (const char* s : {"1f1b", "gpipe"})
    EXPECT_NEAR(pipeline_transfer_s(s, 4, 1, 1, 3.0, hop), 2 * (0.25 + 0.5 + 0.25), 1e-12) << s;
}

// GPipe over 2 ranks, 2 micro-batches, a piece 1 s forward and 2 s
// backward, hops of 0.5 s. Without hops: 9 s. With them rank 1 starts at
// 1.5, its forwards end at 3.5, the backwards at 7.5 (the gradients arrive
// at 6 and 8), rank 0 ends at 10: the hops add two of theirs.
TEST(PlanPipeline, GPipeByHand) {
  EXPECT_NEAR(pipeline_transfer_s("gpipe", 2, 2, 1, 3.0, {0.5, 0.5}), 1.0, 1e-12);
}

// 1F1B alike: rank 1 runs F0 B0 F1 B1. Its receive of micro-batch 1's
// activation queues behind its send of micro-batch 0's gradient (one
// progress thread sends and receives in turn), so F1 starts at 5, not
// 4.5: rank 0 ends at 10.5 against 9, three hops.
TEST(PlanPipeline, AReceiveWaitsForTheSendsBeforeIt) {
  EXPECT_NEAR(pipeline_transfer_s("1f1b", 2, 2, 1, 3.0, {0.5, 0.5}), 1.5, 1e-12);
}

// A link far faster than a piece: GPipe's transfers hide behind its
// forwards and backwards but for the fill and drain, two hops. Under 1F1B
// over 2 ranks rank 1 sends each gradient just before it receives the next
// activation, so each of the m receives waits out a send: m + 1 hops.
TEST(PlanPipeline, AFastLinkShowsWhereNothingHidesIt) {
  const double h = 0.01;
  for (int m : {2, 4, 8, 16}) {
    EXPECT_NEAR(pipeline_transfer_s("gpipe", 2, m, 1, 3.0, {h, h}), 2 * h, 1e-9) << m;
    EXPECT_NEAR(pipeline_transfer_s("1f1b", 2, m, 1, 3.0, {h, h}), (m + 1) * h, 1e-9) << m;
  }
}

// A link slower than a piece: every activation rank 1 needs passes rank
// 0's one progress thread in turn, so the step grows by about a hop per
// micro-batch.
TEST(PlanPipeline, ASlowLinkShowsAtEveryMicroBatch) {
  const double h = 30.0;
  for (const char* s : {"1f1b", "gpipe"})
    for (int m : {2, 4, 8}) {
      const double t = pipeline_transfer_s(s, 2, m, 1, 3.0, {h, h});
      EXPECT_GE(t, (m - 1) * h) << s << " m " << m;
      EXPECT_LE(t, 2 * (m + 1) * h) << s << " m " << m;
    }
}

// Every schedule the plan prices (mp::stage_work's, interleaved where
// the micro-batches are a multiple of the stages) runs to its end, and a
// slower link never makes a step faster.
TEST(PlanPipeline, EveryScheduleReplaysToItsEnd) {
  for (const char* s : {"1f1b", "gpipe"})
    for (int P : {2, 3, 4, 8})
      for (int v : {1, 2, 3, 4})
        for (int m : {1, 2, 4, 8, 16}) {
          if (v > 1 && m % P != 0) continue;
          const std::vector<double> slow(static_cast<std::size_t>(P), 2.0);
          const std::vector<double> fast(static_cast<std::size_t>(P), 0.1);
          const double a = pipeline_transfer_s(s, P, m, v, 3.0, fast);
          const double b = pipeline_transfer_s(s, P, m, v, 3.0, slow);
          EXPECT_TRUE(std::isfinite(b)) << s << " P " << P << " v " << v << " m " << m;
          EXPECT_GT(a, 0) << s << " P " << P << " v " << v << " m " << m;
          EXPECT_GE(b, a) << s << " P " << P << " v " << v << " m " << m;
        }
}

}  // namespace
}  // namespace shoal::dist
