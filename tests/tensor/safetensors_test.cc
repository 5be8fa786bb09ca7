#include "shoal/tensor/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "shoal/tensor/philox.h"
#include "temp_dir.h"

namespace shoal {
namespace {

std::string tmpdir() {
  static const std::string d = testing::scratch_dir("st");
  return d;
}

std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + data;
}

void expect_error(const std::string& bytes, const std::string& needle) {
  auto r = parse_safetensors(bytes, "model.safetensors");
  ASSERT_FALSE(r.ok()) << "accepted a bad file; wanted error containing: " << needle;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("model.safetensors"), std::string::npos);
}

TEST(Safetensors, RoundTripsEveryDTypeAndMetadata) {
  std::vector<std::pair<std::string, Tensor>> ts;
  PhiloxRng rng(1, 2);
  for (DType dt : kAllDTypes) {
    Tensor t = Tensor::empty({3, 5}, DType::kF32);
    rng.fill_uniform(t, -4, 4);
    ts.emplace_back(std::string("t_") + dtype_name(dt), t.cast(dt));
  }
  ts.emplace_back("empty", Tensor::empty({0, 3}, DType::kF32));
  ts.emplace_back("scalar", Tensor::scalar(2.5));
  std::string path = tmpdir() + "/a.safetensors";
  ASSERT_TRUE(write_safetensors(path, ts, {{"step", "12"}}).ok());
  auto r = read_safetensors(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata.at("step"), "12");
  for (const auto& [name, t] : ts) {
    const Tensor* got = r->find(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_EQ(got->dtype(), t.dtype());
    EXPECT_EQ(got->shape(), t.shape());
    for (std::int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(got->get(i), t.get(i)) << name;
  }
}

TEST(Safetensors, ReadsAFileWrittenByTheReferenceLayout) {
  // Layout as the Python library writes it: header JSON, then packed data.
  float v[2] = {1.5f, -2.0f};
  std::string data(reinterpret_cast<const char*>(v), 8);
  auto r = parse_safetensors(
      with_header(
          R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})",
          data),
      "x");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->find("w")->get(1), -2.0);
}

TEST(Safetensors, RefusesMalformedFiles) {
  std::string d8(8, '\0');
  expect_error("abc", "too short");
  expect_error(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8), "exceeds");
  expect_error(with_header("{}", "").substr(0, 9), "runs past the end");
  expect_error(with_header("{not json", ""), "not valid JSON");
  expect_error(with_header("[1]", ""), "not a JSON object");
  expect_error(with_header(R"({"w":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", d8),
               "'w': field 'dtype'");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8),
               "'w': field 'shape'");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
               "'w': field 'data_offsets' spans 8 bytes");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", d8),
               "outside");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8),
               "outside");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           d8),
               "overlaps");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8), "gap");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8),
               "cover");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})",
                           d8.substr(0, 4)),
               "unknown field 'x'");
  expect_error(
      with_header(
          R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", d8),
      "overflows");
  expect_error(with_header(R"({"w":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})", "\x07"),
               "byte value 7");
  expect_error(with_header(R"({"__metadata__":{"k":1}})", ""), "not a string");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           d8),
               "names tensor 'w' more than once");
}

TEST(Safetensors, TruncationAtEveryByteIsRefused) {
  std::string bytes =
      serialize_safetensors({{"a", Tensor::full({3, 3}, DType::kF32, 1.0)}}, {{"k", "v"}});
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(parse_safetensors(bytes.substr(0, n), "t").ok()) << n;
}

TEST(Safetensors, AtomicWriteLeavesNoTemporaryAndReplaces) {
  std::string dir = tmpdir();
  std::string path = dir + "/b.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"x", Tensor::scalar(1)}}).ok());
  ASSERT_TRUE(write_safetensors(path, {{"x", Tensor::scalar(2)}}).ok());
  EXPECT_EQ(read_safetensors(path)->find("x")->get(0), 2);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  auto missing = read_safetensors(dir + "/nope.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace shoal
