// Sharded checkpoints: one safetensors file per rank plus Hugging Face's
// index file (weight_map: tensor name -> file). Each shard is a complete
// checkpoint file of its tensors, so it verifies on its own; the index ties
// them together and the loader checks that they agree with it and with one
// another.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "shoal/core/file.h"
#include "shoal/core/hash.h"
#include "shoal/train/checkpoint.h"

namespace shoal::train {
namespace fs = std::filesystem;

std::string checkpoint_shard_name(int shard, int shards) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", shard + 1, shards);
}

std::size_t TensorMeta::nbytes() const {
  return static_cast<std::size_t>(num_elements(shape)) * dtype_size(dtype);
}

std::map<std::string, TensorMeta> tensor_metas(const std::map<std::string, Tensor>& tensors) {
  std::map<std::string, TensorMeta> out;
  for (const auto& [name, t] : tensors) out[name] = TensorMeta{t.dtype(), t.shape()};
  return out;
}

std::vector<int> assign_checkpoint_shards(const std::map<std::string, TensorMeta>& tensors,
                                          int shards) {
  std::vector<std::size_t> bytes;
  for (const auto& [name, t] : tensors) bytes.push_back(t.nbytes());
  std::vector<std::size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return bytes[a] > bytes[b]; });
  std::vector<std::size_t> load(static_cast<std::size_t>(std::max(shards, 1)), 0);
  std::vector<int> out(bytes.size(), 0);
  for (std::size_t i : order) {
    auto least = std::min_element(load.begin(), load.end());  // the first of equals
    out[i] = static_cast<int>(least - load.begin());
    *least += bytes[i];
  }
  return out;
}

std::set<std::string> checkpoint_shard_tensors(const std::map<std::string, TensorMeta>& all,
                                               int shard, int shards) {
  std::vector<int> owner = assign_checkpoint_shards(all, shards);
  std::set<std::string> mine;
  std::size_t i = 0;
  for (const auto& [name, t] : all)
    if (owner[i++] == shard) mine.insert(name);
  return mine;
}

std::uint64_t checkpoint_layout_hash(const std::map<std::string, TensorMeta>& tensors) {
  std::string text;
  for (const auto& [name, t] : tensors)
    text += fmt::format("{}:{}:{};", name, dtype_name(t.dtype), shape_str(t.shape));
  return fnv1a(text);
}

namespace {

std::string shard_label(int shard, int shards) {
  return fmt::format("{} of {}", shard + 1, shards);
}

}  // namespace

Status check_listed(const std::map<std::string, TensorMeta>& listing,
                    const std::map<std::string, Tensor>& held, bool exactly,
                    const std::string& where) {
  for (const auto& [name, want] : listing) {
    auto it = held.find(name);
    if (it == held.end()) return internal_error("{}: '{}' is listed but not held", where, name);
    const TensorMeta have{it->second.dtype(), it->second.shape()};
    if (!(have == want))
      return internal_error("{}: '{}' is {}{}, its listing says {}{}", where, name,
                            dtype_name(have.dtype), shape_str(have.shape), dtype_name(want.dtype),
                            shape_str(want.shape));
  }
  if (exactly)
    for (const auto& [name, t] : held)
      if (!listing.count(name))
        return internal_error("{}: '{}' is held but not listed", where, name);
  return ok_status();
}

Status save_checkpoint_shard(const std::string& dir, int shard, int shards,
                             const std::map<std::string, TensorMeta>& all,
                             const CheckpointState& s) {
  std::map<std::string, TensorMeta> listing;
  for (const auto& name : checkpoint_shard_tensors(all, shard, shards))
    listing.emplace(name, all.at(name));
  SHOAL_RETURN_IF_ERROR(
      check_listed(listing, s.tensors, false, "checkpoint shard " + shard_label(shard, shards)));
  CheckpointState mine;
  for (const auto& [name, m] : listing) mine.tensors.emplace(name, s.tensors.at(name));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return unavailable("creating checkpoint directory {}: {}", dir, ec.message());
  mine.meta = s.meta;
  mine.meta["shard"] = shard_label(shard, shards);
  return save_checkpoint((fs::path(dir) / checkpoint_shard_name(shard, shards)).string(), mine);
}

Status write_checkpoint_index(const std::string& dir, int shards,
                              const std::map<std::string, TensorMeta>& all,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  std::uint64_t total = 0;
  for (const auto& [name, t] : all) total += t.nbytes();
  meta["total_size"] = total;  // what Hugging Face's loaders read
  meta["format"] = kCheckpointFormat;
  meta["shards"] = std::to_string(shards);
  for (const auto& [k, v] : metadata) meta[k] = v;
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  std::vector<int> owner = assign_checkpoint_shards(all, shards);
  std::size_t i = 0;
  for (const auto& [name, t] : all) map[name] = checkpoint_shard_name(owner[i++], shards);
  nlohmann::ordered_json j = {{"metadata", meta}, {"weight_map", map}};
  return write_file_atomic((fs::path(dir) / kCheckpointIndex).string(), j.dump(1) + "\n");
}

Result<CheckpointState> load_sharded_checkpoint(const std::string& dir) {
  const std::string index_path = (fs::path(dir) / kCheckpointIndex).string();
  SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(index_path));
  SHOAL_ASSIGN_OR_RETURN(CheckpointIndex ix, parse_checkpoint_index(text, index_path));
  CheckpointState out;
  out.meta = ix.meta;
  for (int i = 0; i < ix.shards; ++i) {
    const std::string name = checkpoint_shard_name(i, ix.shards);
    const std::string path = (fs::path(dir) / name).string();
    std::error_code ec;
    if (!fs::exists(path, ec))
      return data_loss("{}: shard {} of {} ({}) is missing", dir, i + 1, ix.shards, name);
    SHOAL_ASSIGN_OR_RETURN(CheckpointState s, load_checkpoint(path));
    auto field = [&](const char* k) {
      auto it = s.meta.find(k);
      return it == s.meta.end() ? std::string() : it->second;
    };
    if (field("shard") != shard_label(i, ix.shards) || field("step") != ix.meta["step"])
      return data_loss(
          "{}: says shard '{}' at step '{}'; the index expects shard '{}' at step '{}'", path,
          field("shard"), field("step"), shard_label(i, ix.shards), ix.meta["step"]);
    const std::set<std::string>& listed = ix.files[name];
    for (auto& [tname, t] : s.tensors) {
      if (!listed.count(tname))
        return data_loss("{}: holds tensor '{}', which the index does not map to it", path, tname);
      out.tensors.emplace(tname, std::move(t));
    }
    for (const auto& tname : listed)
      if (!out.tensors.count(tname))
        return data_loss("{}: the index maps tensor '{}' to it, but it does not hold it", path,
                         tname);
    ix.files.erase(name);
  }
  if (!ix.files.empty())
    return data_loss("{}: the index maps tensor '{}' to '{}', which is not one of its {} shards",
                     dir, *ix.files.begin()->second.begin(), ix.files.begin()->first, ix.shards);
  return out;
}

}  // namespace shoal::train
