#include "shoal/train/data.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "shoal/tensor/safetensors.h"
#include "temp_dir.h"

namespace shoal::train {
namespace {

std::string idx_bytes(std::vector<std::uint32_t> dims, std::size_t payload, unsigned type = 8) {
  std::string b = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((d >> s) & 0xff));
  for (std::size_t i = 0; i < payload; ++i) b.push_back(static_cast<char>(i % 251));
  return b;
}

TEST(Idx, ParsesValidFile) {
  auto a = parse_idx(idx_bytes({3, 2, 2}, 12), "mem");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->dims, (Shape{3, 2, 2}));
  EXPECT_EQ(a->data.size(), 12u);
  EXPECT_EQ(a->data[5], 5);
}

TEST(Idx, RefusesBadInputNamingField) {
  struct Case {
    std::string bytes, needle;
  } cases[] = {
      {"ab", "magic number needs 4"},
      {std::string("\x01\x00\x08\x01", 4), "IDX magic"},
      {idx_bytes({4}, 4, 0x0D), "type code 0x0d (f32)"},
      {std::string("\x00\x00\x08\x00", 4), "dimension count 0"},
      {std::string("\x00\x00\x08\x03\x00\x00", 6), "header"},
      {idx_bytes({3, 2, 2}, 11), "truncated"},
      {idx_bytes({3, 2, 2}, 13), "trailing bytes"},
      {idx_bytes({3, 0}, 0), "dimension 1 is 0"},
  };
  for (const auto& c : cases) {
    auto a = parse_idx(c.bytes, "f.idx");
    ASSERT_FALSE(a.ok()) << c.needle;
    EXPECT_NE(a.status().message().find(c.needle), std::string::npos) << a.status().to_string();
    EXPECT_NE(a.status().message().find("f.idx"), std::string::npos);
  }
}

std::string gzip(const std::string& in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(in.size() + 256, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

TEST(Idx, ReadsGzipAndRefusesTruncatedGzip) {
  auto dir = std::filesystem::temp_directory_path() / ("shoal_idx_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string raw = idx_bytes({100, 7}, 700);
  std::string z = gzip(raw);
  ASSERT_TRUE(write_file_atomic((dir / "a.gz").string(), z).ok());
  auto a = read_idx((dir / "a.gz").string());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->dims, (Shape{100, 7}));
  ASSERT_TRUE(write_file_atomic((dir / "b.gz").string(), z.substr(0, z.size() / 2)).ok());
  auto b = read_idx((dir / "b.gz").string());
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("truncated"), std::string::npos) << b.status().to_string();
  std::string bad = z;
  bad[z.size() / 2] ^= 0x55;
  ASSERT_TRUE(write_file_atomic((dir / "c.gz").string(), bad).ok());
  EXPECT_FALSE(read_idx((dir / "c.gz").string()).ok());
  std::filesystem::remove_all(dir);
}

// A label past the class range used to train silently (the model grew
// extra outputs); an empty split gave no message. Both are refused by name.
TEST(Idx, LabelOutsideTheClassesAndEmptyFilesAreRefused) {
  const std::string dir = testing::scratch_dir("idx_labels");
  auto put = [&](const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(write_file_atomic(dir + "/" + name, bytes).ok());
  };
  put("train-images-idx3-ubyte", idx_bytes({12, 2, 2}, 48));
  put("train-labels-idx1-ubyte", idx_bytes({12}, 12));  // labels 0..11: 10 and 11 are out
  auto bad = load_idx_dataset(dir, "train");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("train-labels-idx1-ubyte: label 10 at index 10 is outside "
                                        "the 10 classes [0, 10)"),
            std::string::npos)
      << bad.status().to_string();
  EXPECT_TRUE(load_idx_dataset(dir, "train", 12).ok());  // 12 classes: all in range
  put("t10k-images-idx3-ubyte", idx_bytes({0, 2, 2}, 0));
  put("t10k-labels-idx1-ubyte", idx_bytes({0}, 0));
  auto empty = load_idx_dataset(dir, "t10k");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("t10k-images-idx3-ubyte: the file holds no images"),
            std::string::npos)
      << empty.status().to_string();
}

TEST(Idx, UnknownDataNameIsExplained) {
  auto r = resolve_data_dir("no-such-dataset");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no-such-dataset"), std::string::npos);
}

// The real Fashion-MNIST from Debian's dataset-fashion-mnist (installed by
// tools/install-deps.sh, which the test command runs).
TEST(FashionMnist, LoadsBothSplits) {
  auto dir = resolve_data_dir("fashion-mnist");
  ASSERT_TRUE(dir.ok()) << dir.status().to_string();
  auto tr = load_idx_dataset(*dir, "train");
  ASSERT_TRUE(tr.ok()) << tr.status().to_string();
  EXPECT_EQ(tr->images.shape(), (Shape{60000, 28, 28}));
  auto te = load_idx_dataset(*dir, "t10k");
  ASSERT_TRUE(te.ok()) << te.status().to_string();
  EXPECT_EQ(te->size(), 10000);
  std::vector<int> count(10, 0);
  for (std::int64_t i = 0; i < te->size(); ++i) ++count[te->labels.data<std::int32_t>()[i]];
  for (int c : count) EXPECT_EQ(c, 1000);  // balanced classes
  auto [mean, sd] = pixel_stats(*tr);
  EXPECT_NEAR(mean, 0.2860, 1e-3);
  EXPECT_NEAR(sd, 0.3530, 1e-3);
}

