// The index of a sharded checkpoint (train/checkpoint.h):
// model.safetensors.index.json, Hugging Face's format,
//   {"metadata": {"format": ..., "shards": "N", "step": ..., ...},
//    "weight_map": {tensor name: file name}}.
// Parsed on its own (no tensors) so that the fuzzer reaches it.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>

#include "shoal/core/status.h"

namespace shoal::train {

inline constexpr const char* kCheckpointFormat = "shoal-checkpoint-1";
inline constexpr const char* kCheckpointIndex = "model.safetensors.index.json";

struct CheckpointIndex {
  std::map<std::string, std::string> meta;             // the string-valued metadata
  std::map<std::string, std::set<std::string>> files;  // file -> the tensors mapped to it
  int shards = 0;
};

// Errors name `where` and the field: not JSON, a missing object, another
// format, a file name that is not a plain name in the directory, a shard
// count that is not one.
Result<CheckpointIndex> parse_checkpoint_index(std::string_view text, const std::string& where);

}  // namespace shoal::train
