// safetensors files (the format PyTorch and Hugging Face load): an 8-byte
// little-endian header length, a JSON header, then packed tensor bytes.
// Readers validate everything against the file size before use and name the
// file, the tensor and the field on error. Writes are atomic (temp, fsync,
// rename). Functions are thread-safe for distinct paths.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shoal/core/file.h"  // write_file_atomic, read_file: used with these
#include "shoal/core/status.h"
#include "shoal/tensor/tensor.h"

namespace shoal {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order of offsets
  std::map<std::string, std::string> metadata;
  const Tensor* find(const std::string& name) const;
};

Result<SafetensorsFile> read_safetensors(const std::string& path);
// Parses an in-memory image; `where` names it in errors (a path, "<buffer>").
Result<SafetensorsFile> parse_safetensors(std::string_view bytes, std::string_view where);

std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata);
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace shoal