Dataset synthetic(std::int64_t n) {
  Dataset d;
  d.images = Tensor::empty({n, 4, 4}, DType::kU8);
  d.labels = Tensor::empty({n}, DType::kI32);
  for (std::int64_t i = 0; i < n; ++i) {
    d.labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % 10);
    for (int p = 0; p < 16; ++p) d.images.data<std::uint8_t>()[i * 16 + p] = (i * 7 + p) % 256;
  }
  return d;
}

TEST(Loader, EpochIsAPermutationAndSeedsDiffer) {
  Dataset d = synthetic(103);
  LoaderOptions o;
  o.batch = 10;
  o.seed = 5;
  Loader l(d, o);
  EXPECT_EQ(l.batches_per_epoch(), 10);  // tail of 3 dropped
  std::set<std::int64_t> seen;
  for (int b = 0; b < 10; ++b)
    for (auto i : l.batch_indices(0, b)) seen.insert(i);
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_NE(l.batch_indices(0, 0), l.batch_indices(1, 0));
  LoaderOptions o2 = o;
  o2.seed = 6;
  Loader l2(d, o2);
  EXPECT_NE(l.batch_indices(0, 0), l2.batch_indices(0, 0));
}

TEST(Loader, ShardsOfNRanksMakeTheOneRankBatch) {
  Dataset d = synthetic(257);
  for (int world : {2, 3, 4}) {
    LoaderOptions one;
    one.batch = 8 * world;
    one.seed = 11;
    Loader l1(d, one);
    for (std::int64_t b = 0; b < l1.batches_per_epoch(); ++b) {
      std::vector<std::int64_t> all;
      for (int r = 0; r < world; ++r) {
        LoaderOptions o = one;
        o.batch = 8;
        o.rank = r;
        o.world = world;
        Loader lr(d, o);
        EXPECT_EQ(lr.batches_per_epoch(), l1.batches_per_epoch());
        auto part = lr.batch_indices(2, b);
        all.insert(all.end(), part.begin(), part.end());
      }
      EXPECT_EQ(all, l1.batch_indices(2, b)) << "world " << world << " batch " << b;
    }
  }
}

TEST(Loader, PrefetchSeekAndAugmentAreDeterministic) {
  Dataset d = synthetic(50);
  for (bool aug : {false, true}) {
    LoaderOptions o;
    o.batch = 7;
    o.seed = 3;
    o.augment = aug;
    o.mean = 0.5f;
    o.stddev = 0.25f;
    o.prefetch = 0;
    Loader sync(d, o);
    o.prefetch = 3;
    Loader pre(d, o);
    std::vector<std::vector<float>> ref;
    for (int s = 0; s < 20; ++s) {  // crosses two epoch boundaries (7 batches each)
      const Batch& a = sync.next();
      const Batch& b = pre.next();
      ASSERT_EQ(a.epoch, b.epoch);
      ASSERT_EQ(a.index, b.index);
      EXPECT_EQ(a.images.to_vector<float>(), b.images.to_vector<float>()) << s;
      EXPECT_EQ(a.labels.to_vector<std::int32_t>(), b.labels.to_vector<std::int32_t>()) << s;
      ref.push_back(a.images.to_vector<float>());
    }
    pre.seek(1, 3);  // step 10 of the run above
    for (int s = 10; s < 20; ++s) EXPECT_EQ(pre.next().images.to_vector<float>(), ref[s]) << s;
  }
}

TEST(Loader, NormalizesPixels) {
  Dataset d = synthetic(4);
  LoaderOptions o;
  o.batch = 4;
  o.shuffle = false;
  o.prefetch = 0;
  o.mean = 0.5f;
  o.stddev = 0.25f;
  Loader l(d, o);
  const Batch& b = l.next();
  EXPECT_EQ(b.images.shape(), (Shape{4, 1, 4, 4}));
  float want = (static_cast<float>(1 * 7 + 3) / 255.f - 0.5f) / 0.25f;
  EXPECT_NEAR(b.images.data<float>()[16 + 3], want, 1e-5);
  EXPECT_EQ(b.labels.data<std::int32_t>()[2], 2);
}

TEST(Loader, KeepsFinalPartialBatchWhenAsked) {
  Dataset d = synthetic(23);
  LoaderOptions o;
  o.batch = 10;
  o.drop_last = false;
  o.shuffle = false;
  Loader l(d, o);
  EXPECT_EQ(l.batches_per_epoch(), 3);
  l.next();
  l.next();
  EXPECT_EQ(l.next().images.shape()[0], 3);
  EXPECT_EQ(l.next().images.shape()[0], 10);  // next epoch
}

}  // namespace
}  // namespace shoal::train
