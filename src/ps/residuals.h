// A worker's 2-bit residuals (ps/codec.h ErrorFeedback) beside the
// trainer's checkpoints: one file per worker and step,
// <dir>/ps-residuals-w<worker>-<step>.safetensors in the checkpoint format
// (atomic, CRC-checked), the newest `keep` kept. Private to ps.
#pragma once

#include <cstdint>
#include <string>

#include "shoal/ps/codec.h"

namespace shoal::ps {

std::string residuals_path(const std::string& dir, int worker, std::int64_t step);
Status save_residuals(const ErrorFeedback& ef, const std::string& dir, int worker,
                      std::int64_t step, int keep);
// Restores the file for exactly `step`. A missing file is an error naming
// it when `required` (a sync job resumes every worker at one step), else a
// warning: the residuals start at zero.
Status load_residuals(ErrorFeedback& ef, const std::string& dir, int worker, std::int64_t step,
                      bool required);

}  // namespace shoal::ps
