// The language-modeling pieces: text into token windows (vocabulary,
// split, labels shifted by one, directories as fortune lays them out,
// errors that name sizes and paths), the GPT's causality (no position sees
// a later one), its config's round trip, and sampling's refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shoal/core/file.h"
#include "shoal/runtime/backend.h"
#include "shoal/train/model.h"
#include "shoal/train/sample.h"
#include "shoal/train/text.h"
#include "temp_dir.h"

namespace shoal::train {
namespace {

namespace fs = std::filesystem;

TEST(Text, WindowsShiftLabelsByOneAndShareTheVocabulary) {
  // 50 bytes: 45 train, 5 (10%) validate, context 4.
  std::string text;
  for (int i = 0; i < 15; ++i) text += "abc";
  text += "xyzxy";
  TextOptions o;
  o.context = 4;
  auto s = text_splits(text, "mem", o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->train.vocab, "abcxyz");
  EXPECT_EQ(s->test.vocab, "abcxyz");
  EXPECT_EQ(s->train.num_classes, 6);
  EXPECT_EQ(s->train.images.shape(), (Shape{11, 4}));  // (45 - 1) / 4
  EXPECT_EQ(s->train.labels.shape(), (Shape{11, 4}));
  EXPECT_EQ(s->train.labels_per_sample(), 4);
  const float* x = s->train.images.data<float>();
  const std::int32_t* y = s->train.labels.data<std::int32_t>();
  for (int i = 0; i < 44; ++i) {
    EXPECT_EQ(static_cast<int>(x[i]), i % 3) << i;  // a b c a ...
    EXPECT_EQ(y[i], (i + 1) % 3) << i;
  }
  // Validation "xyzxy": one window, x = "xyzx", y = "yzxy".
  ASSERT_EQ(s->test.size(), 1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(static_cast<int>(s->test.images.data<float>()[i]), 3 + i % 3) << i;
    EXPECT_EQ(s->test.labels.data<std::int32_t>()[i], 3 + (i + 1) % 3) << i;
  }
  // Labels: 14 a, 15 b, 15 c.
  const double pa = 14.0 / 44, pb = 15.0 / 44;
  EXPECT_NEAR(unigram_bits(s->train), -pa * std::log2(pa) - 2 * pb * std::log2(pb), 1e-12);
}

TEST(Text, TooShortATextNamesWhatEachSplitNeeds) {
  TextOptions o;
  o.context = 8;
  auto s = text_splits("hello world, hello", "tiny", o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("18 bytes give 17 for training and 1 for validation; each "
                                      "needs at least --context + 1 = 9"),
            std::string::npos)
      << s.status().to_string();
}

TEST(Text, DirectoriesReadTheirTextFilesInOrderSkippingIndexesAndLinks) {
  shoal::testing::TempDir dir("text");
  const fs::path d = dir.path();
  ASSERT_TRUE(write_file_atomic((d / "b").string(), std::string(50, 'b')).ok());
  ASSERT_TRUE(write_file_atomic((d / "a").string(), std::string(50, 'a')).ok());
  ASSERT_TRUE(write_file_atomic((d / "a.dat").string(), std::string(50, 'z')).ok());
  fs::create_symlink(d / "a", d / "a.u8");
  TextOptions o;
  o.context = 9;
  auto s = load_text(dir.path(), o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->train.vocab, "ab");  // no 'z' from the .dat file
  // 100 bytes: 90 train ("a" x 50 then "b" x 40), 10 validate ("b" x 10).
  EXPECT_EQ(s->train.size(), 9);
  EXPECT_EQ(static_cast<int>(s->train.images.data<float>()[0]), 0);
  EXPECT_EQ(static_cast<int>(s->train.images.data<float>()[80]), 1);
  // A list of paths, and the errors.
  auto two = load_text((d / "a").string() + "," + (d / "b").string(), o);
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ(two->train.size(), 9);
  auto missing = load_data("text:" + (d / "nope").string(), 9);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find((d / "nope").string() + ": no such file"),
            std::string::npos)
      << missing.status().to_string();
  auto empty = load_text((d / "a").string() + ",", o);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("an empty path"), std::string::npos);
}

TEST(Text, VocabularyHexRoundTripsEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  auto back = vocab_from_hex(vocab_to_hex(all));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, all);
  EXPECT_FALSE(vocab_from_hex("4g").ok());
  EXPECT_FALSE(vocab_from_hex("414").ok());
}

