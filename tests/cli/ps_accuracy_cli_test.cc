// Async parameter-server training reaches the CNN's accuracy on the full
// Fashion-MNIST: `shoal run --ps 1,2 -- shoal train --dist ps --ps-mode
// async --model cnn`. Labelled "accuracy" (make asan skips it): 221 s on the
// 2-core AVX2 VM (552 s, over CI's 600 s, while blocked max pooling ran
// oneDNN's reference loop).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cli/cli_results.h"
#include "cli/run_shoal.h"
#include "temp_dir.h"

namespace shoal {
namespace {

using testing::numbers_after;
using testing::run_shoal;

TEST(PsAccuracy, AsyncCnnReachesNinetyPercent) {
  const std::string dir = testing::scratch_dir("ps_asynccnn");
  auto r = run_shoal(fmt::format(
      "run --ps 1,2 --timeout 600 --ps-snapshots {1}/ps -- {0} train --dist ps --ps-mode async "
      "--model cnn --batch 64 "
      "--epochs 5 --optimizer momentum --lr 0.02 --schedule cosine --no-plot --quiet --out {1}/run",
      SHOAL_BINARY, dir));
  ASSERT_EQ(r.code, 0) << r.out;
  // Each worker evaluates the servers' weights as of its last step (with
  // its own batch-norm statistics).
  const auto acc = numbers_after(r.out, "final: test accuracy ");
  ASSERT_EQ(acc.size(), 2u) << r.out;
  for (double a : acc) EXPECT_GE(a, 90.0) << r.out;
}

}  // namespace
}  // namespace shoal
