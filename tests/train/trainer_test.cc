#include "shoal/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "shoal/tensor/safetensors.h"
#include "shoal/train/checkpoint.h"
#include "temp_dir.h"

namespace shoal::train {
namespace {
namespace fs = std::filesystem;

std::string tmpdir(const std::string& tag) { return testing::scratch_dir(tag) + "/run"; }

// Small and quick: 1024 training samples, batch 32 -> 32 steps per epoch.
TrainOptions small(const std::string& model, const std::string& opt, const std::string& out) {
  TrainOptions o;
  o.model = model;
  o.optimizer = opt;
  o.lr = opt == "adam" || opt == "adamw" || opt == "lamb" ? 0.002 : 0.02;
  o.weight_decay = 1e-4;
  o.epochs = 3;
  o.batch = 32;
  o.limit_train = 1024;
  o.limit_test = 500;
  o.threads = 2;
  o.seed = 9;
  o.quiet = true;
  o.plot = false;
  o.deterministic = true;
  o.schedule = "cosine";
  o.warmup_epochs = 0.5;
  o.augment = true;
  o.out = out;
  return o;
}

std::map<std::string, Tensor> train_to(TrainOptions o, std::int64_t steps) {
  o.max_steps = steps;
  auto t = Trainer::create(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return {};
  Status st = (*t)->run();
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ((*t)->global_step(), steps);
  std::map<std::string, Tensor> out;
  for (const auto& [n, p] : (*t)->params()) out[n] = p.clone();
  return out;
}

void expect_bit_identical(const std::map<std::string, Tensor>& a,
                          const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (const auto& [n, t] : a) {
    const Tensor& u = b.at(n);
    ASSERT_EQ(t.nbytes(), u.nbytes()) << n;
    EXPECT_EQ(std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()), 0) << "parameter " << n;
  }
}

// An interrupted and resumed run ends with the same bits as an
// uninterrupted one: params, BN buffers, optimizer state, lr schedule step
// and the data position (mid-epoch, with augmentation) all restored.
TEST(Trainer, ResumeIsBitIdentical) {
  for (auto [model, opt] :
       {std::pair{"cnn", "momentum"}, std::pair{"mlp", "adamw"}, std::pair{"mlp", "lars"}}) {
    SCOPED_TRACE(std::string(model) + "/" + opt);
    std::string d1 = tmpdir("full"), d2 = tmpdir("resumed");
    auto full = train_to(small(model, opt, d1), 80);
    train_to(small(model, opt, d2), 45);  // stops inside epoch 2, checkpoint at step 45
    TrainOptions r = small(model, opt, d2);
    r.resume = true;
    auto resumed = train_to(r, 80);
    expect_bit_identical(full, resumed);
    // And it really trained: the weights moved away from the initial ones.
    TrainOptions z = small(model, opt, tmpdir("zero"));
    z.checkpoints = false;
    auto t0 = Trainer::create(z);
    ASSERT_TRUE(t0.ok());
    const Tensor& w0 = (*t0)->params().begin()->second;
    EXPECT_NE(std::memcmp(w0.raw_data(), full.begin()->second.raw_data(), w0.nbytes()), 0);
    fs::remove_all(d1);
    fs::remove_all(d2);
  }
}

TEST(Trainer, CorruptNewestCheckpointIsRefusedAndPreviousLoads) {
  std::string d = tmpdir("corrupt");
  TrainOptions o = small("mlp", "momentum", d);
  o.checkpoint_every = 10;
  o.keep_checkpoints = 3;
  train_to(o, 40);
  CheckpointDir cd(d + "/checkpoints", 3);
  auto files = cd.list();
  ASSERT_EQ(files.size(), 3u);  // 40, 30, 20: older ones pruned
  EXPECT_NE(files[0].find("ckpt-0000000040"), std::string::npos);

  // Flip one byte of tensor data in the newest: the CRC catches it.
  auto bytes = read_file(files[0]);
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[bad.size() - 5] ^= 0x40;
  ASSERT_TRUE(write_file_atomic(files[0], bad).ok());
  auto l = load_checkpoint(files[0]);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("checksum mismatch"), std::string::npos);
  EXPECT_NE(l.status().message().find(files[0]), std::string::npos);