TEST(Gpt, ConfigRoundTripsAndBadSizesAreRefused) {
  GptConfig c;
  c.layers = 3;
  c.heads = 2;
  c.dim = 10;
  c.context = 7;
  c.tied = false;
  auto back = parse_gpt_config(c.str());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->str(), c.str());
  c.dim = 9;
  Status st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--dim 9 must be a positive multiple of --heads 2"),
            std::string::npos);
  EXPECT_FALSE(parse_gpt_config("layers=2 heads=2").ok());
  EXPECT_FALSE(parse_gpt_config("layers=2 heads=x dim=4 context=4 tied=1").ok());
}

// Logits [B*T, V] of the GPT at random weights for token ids `x` [B, T].
Tensor gpt_logits(const GptConfig& c, int vocab, const Tensor& x) {
  auto model = gpt_model(c, vocab);
  EXPECT_TRUE(model.ok());
  graph::Graph g;
  graph::Builder b(g);
  graph::Value in = b.input("x", DType::kF32, x.shape());
  ModelContext mc(b, false);
  graph::Value out = model->forward(mc, in);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  g.mark_output(out);
  auto params = init_params(mc.params(), 5);
  auto exe = (*runtime::make_backend("cpu"))->compile(std::move(g), {});
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  for (auto& [n, t] : params) EXPECT_TRUE((*exe)->bind("param/" + n, t).ok());
  EXPECT_TRUE((*exe)->bind("x", x).ok());
  EXPECT_TRUE((*exe)->run().ok());
  return (*exe)->output(0).clone();
}

TEST(Gpt, NoPositionSeesALaterOne) {
  GptConfig c;
  c.layers = 2;
  c.heads = 3;
  c.dim = 12;
  c.context = 7;
  const int vocab = 11;
  Tensor x = Tensor::empty({2, 7}, DType::kF32);
  for (int i = 0; i < 14; ++i) x.data<float>()[i] = static_cast<float>((i * 5 + 1) % vocab);
  Tensor base = gpt_logits(c, vocab, x);
  for (int j = 0; j < 7; ++j) {
    Tensor y = x.clone();
    y.data<float>()[7 + j] =
        static_cast<float>((static_cast<int>(x.data<float>()[7 + j]) + 3) % vocab);
    Tensor changed = gpt_logits(c, vocab, y);
    for (int t = 0; t < 7; ++t) {
      double diff = 0;
      for (int v = 0; v < vocab; ++v) {
        const std::int64_t k = (7 + t) * vocab + v;
        diff = std::max(diff, std::abs(double(changed.data<float>()[k]) - base.data<float>()[k]));
      }
      if (t < j)
        EXPECT_EQ(diff, 0.0) << "position " << t << " changed when token " << j << " did";
      else
        EXPECT_GT(diff, 1e-6) << "position " << t << " ignored token " << j;
    }
    // The other sequence of the batch is untouched.
    for (int k = 0; k < 7 * vocab; ++k) ASSERT_EQ(changed.data<float>()[k], base.data<float>()[k]);
  }
}

TEST(Gpt, ShorterSequencesThanTheContextUseTheFirstPositions) {
  GptConfig c;
  c.heads = 2;
  c.dim = 8;
  c.context = 6;
  Tensor full = Tensor::empty({1, 6}, DType::kF32), part = Tensor::empty({1, 4}, DType::kF32);
  for (int i = 0; i < 6; ++i) full.data<float>()[i] = static_cast<float>(i % 5);
  for (int i = 0; i < 4; ++i) part.data<float>()[i] = static_cast<float>(i % 5);
  Tensor a = gpt_logits(c, 5, full), b = gpt_logits(c, 5, part);
  for (int k = 0; k < 4 * 5; ++k) EXPECT_NEAR(a.data<float>()[k], b.data<float>()[k], 1e-5) << k;
}

TEST(Sample, RefusesWeightsThatAreNotALanguageModelAndUnknownPromptCharacters) {
  WeightsFile w;
  w.path = "x.safetensors";
  SampleOptions o;
  auto r = sample_text(w, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x.safetensors: not a language model's checkpoint"),
            std::string::npos);
  GptConfig c;
  c.heads = 2;
  c.dim = 8;
  c.context = 4;
  w.meta["gpt"] = c.str();
  w.meta["vocab"] = vocab_to_hex("ab");
  o.prompt = "abc";
  r = sample_text(w, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("\"c\" (byte 0x63) at offset 2 is not in the model's "
                                      "vocabulary of 2 characters"),
            std::string::npos)
      << r.status().to_string();
}

}  // namespace
}  // namespace shoal::train
