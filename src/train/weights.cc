#include "shoal/train/weights.h"

#include <cstdlib>
#include <filesystem>
#include <set>
#include <vector>

#include "shoal/tensor/safetensors.h"
#include "shoal/train/checkpoint.h"

namespace shoal::train {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_float(DType d) {
  return d == DType::kF32 || d == DType::kF64 || d == DType::kF16 || d == DType::kBF16;
}

}  // namespace

bool WeightsFile::normalization(float* mean, float* stddev) const {
  auto m = meta.find("input_mean"), d = meta.find("input_std");
  if (m == meta.end() || d == meta.end()) return false;
  char* end = nullptr;
  const float mv = std::strtof(m->second.c_str(), &end);
  if (end == m->second.c_str() || *end != '\0') return false;
  const float dv = std::strtof(d->second.c_str(), &end);
  if (end == d->second.c_str() || *end != '\0' || !(dv > 0.f)) return false;
  *mean = mv;
  *stddev = dv;
  return true;
}

Result<WeightsFile> read_weights(const std::string& path) {
  WeightsFile w;
  w.path = path;
  // Shoal's own checkpoints load as checkpoints, which verifies their
  // checksums: a file with its format tag, or a sharded checkpoint's
  // directory or index file (load_checkpoint reads a directory's shards).
  namespace fs = std::filesystem;
  const bool index = fs::path(path).filename() == kCheckpointIndex;
  std::error_code ec;
  std::string checkpoint;
  if (index) {
    checkpoint = fs::path(path).parent_path().string();
    if (checkpoint.empty()) checkpoint = ".";
  } else if (fs::is_directory(path, ec) && fs::exists(fs::path(path) / kCheckpointIndex, ec)) {
    checkpoint = path;  // a sharded checkpoint
  } else if (fs::is_directory(path, ec)) {
    // A run directory (its checkpoints/) or a directory of checkpoints:
    // the newest that loads, each newer one refused said why.
    const fs::path sub = fs::path(path) / "checkpoints";
    const std::string dir = fs::is_directory(sub, ec) ? sub.string() : path;
    std::vector<std::string> refused;
    auto latest = CheckpointDir(dir, 1).load_latest(&refused);
    if (!latest.ok())
      return not_found(
          "{}: no loadable checkpoint: expected a run directory (with checkpoints/), a "
          "directory of ckpt-* checkpoints, a sharded checkpoint (with {}) or a .safetensors "
          "file ({}{})",
          path, kCheckpointIndex, latest.status().message(),
          refused.empty() ? "" : "; refused: " + fmt::format("{}", fmt::join(refused, "; ")));
    w.path = latest->first;
    w.tensors = std::move(latest->second.tensors);
    w.meta = std::move(latest->second.meta);
    w.shoal_checkpoint = true;
    return w;
  } else {
    SHOAL_ASSIGN_OR_RETURN(SafetensorsFile f, read_safetensors(path));
    auto format = f.metadata.find("format");
    if (format == f.metadata.end() || format->second != kCheckpointFormat) {
      for (auto& [n, t] : f.tensors) w.tensors.emplace(n, t);
      w.meta = std::move(f.metadata);
      return w;
    }
    checkpoint = path;
  }
  SHOAL_ASSIGN_OR_RETURN(CheckpointState s, load_checkpoint(checkpoint));
  w.tensors = std::move(s.tensors);
  w.meta = std::move(s.meta);
  w.shoal_checkpoint = true;
  return w;
}

Result<std::size_t> apply_weights(const WeightsFile& f, std::map<std::string, Tensor>& params,
                                  std::map<std::string, Tensor>& buffers) {
  const std::string& path = f.path;
  std::size_t loaded = 0;
  // The model's names, and which file tensor feeds each.
  std::map<std::string, Tensor*> want;
  for (auto& [n, t] : params) want["param/" + n] = &t;
  for (auto& [n, t] : buffers) want["buf/" + n] = &t;
  std::set<std::string> used;
  std::vector<std::string> missing, wrong, extra;
  for (auto& [key, dst] : want) {
    const std::string bare = key.substr(key.find('/') + 1);
    auto it = f.tensors.find(key);
    if (it == f.tensors.end()) it = f.tensors.find(bare);
    if (it == f.tensors.end()) {
      missing.push_back(fmt::format("{} {}", bare, shape_str(dst->shape())));
      continue;
    }
    used.insert(it->first);
    const Tensor& src = it->second;
    if (src.shape() != dst->shape() || !is_float(src.dtype())) {
      wrong.push_back(fmt::format("{} is {} {}, the model needs f32 {}", it->first,
                                  dtype_name(src.dtype()), shape_str(src.shape()),
                                  shape_str(dst->shape())));
      continue;
    }
    SHOAL_RETURN_IF_ERROR(dst->copy_from(src).with_context(fmt::format("{}: {}", path, key)));
    ++loaded;
  }
  for (const auto& [n, t] : f.tensors) {
    if (used.count(n)) continue;
    // Not weights: PyTorch's batch-norm step counters, a checkpoint's
    // optimizer state (--init-from starts a new optimizer).
    if (ends_with(n, ".num_batches_tracked") || (f.shoal_checkpoint && n.rfind("opt/", 0) == 0))
      continue;
    extra.push_back(fmt::format("{} {}", n, shape_str(t.shape())));
  }
  if (missing.empty() && wrong.empty() && extra.empty()) return loaded;
  std::string msg;
  auto list = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    msg +=
        fmt::format("{}{} ({}): {}", msg.empty() ? "" : "; ", what, v.size(), fmt::join(v, ", "));
  };
  list("missing", missing);
  list("wrong shape or type", wrong);
  list("not in the model", extra);
  return invalid_argument(
      "{} does not fit the model: {} (names are the model's parameters, as in a PyTorch "
      "state_dict, with or without Shoal's 'param/' and 'buf/' prefixes)",
      path, msg);
}

}  // namespace shoal::train
