// Sharded checkpoints (train/checkpoint.h): shards written one by one as
// the ranks of a job would, read back through the index into the same
// tensors; every way a directory can disagree with its index is refused by
// name; the checkpoint directory lists, loads and prunes them like files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "shoal/core/file.h"
#include "shoal/train/checkpoint.h"
#include "temp_dir.h"

namespace shoal::train {
namespace {
namespace fs = std::filesystem;

Tensor filled(Shape shape, float base) {
  Tensor t = Tensor::zeros(std::move(shape), DType::kF32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = base + 0.5f * i;
  return t;
}

// Five tensors of 12, 7, 5, 5 and 1 elements.
CheckpointState sample_state(std::int64_t step) {
  CheckpointState s;
  s.tensors["param/a"] = filled({3, 4}, 1);
  s.tensors["param/b"] = filled({7}, 2);
  s.tensors["opt/a/m"] = filled({5}, 3);
  s.tensors["opt/b/m"] = filled({5}, 4);
  s.tensors["buf/c"] = filled({1}, 5);
  s.meta["step"] = std::to_string(step);
  s.meta["model"] = "mlp";
  return s;
}

// Writes `shards` shards and the index of `s` into dir, as the ranks do.
void write_all(const std::string& dir, int shards, const CheckpointState& s) {
  const auto all = tensor_metas(s.tensors);
  for (int r = 0; r < shards; ++r) ASSERT_TRUE(save_checkpoint_shard(dir, r, shards, all, s).ok());
  ASSERT_TRUE(write_checkpoint_index(dir, shards, all, s.meta).ok());
}

TEST(CheckpointShards, LargestFirstOntoTheLightestShard) {
  CheckpointState s = sample_state(1);
  // Map order: buf/c(1) opt/a/m(5) opt/b/m(5) param/a(12) param/b(7).
  // 12 -> 0; 7 -> 1; 5 -> 2; 5 -> 2 (lightest: 1 has 7, 2 has 5); 1 -> 1 (7 < 10 < 12).
  EXPECT_EQ(assign_checkpoint_shards(tensor_metas(s.tensors), 3),
            (std::vector<int>{1, 2, 2, 0, 1}));
  EXPECT_EQ(assign_checkpoint_shards(tensor_metas(s.tensors), 1),
            (std::vector<int>{0, 0, 0, 0, 0}));
  // More shards than tensors: some shards hold nothing.
  EXPECT_EQ(assign_checkpoint_shards(tensor_metas(s.tensors), 7),
            (std::vector<int>{4, 2, 3, 0, 1}));
  EXPECT_EQ(checkpoint_shard_name(0, 3), "model-00001-of-00003.safetensors");
}

TEST(CheckpointShards, ShardsAndIndexReadBackAsTheWholeState) {
  for (int shards : {1, 2, 3, 7}) {
    SCOPED_TRACE(shards);
    testing::TempDir d("ckshards");
    CheckpointState s = sample_state(40);
    write_all(d.path(), shards, s);
    auto back = load_checkpoint(d.path());  // a directory: the sharded loader
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    ASSERT_EQ(back->tensors.size(), s.tensors.size());
    for (const auto& [name, t] : s.tensors) {
      const Tensor& u = back->tensors.at(name);
      ASSERT_EQ(u.shape(), t.shape()) << name;
      EXPECT_EQ(std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()), 0) << name;
    }
    EXPECT_EQ(back->get_int("step", -1), 40);
    EXPECT_EQ(back->meta.at("model"), "mlp");
    EXPECT_EQ(back->meta.at("shards"), std::to_string(shards));
  }
}

// Each case spoils a written 3-shard checkpoint one way; the load names it.
TEST(CheckpointShards, ADirectoryThatDisagreesWithItsIndexIsRefusedByName) {
  const std::string second = checkpoint_shard_name(1, 3);
  struct Case {
    const char* what;
    std::function<void(const std::string&)> spoil;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"a shard missing", [&](const std::string& d) { fs::remove(d + "/" + second); },
       "shard 2 of 3 (" + second + ") is missing"},
      {"a shard of another step",
       [&](const std::string& d) {
         testing::TempDir other("ckother");
         write_all(other.path(), 3, sample_state(41));
         fs::copy_file(other.path() + "/" + second, d + "/" + second,
                       fs::copy_options::overwrite_existing);
       },
       "says shard '2 of 3' at step '41'; the index expects shard '2 of 3' at step '40'"},
      {"a flipped byte",
       [&](const std::string& d) {
         std::fstream f(d + "/" + second, std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(-3, std::ios::end);
         f.put('\x7f');
       },
       "checksum mismatch"},
      {"a tensor mapped to another shard",
       [&](const std::string& d) {
         auto text = read_file(d + "/" + kCheckpointIndex);
         std::string t = *text;
         auto at = t.find("\"param/a\": \"model-00001");
         ASSERT_NE(at, std::string::npos) << t;
         t.replace(at + 18, 5, "00002");
         ASSERT_TRUE(write_file_atomic(d + "/" + kCheckpointIndex, t).ok());
       },
       "holds tensor 'param/a', which the index does not map to it"},
      {"a file outside the directory",
       [&](const std::string& d) {
         std::string t = *read_file(d + "/" + kCheckpointIndex);
         auto at = t.find("\"model-00001-of-00003.safetensors\"");
         t.replace(at, 1, "\"../");
         ASSERT_TRUE(write_file_atomic(d + "/" + kCheckpointIndex, t).ok());
       },
       "not a file of this directory"},
      {"no index", [&](const std::string& d) { fs::remove(d + "/" + kCheckpointIndex); },
       "cannot open"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    testing::TempDir d("ckbad");
    write_all(d.path(), 3, sample_state(40));
    c.spoil(d.path());
    auto r = load_checkpoint(d.path());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().to_string().find(c.expect), std::string::npos) << r.status().to_string();
  }
}

TEST(CheckpointShards, AnIndexIsParsedWithEachProblemNamed) {
  const std::string ok =
      R"({"metadata": {"format": "shoal-checkpoint-1", "shards": "2", "total_size": 8},
          "weight_map": {"a": "model-00001-of-00002.safetensors",
                         "b": "model-00002-of-00002.safetensors"}})";
  auto ix = parse_checkpoint_index(ok, "i.json");
  ASSERT_TRUE(ix.ok()) << ix.status().to_string();
  EXPECT_EQ(ix->shards, 2);
  EXPECT_EQ(ix->files.size(), 2u);
  EXPECT_FALSE(ix->meta.count("total_size"));  // a number: Hugging Face's, not ours
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[1, 2]", "i.json: not a JSON object"},
      {R"({"metadata": {}})", "needs the objects \"metadata\" and \"weight_map\""},
      {R"({"metadata": {"format": "x", "shards": "1"}, "weight_map": {}})",
       "metadata format is 'x', expected 'shoal-checkpoint-1'"},
      {R"({"metadata": {"format": "shoal-checkpoint-1", "shards": "0"}, "weight_map": {}})",
       "metadata shards is '0', expected a count"},
      {R"({"metadata": {"format": "shoal-checkpoint-1", "shards": "1"},
           "weight_map": {"a": 3}})",
       "weight_map entry 'a' is not a file name"},
      {R"({"metadata": {"format": "shoal-checkpoint-1", "shards": "1"},
           "weight_map": {"a": "/etc/passwd"}})",
       "names '/etc/passwd', not a file of this directory"},
  };
  for (const auto& [text, want] : bad) {
    auto r = parse_checkpoint_index(text, "i.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().to_string().find(want), std::string::npos) << r.status().to_string();
  }
}

