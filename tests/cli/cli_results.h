// Reading what a command-line run left behind: the newest checkpoint of a
// run directory, and the numbers a run printed. Shared by the CLI tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "shoal/tensor/safetensors.h"
#include "shoal/train/checkpoint.h"

namespace shoal::testing {

// The newest checkpoint of a run directory: a file, or a sharded
// checkpoint's directory read through its index.
inline Result<SafetensorsFile> last_checkpoint(const std::string& dir) {
  auto all = train::CheckpointDir(dir + "/checkpoints", 1).list();
  if (all.empty()) return not_found("no checkpoint in {}", dir);
  if (!std::filesystem::is_directory(all[0])) return read_safetensors(all[0]);
  SHOAL_ASSIGN_OR_RETURN(train::CheckpointState s, train::load_checkpoint(all[0]));
  SafetensorsFile f;
  for (auto& [name, t] : s.tensors) f.tensors.emplace_back(name, t);
  f.metadata = s.meta;
  return f;
}

// The number after each occurrence of `prefix` in `out`, in order (no
// std::regex: GCC 12 warns inside it under ASan).
inline std::vector<double> numbers_after(const std::string& out, const std::string& prefix) {
  std::vector<double> v;
  for (std::size_t at = out.find(prefix); at != std::string::npos; at = out.find(prefix, at + 1))
    v.push_back(std::strtod(out.c_str() + at + prefix.size(), nullptr));
  return v;
}

// Largest absolute difference between the f32 tensors of `a` whose names
// start with `prefix` and their namesakes in `b`; `count` gets how many.
// A tensor missing from `b` or of another shape counts as 1e30.
inline double max_abs_diff(const SafetensorsFile& a, const SafetensorsFile& b,
                           const std::string& prefix, int* count) {
  double worst = 0;
  *count = 0;
  for (const auto& [name, t] : a.tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    ++*count;
    const Tensor* u = b.find(name);
    if (!u || u->shape() != t.shape()) return 1e30;
    for (std::int64_t i = 0; i < t.numel(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(u->data<float>()[i]) -
                                       static_cast<double>(t.data<float>()[i])));
  }
  return worst;
}

// Whether every tensor of `a` is in `b` with the same bytes, and the reverse.
inline bool same_bits(const SafetensorsFile& a, const SafetensorsFile& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, t] : a.tensors) {
    const Tensor* u = b.find(name);
    if (!u || u->shape() != t.shape() || u->dtype() != t.dtype() ||
        std::memcmp(u->raw_data(), t.raw_data(), t.nbytes()) != 0)
      return false;
  }
  return true;
}

// What a `shoal train` run left: its directory, output and exit code.
struct TrainRun {
  std::string dir, out;
  int code;
};

// The planned step arena the run's memory line reports ("step arena N B"),
// 0 if it printed none.
inline double step_arena(const std::string& out) {
  auto v = numbers_after(out, "step arena ");
  return v.empty() ? 0.0 : v[0];
}

// The newest checkpoints of two runs hold the same parameters and
// optimizer state within `tol`: `params` tensors of each (one state tensor
// per parameter: momentum).
inline void expect_same_training(const std::string& a_dir, const std::string& b_dir, int params,
                                 double tol = 1e-5) {
  auto a = last_checkpoint(a_dir), b = last_checkpoint(b_dir);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  int np = 0, ns = 0;
  EXPECT_LE(max_abs_diff(*a, *b, "param/", &np), tol);
  EXPECT_LE(max_abs_diff(*a, *b, "opt/", &ns), tol);
  EXPECT_EQ(np, params);
  EXPECT_EQ(ns, params);
}

// Trains `steps` steps in one run (in `whole_dir`) and in two (in
// `split_dir`, the second resuming the first's checkpoint) with
// train(dir, steps, extra flags); expects every tensor of the final
// checkpoints to have the same bytes.
inline void expect_resume_bit_identical(
    const std::function<TrainRun(const std::string&, int, const std::string&)>& train,
    const std::string& whole_dir, const std::string& split_dir, int steps) {
  TrainRun whole = train(whole_dir, steps, "");
  TrainRun a = train(split_dir, steps / 2, "");
  TrainRun b = train(split_dir, steps, "--resume");
  ASSERT_EQ(whole.code, 0) << whole.out;
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  auto x = last_checkpoint(whole_dir), y = last_checkpoint(split_dir);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_TRUE(same_bits(*x, *y));
}

}  // namespace shoal::testing
