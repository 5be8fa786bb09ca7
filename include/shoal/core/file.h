// Whole-file reads and atomic writes, the way every file Shoal writes is
// written (checkpoints, traces, metrics, the file store's keys): a reader
// never sees a half-written file, and a crash leaves the old one.
#pragma once

#include <string>
#include <string_view>

#include "shoal/core/status.h"

namespace shoal {

// Atomic file replace: write to path.tmp.<pid>, fsync, rename, fsync dir.
// Errors name the file and the failing step (ENOSPC included).
Status write_file_atomic(const std::string& path, std::string_view bytes);
// The whole file; errors name it.
Result<std::string> read_file(const std::string& path);

}  // namespace shoal
