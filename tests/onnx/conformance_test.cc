// The ONNX project's node tests (Debian libonnx-testdata) through the
// importer: every test of every claimed operator passes; the partial ones
// are run and counted so a regression or a fix shows.
#include "shoal/onnx/conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "shoal/onnx/import.h"

namespace shoal::onnx {
namespace {

TEST(OnnxConformance, EveryNodeTestOfEveryClaimedOperatorPasses) {
  if (!std::filesystem::is_directory(kNodeTestDir))
    GTEST_SKIP() << kNodeTestDir << " is missing (Debian package libonnx-testdata)";
  auto claimed = claimed_ops();
  ASSERT_GE(claimed.size(), 30u);
  auto tests = run_node_tests(kNodeTestDir, claimed);
  ASSERT_TRUE(tests.ok()) << tests.status().to_string();
  std::map<std::string, int> per_op;
  for (const auto& t : *tests) {
    ++per_op[t.op];
    EXPECT_TRUE(t.passed) << t.name << " (" << t.op << "): " << t.error;
  }
  for (const auto& op : claimed) EXPECT_GT(per_op[op], 0) << op << " has no node test";
  std::printf("%zu node tests of %zu claimed operators\n", tests->size(), claimed.size());
}

// The node tests of the partially supported operators that fail, by name:
// what each lacks is a dtype or a variant Shoal does not import (bf16 and
// string casts, int8 clips, dilated or argmax max-pooling,
// edge/reflect padding, negative slice steps, dropout's mask output,
// optional and sequence identities, integer powers). Measured 2026-11-26:
// 77 of 109 pass. A test of this list that passes, or one outside it that
// fails, fails this test: a fix is recorded here, a regression is named.
const std::set<std::string>& known_failing() {
  static const std::set<std::string> k = {
      // Cast
      "test_cast_BFLOAT16_to_FLOAT",
      "test_cast_FLOAT_to_BFLOAT16",
      "test_cast_FLOAT_to_STRING",
      "test_cast_STRING_to_FLOAT",
      "test_castlike_BFLOAT16_to_FLOAT_expanded",
      "test_castlike_FLOAT_to_BFLOAT16_expanded",
      "test_castlike_FLOAT_to_STRING_expanded",
      "test_castlike_STRING_to_FLOAT_expanded",
      // Clip
      "test_clip_default_int8_inbounds",
      "test_clip_default_int8_max",
      "test_clip_default_int8_min",
      // Dropout
      "test_training_dropout",
      "test_training_dropout_default",
      "test_training_dropout_default_mask",
      "test_training_dropout_mask",
      // Identity
      "test_identity_opt",
      "test_identity_sequence",
      // MaxPool
      "test_maxpool_2d_dilations",
      "test_maxpool_2d_uint8",
      "test_maxpool_with_argmax_2d_precomputed_pads",
      "test_maxpool_with_argmax_2d_precomputed_strides",
      // Pad
      "test_edge_pad",
      "test_reflect_pad",
      // Pow
      "test_pow_types_float",
      "test_pow_types_float32_uint32",
      "test_pow_types_float32_uint64",
      "test_pow_types_int32_float32",
      "test_pow_types_int64_float32",
      // Slice
      "test_slice_neg_steps",
  };
  return k;
}

// Tests whose result depends on the host: test_convtranspose passes where
// oneDNN computes it directly and misses by 4e-6 on an exact 0 where it
// picks Winograd (AVX-512 hosts; passes there with SHOAL_CONV_ALGO=direct).
const std::set<std::string>& host_dependent() {
  static const std::set<std::string> k = {"test_convtranspose"};
  return k;
}

TEST(OnnxConformance, PartialOperatorsFailOnlyTheirKnownNodeTests) {
  if (!std::filesystem::is_directory(kNodeTestDir))
    GTEST_SKIP() << kNodeTestDir << " is missing (Debian package libonnx-testdata)";
  auto claimed = claimed_ops();
  std::vector<std::string> partial;
  for (const auto& op : supported_ops())
    if (std::find(claimed.begin(), claimed.end(), op) == claimed.end()) partial.push_back(op);
  auto tests = run_node_tests(kNodeTestDir, partial);
  ASSERT_TRUE(tests.ok()) << tests.status().to_string();
  int passed = 0;
  std::set<std::string> seen;
  for (const auto& t : *tests) {
    passed += t.passed;
    seen.insert(t.name);
    if (host_dependent().count(t.name)) continue;
    if (known_failing().count(t.name))
      EXPECT_FALSE(t.passed) << t.name << " (" << t.op
                             << ") passes now: take it off known_failing()";
    else
      EXPECT_TRUE(t.passed) << t.name << " (" << t.op << "): " << t.error;
  }
  for (const auto& name : known_failing())
    EXPECT_TRUE(seen.count(name)) << name << " is not a node test of a partial operator";
  std::printf("partial operators: %d of %zu node tests pass\n", passed, tests->size());
}

}  // namespace
}  // namespace shoal::onnx
