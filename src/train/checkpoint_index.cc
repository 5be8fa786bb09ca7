// Parsing a sharded checkpoint's index (train/checkpoint_index.h).
#include "shoal/train/checkpoint_index.h"

#include <nlohmann/json.hpp>

#include "shoal/core/env.h"

namespace shoal::train {

Result<CheckpointIndex> parse_checkpoint_index(std::string_view text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return data_loss("{}: not a JSON object", where);
  if (!j.contains("metadata") || !j["metadata"].is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object())
    return data_loss("{}: needs the objects \"metadata\" and \"weight_map\"", where);
  CheckpointIndex ix;
  for (auto it = j["metadata"].begin(); it != j["metadata"].end(); ++it)
    if (it.value().is_string()) ix.meta[it.key()] = it.value().get<std::string>();
  if (ix.meta["format"] != kCheckpointFormat)
    return invalid_argument("{}: not a Shoal checkpoint (metadata format is '{}', expected '{}')",
                            where, ix.meta["format"], kCheckpointFormat);
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      return data_loss("{}: weight_map entry '{}' is not a file name", where, it.key());
    std::string file = it.value().get<std::string>();
    if (file.empty() || file[0] == '.' || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos)
      return data_loss("{}: weight_map entry '{}' names '{}', not a file of this directory", where,
                       it.key(), file);
    ix.files[file].insert(it.key());
  }
  auto n = env::parse_int(ix.meta["shards"], "shards");
  if (!n.ok() || *n < 1 || *n > 1 << 20)
    return data_loss("{}: metadata shards is '{}', expected a count", where, ix.meta["shards"]);
  ix.shards = static_cast<int>(*n);
  return ix;
}

}  // namespace shoal::train
