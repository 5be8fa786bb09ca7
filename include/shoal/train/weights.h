// Weights from a file into a model's parameters and buffers: a Shoal
// checkpoint ("param/NAME", "buf/NAME", optimizer state left out) or a
// safetensors state_dict another tool wrote (PyTorch names: "fc1.weight",
// linear weights [out, in], batch-norm "running_mean"/"running_var"). Every
// tensor the model needs must be there with its shape and an f32 (or f64,
// f16, bf16: converted) type; a missing, extra or mis-shaped tensor is an
// error naming all of them at once. PyTorch's "num_batches_tracked"
// counters are not weights and are skipped.
#pragma once

#include <map>
#include <string>

#include "shoal/core/status.h"
#include "shoal/tensor/tensor.h"

namespace shoal::train {

struct WeightsFile {
  std::string path;
  bool shoal_checkpoint = false;            // written by Shoal (checksum verified)
  std::map<std::string, Tensor> tensors;    // by the file's names
  std::map<std::string, std::string> meta;  // the file's metadata
  // The input normalization the weights were trained with, when the file
  // says (a Shoal checkpoint's input_mean/input_std): false otherwise.
  bool normalization(float* mean, float* stddev) const;
};

// Every loader's one resolver: a .safetensors file (a Shoal checkpoint or a
// state_dict), a sharded checkpoint's directory or its index file, a
// directory of checkpoints, or a run directory (its newest loadable
// checkpoint). `path` of the result is the file or directory read.
Result<WeightsFile> read_weights(const std::string& path);

// Copies the file's tensors into `params` and `buffers` (shapes fixed by
// the model); returns how many were copied.
Result<std::size_t> apply_weights(const WeightsFile& f, std::map<std::string, Tensor>& params,
                                  std::map<std::string, Tensor>& buffers);

}  // namespace shoal::train