TEST(CheckpointShards, TheCheckpointDirectoryListsLoadsAndPrunesThem) {
  testing::TempDir d("ckdir");
  CheckpointDir cd(d.path() + "/checkpoints", 2);
  ASSERT_TRUE(cd.save(10, sample_state(10)).ok());  // a file
  for (std::int64_t step : {20, 30}) {
    write_all(cd.partial(step), 2, sample_state(step));
    EXPECT_TRUE(cd.list().size() <= 2u);  // a partial directory is not a checkpoint
    auto p = cd.publish(step);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
  }
  auto all = cd.list();
  ASSERT_EQ(all.size(), 2u);  // the file of step 10 pruned
  EXPECT_EQ(fs::path(all[0]).filename(), "ckpt-0000000030");
  EXPECT_EQ(fs::path(all[1]).filename(), "ckpt-0000000020");
  std::vector<std::string> refused;
  auto latest = cd.load_latest(&refused);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->second.get_int("step", -1), 30);
  // A newest checkpoint that does not verify is passed over for the one before.
  fs::remove(all[0] + "/" + checkpoint_shard_name(0, 2));
  latest = cd.load_latest(&refused);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->second.get_int("step", -1), 20);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("is missing"), std::string::npos) << refused[0];
}

}  // namespace
}  // namespace shoal::train
