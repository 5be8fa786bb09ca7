// Weights in and out of Shoal: `shoal eval` of a checkpoint gives the
// accuracy its run printed; --init-from refuses weights that do not fit,
// naming every tensor; and a round trip with PyTorch (Debian's python3 and
// python3-torch, safetensors written and read by hand): PyTorch trains and
// saves, Shoal evaluates to PyTorch's accuracy and trains on from it, and
// PyTorch evaluates Shoal's checkpoint to Shoal's accuracy.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli/run_shoal.h"
#include "temp_dir.h"

namespace {

using Result = shoal::testing::ShoalRun;
using shoal::testing::run_sh;
using shoal::testing::run_shoal;

bool has(const Result& r, const std::string& s) { return r.out.find(s) != std::string::npos; }

// The percentage right after the last `prefix` in `out`, or -1. (No
// std::regex: GCC 12 warns inside it under ASan.)
double accuracy(const std::string& out, const std::string& prefix) {
  const std::size_t at = out.rfind(prefix);
  if (at == std::string::npos) return -1;
  char* end = nullptr;
  const char* p = out.c_str() + at + prefix.size();
  const double v = std::strtod(p, &end);
  return end != p && *end == '%' ? v : -1;
}

std::string newest_checkpoint(const std::string& run) {
  std::string best;
  for (const auto& e : std::filesystem::directory_iterator(run + "/checkpoints"))
    if (e.path().extension() == ".safetensors" && e.path().string() > best) best = e.path();
  return best;
}

TEST(Interop, EvalOfACheckpointGivesTheAccuracyItsRunPrinted) {
  shoal::testing::TempDir dir("eval");
  Result t = run_shoal(
      "train --model mlp --epochs 1 --limit-train 4096 --limit-test 1000 "
      "--no-plot --quiet --out " +
      dir.path() + "/run");
  ASSERT_EQ(t.code, 0) << t.out;
  const double trained = accuracy(t.out, "final: test accuracy ");
  ASSERT_GT(trained, 0) << t.out;
  Result e = run_shoal("eval --model mlp --limit-test 1000 --weights " +
                       newest_checkpoint(dir.path() + "/run"));
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_DOUBLE_EQ(accuracy(e.out, " accuracy "), trained) << t.out << e.out;
  EXPECT_TRUE(has(e, "on 1000 images")) << e.out;
}

TEST(Interop, WeightsThatDoNotFitAreRefusedNamingEveryTensor) {
  shoal::testing::TempDir dir("init");
  Result t = run_shoal(
      "train --model mlp --max-steps 2 --limit-train 512 --limit-test 64 "
      "--no-plot --quiet --out " +
      dir.path() + "/run");
  ASSERT_EQ(t.code, 0) << t.out;
  Result r = run_shoal(
      "train --model cnn --max-steps 1 --no-plot --no-checkpoints --quiet "
      "--init-from " +
      newest_checkpoint(dir.path() + "/run"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r, "does not fit the model: missing (10): ")) << r.out;
  EXPECT_TRUE(has(r, "block1.conv.weight [32, 1, 3, 3]")) << r.out;
  EXPECT_TRUE(has(r, "param/fc1.weight is f32 [512, 784], the model needs f32 [128, 3136]"))
      << r.out;
  EXPECT_TRUE(has(r, "not in the model (2): param/fc3.bias [10], param/fc3.weight [10, 256]"))
      << r.out;
  Result none = run_shoal("eval --model mlp --weights " + dir.path() + "/none.safetensors");
  EXPECT_NE(none.code, 0) << none.out;
  EXPECT_TRUE(has(none, dir.path() + "/none.safetensors: cannot open")) << none.out;
}

TEST(Interop, PyTorchWeightsRoundTrip) {
  if (run_sh("/usr/bin/python3 -c 'import torch, numpy'").code != 0)
    GTEST_SKIP() << "Debian's python3-torch is not installed (tools/install-deps.sh installs it)";
  shoal::testing::TempDir dir("torch");
  const std::string py =
      "/usr/bin/python3 " + std::string(SHOAL_SOURCE_DIR) + "/tests/python/torch_roundtrip.py";
  // PyTorch trains an MLP with Shoal's layer names and saves its state_dict.
  Result pt = run_sh(py + " train " + dir.path() + "/torch.safetensors --limit-train 8192");
  ASSERT_EQ(pt.code, 0) << pt.out;
  const double torch_acc = accuracy(pt.out, "torch: test accuracy ");
  ASSERT_GT(torch_acc, 60) << pt.out;
  // Shoal evaluates PyTorch's weights to PyTorch's accuracy (the same
  // inputs, normalized as the file says; float sums in another order may
  // flip a borderline image, hence 0.02 points)...
  Result ev = run_shoal("eval --model mlp --weights " + dir.path() + "/torch.safetensors");
  ASSERT_EQ(ev.code, 0) << ev.out;
  EXPECT_NEAR(accuracy(ev.out, " accuracy "), torch_acc, 0.02) << pt.out << ev.out;
  // ... trains on from them (a better model than a random start after one epoch) ...
  Result tr = run_shoal("train --model mlp --init-from " + dir.path() +
                        "/torch.safetensors --epochs 1 --limit-train 8192 --lr 0.01 --no-plot "
                        "--quiet --out " +
                        dir.path() + "/run");
  ASSERT_EQ(tr.code, 0) << tr.out;
  EXPECT_TRUE(has(tr, "initialized 6 tensors from")) << tr.out;
  const double shoal_acc = accuracy(tr.out, "final: test accuracy ");
  EXPECT_GT(shoal_acc, torch_acc) << pt.out << tr.out;
  // ... and PyTorch reads Shoal's checkpoint back to Shoal's accuracy.
  Result back = run_sh(py + " eval " + newest_checkpoint(dir.path() + "/run"));
  ASSERT_EQ(back.code, 0) << back.out;
  EXPECT_NEAR(accuracy(back.out, "torch: test accuracy "), shoal_acc, 0.02) << tr.out << back.out;
  std::printf("PyTorch %.2f%% -> Shoal eval %.2f%%; Shoal trained %.2f%% -> PyTorch eval %.2f%%\n",
              torch_acc, accuracy(ev.out, " accuracy "), shoal_acc,
              accuracy(back.out, "torch: test accuracy "));
}

}  // namespace
