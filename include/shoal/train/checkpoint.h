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
#include <set>
#include <string>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/tensor/tensor.h"
#include "shoal/train/checkpoint_index.h"  // kCheckpointFormat, kCheckpointIndex

namespace shoal::train {

struct CheckpointState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;  // caller's fields; "format" and "crc32" are added
  std::int64_t get_int(const std::string& key, std::int64_t dflt) const;
};

std::uint32_t checkpoint_crc(const std::map<std::string, Tensor>& tensors);
Status save_checkpoint(const std::string& path, const CheckpointState& s);
// A file, or a sharded checkpoint's directory (below).
Result<CheckpointState> load_checkpoint(const std::string& path);

// Sharded checkpoints (`--sharded-checkpoints`): a directory ckpt-<step>/
// of model-0000i-of-0000N.safetensors files, each a checkpoint file of its
// share of the tensors (its own format, crc32, step and "shard": "i of N"
// metadata), and model.safetensors.index.json, Hugging Face's index:
// {"metadata": {...}, "weight_map": {tensor: file}}. Every rank builds the
// same state and writes its shard in parallel; rank 0 writes the index once
// all are written, then the directory is renamed into place.
std::string checkpoint_shard_name(int shard, int shards);  // shard counts from 0
// A tensor's dtype and shape: what the shards' assignment, the ranks'
// agreement and the index need, known on every rank before any tensor is
// gathered (each rank then keeps only what it writes).
struct TensorMeta {
  DType dtype = DType::kF32;
  Shape shape;
  std::size_t nbytes() const;
  bool operator==(const TensorMeta&) const = default;
};
std::map<std::string, TensorMeta> tensor_metas(const std::map<std::string, Tensor>& tensors);
// Which shard holds each tensor (in the map's order): largest first onto the
// shard with the fewest bytes so far; ties to the lower shard.
std::vector<int> assign_checkpoint_shards(const std::map<std::string, TensorMeta>& tensors,
                                          int shards);
// The tensors `shard` holds of `all`.
std::set<std::string> checkpoint_shard_tensors(const std::map<std::string, TensorMeta>& all,
                                               int shard, int shards);
// Each tensor `listing` names is in `held` with its dtype and shape (an
// internal error names the first that is not, in `where`); with `exactly`,
// `held` holds nothing else.
Status check_listed(const std::map<std::string, TensorMeta>& listing,
                    const std::map<std::string, Tensor>& held, bool exactly,
                    const std::string& where);
// A hash of every tensor's name, dtype and shape: ranks about to write one
// checkpoint agree on it first.
std::uint64_t checkpoint_layout_hash(const std::map<std::string, TensorMeta>& tensors);
// Writes shard `shard` of `all`: `s` holds at least that shard's tensors
// (an error names one it lacks or holds with another dtype or shape).
Status save_checkpoint_shard(const std::string& dir, int shard, int shards,
                             const std::map<std::string, TensorMeta>& all,
                             const CheckpointState& s);
Status write_checkpoint_index(const std::string& dir, int shards,
                              const std::map<std::string, TensorMeta>& all,
                              const std::map<std::string, std::string>& meta);
// Reads the index and every shard; checks that each shard holds exactly the
// tensors the index maps to it, at the index's step, with its checksum.
Result<CheckpointState> load_sharded_checkpoint(const std::string& dir);

// A directory of ckpt-<step>.safetensors files and ckpt-<step>/ sharded
// checkpoints, newest K kept.
class CheckpointDir {
 public:
  CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}
  // Writes step's checkpoint, then deletes all but the newest `keep`.
  Result<std::string> save(std::int64_t step, const CheckpointState& s);
  // A sharded checkpoint: its shards are written into partial(step), then
  // publish renames it to ckpt-<step> and deletes all but the newest `keep`.
  std::string partial(std::int64_t step) const;
  Result<std::string> publish(std::int64_t step);
  std::vector<std::string> list() const;  // newest first
  // The newest checkpoint that loads; each refused newer one is reported
  // in `refused` ("path: reason"). NotFound when none loads.
  Result<std::pair<std::string, CheckpointState>> load_latest(
      std::vector<std::string>* refused) const;
  const std::string& dir() const { return dir_; }
  // Removes what writers that died mid-write left (core/file.h's dead
  // temporaries); done on every save, and by a run when it starts.
  void clean() const;

 private:
  void prune() const;

  std::string dir_;
  int keep_;
};

}  // namespace shoal::train
