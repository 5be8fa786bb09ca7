// Full-data accuracy on Fashion-MNIST (label "accuracy": run by `make test`,
// skipped by the sanitizer build). Recipes and their measured results are
// in README.md; thresholds are the issue's: MLP >= 88%, CNN >= 91%, and the
// same CNN written in PyTorch and exported to ONNX within 0.5 points of it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "cli/run_shoal.h"
#include "shoal/runtime/backend.h"
#include "shoal/tensor/safetensors.h"
#include "shoal/train/trainer.h"
#include "temp_dir.h"

namespace shoal::train {
namespace {

// Trains `model` with the CNN/MLP recipe; writes its initial parameters to
// `initial` (safetensors) when given.
double train_full(const std::string& model, int epochs, const std::string& initial = "",
                  const std::string& precision = "f32") {
  TrainOptions o;
  o.model = model;
  o.precision = precision;
  o.optimizer = "momentum";
  o.lr = model == "mlp" ? 0.02 : 0.05;
  const std::string tag = std::filesystem::path(model).stem().string() + "_" + precision;
  o.schedule = "cosine";
  o.epochs = epochs;
  o.batch = 64;
  o.threads = 2;
  o.seed = 0;
  o.quiet = true;
  o.plot = false;
  o.checkpoints = false;
  o.out = shoal::testing::scratch_dir("acc_" + tag) + "/run";
  auto t = Trainer::create(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return 0;
  if (!initial.empty()) {
    std::vector<std::pair<std::string, Tensor>> w((*t)->params().begin(), (*t)->params().end());
    Status ws = write_safetensors(initial, w);
    EXPECT_TRUE(ws.ok()) << ws.to_string();
  }
  Status st = (*t)->run();
  EXPECT_TRUE(st.ok()) << st.to_string();
  std::filesystem::remove_all(o.out);
  double acc = (*t)->history().back().test_acc, secs = 0;
  for (const auto& e : (*t)->history()) secs += e.wall_seconds;
  std::printf("%s: %d epochs, test accuracy %.2f%%, %.1f s, %.0f img/s\n", tag.c_str(), epochs,
              100 * acc, secs, (*t)->history().back().images_per_s);
  return acc;
}

TEST(Accuracy, MlpReaches88PercentIn5Epochs) { EXPECT_GE(train_full("mlp", 5), 0.88); }

// The built-in CNN, then the same layers written in PyTorch
// (tools/peer_train_torch.py), given the built-in's initial weights,
// exported by torch 1.13 and trained from its ONNX file with the same recipe
// (same seed: same batches). Differences left are the kernels' rounding.
// With independent initial weights the gap was init noise: 92.32% (PyTorch's
// default init) and 90.78% (Shoal's init family, other draws) against 91.45%.
TEST(Accuracy, CnnReaches91PercentIn4EpochsAndItsOnnxExportMatches) {
  const std::string dir = shoal::testing::scratch_dir("acc_onnx");
  const double built_in = train_full("cnn", 4, dir + "/initial.safetensors");
  EXPECT_GE(built_in, 0.91);
  auto r = shoal::testing::run_sh(
      fmt::format("/usr/bin/python3 {}/tests/python/onnx_export.py cnn {} --init-from {}",
                  SHOAL_SOURCE_DIR, dir, dir + "/initial.safetensors"));
  if (r.code != 0) GTEST_SKIP() << "cannot export with Debian's python3-torch/onnx: " << r.out;
  const double exported = train_full(dir + "/model.onnx", 4);
  EXPECT_NEAR(exported, built_in, 0.005) << "exported CNN vs --model cnn";
}

// --precision bf16: the same recipe with the convolutions and the
// classifier's matmuls in bf16 (f32 master weights) reaches what f32 does.
TEST(Accuracy, CnnReaches91PercentIn4EpochsInBf16) {
  if (Status st = shoal::runtime::bf16_support(); !st.ok()) GTEST_SKIP() << st.to_string();
  EXPECT_GE(train_full("cnn", 4, "", "bf16"), 0.91);
}

}  // namespace
}  // namespace shoal::train
