// Checkpoints: one safetensors file per save holding every tensor of the
// training state ("param/...", "buf/...", "opt/...") and, in its metadata,
// the step, data position, seed, configuration and a CRC-32 over all
// tensor names and bytes. Writes are atomic (temp file, fsync, rename, dir
// fsync); a directory keeps the newest K. Loading verifies the format and
// checksum and names the file and what is wrong. PyTorch can read the
// files with safetensors.torch.load_file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/tensor/tensor.h"

namespace shoal::train {

inline constexpr const char* kCheckpointFormat = "shoal-checkpoint-1";

struct CheckpointState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;  // caller's fields; "format" and "crc32" are added
  std::int64_t get_int(const std::string& key, std::int64_t dflt) const;
};

std::uint32_t checkpoint_crc(const std::map<std::string, Tensor>& tensors);
Status save_checkpoint(const std::string& path, const CheckpointState& s);
Result<CheckpointState> load_checkpoint(const std::string& path);

// A directory of ckpt-<step>.safetensors files, newest K kept.
class CheckpointDir {
 public:
  CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}
  // Writes step's checkpoint, then deletes all but the newest `keep`.
  Result<std::string> save(std::int64_t step, const CheckpointState& s);
  std::vector<std::string> list() const;  // newest first
  // The newest checkpoint that loads; each refused newer one is reported
  // in `refused` ("path: reason"). NotFound when none loads.
  Result<std::pair<std::string, CheckpointState>> load_latest(
      std::vector<std::string>* refused) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int keep_;
};

}  // namespace shoal::train