  // Truncate the second newest: refused by the safetensors reader.
  auto b2 = read_file(files[1]);
  ASSERT_TRUE(b2.ok());
  ASSERT_TRUE(write_file_atomic(files[1], b2->substr(0, b2->size() / 2)).ok());
  EXPECT_FALSE(load_checkpoint(files[1]).ok());

  std::vector<std::string> refused;
  auto latest = cd.load_latest(&refused);
  ASSERT_TRUE(latest.ok()) << latest.status().to_string();
  EXPECT_EQ(latest->first, files[2]);
  EXPECT_EQ(refused.size(), 2u);
  EXPECT_EQ(latest->second.get_int("step", -1), 20);

  // A resuming trainer continues from step 20.
  TrainOptions r = o;
  r.resume = true;
  auto t = Trainer::create(r);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->global_step(), 20);
  fs::remove_all(d);
}

TEST(Trainer, ResumeRefusesAnotherConfiguration) {
  std::string d = tmpdir("mismatch");
  train_to(small("mlp", "momentum", d), 5);
  // A fresh run into a directory with checkpoints would mix two runs.
  auto again = Trainer::create(small("mlp", "momentum", d));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("--resume"), std::string::npos);
  TrainOptions r = small("mlp", "adam", d);
  r.resume = true;
  auto t = Trainer::create(r);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("optimizer"), std::string::npos) << t.status().to_string();
  fs::remove_all(d);
}

TEST(Trainer, WritesMetricsAndRejectsBadOptions) {
  std::string d = tmpdir("metrics");
  TrainOptions o = small("mlp", "sgd", d);
  o.epochs = 2;
  o.checkpoints = false;
  auto t = Trainer::create(o);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->run().ok());
  ASSERT_EQ((*t)->history().size(), 2u);
  EXPECT_GT((*t)->history()[1].test_acc, 0.5);  // 1024 samples, 2 epochs: well above 10%
  std::ifstream in(d + "/metrics.jsonl");
  std::string line;
  int epochs = 0;
  while (std::getline(in, line)) epochs += line.find("\"kind\":\"epoch\"") != std::string::npos;
  EXPECT_EQ(epochs, 2);

  TrainOptions bad = o;
  bad.model = "transformer";
  EXPECT_NE(Trainer::create(bad).status().message().find("transformer"), std::string::npos);
  bad = o;
  bad.data = "/nonexistent/dir";
  EXPECT_NE(Trainer::create(bad).status().message().find("/nonexistent/dir"), std::string::npos);
  bad = o;
  bad.batch = 4096;
  bad.limit_train = 100;
  EXPECT_NE(Trainer::create(bad).status().message().find("larger than"), std::string::npos);
  fs::remove_all(d);
}

// Every zoo model builds, trains and lowers its loss with every optimizer
// family (a short run on 512 samples).
TEST(Trainer, EveryModelLearns) {
  for (auto [model, opt] : {std::pair{"mlp", "nesterov"}, std::pair{"cnn", "lamb"},
                            std::pair{"resnet", "momentum"}, std::pair{"mlp", "sgd"}}) {
    SCOPED_TRACE(std::string(model) + "/" + opt);
    std::string d = tmpdir("zoo");
    TrainOptions o = small(model, opt, d);
    o.limit_train = 512;
    o.limit_test = 200;
    o.epochs = 3;
    o.augment = false;
    o.checkpoints = false;
    auto t = Trainer::create(o);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE((*t)->run().ok());
    const auto& h = (*t)->history();
    ASSERT_EQ(h.size(), 3u);
    EXPECT_LT(h[2].train_loss, 0.8 * h[0].train_loss);
    EXPECT_GT(h[2].test_acc, 0.3);
    fs::remove_all(d);
  }
}

TEST(Trainer, DivergenceIsReported) {
  std::string d = tmpdir("diverge");
  TrainOptions o = small("mlp", "sgd", d);
  o.lr = 1e6;
  o.checkpoints = false;
  auto t = Trainer::create(o);
  ASSERT_TRUE(t.ok());
  Status st = (*t)->run();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("diverged"), std::string::npos) << st.to_string();
  fs::remove_all(d);
}

}  // namespace
}  // namespace shoal::train
