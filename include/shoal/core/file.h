// Whole-file reads and atomic writes, the way every file Shoal writes is
// written (checkpoints, traces, metrics, the file store's keys): a reader
// never sees a half-written file, and a crash leaves the old one.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "shoal/core/status.h"

namespace shoal {

// Atomic file replace: write to path.tmp.<pid>, fsync, rename, fsync dir.
// Errors name the file and the failing step (ENOSPC included).
// `mode`: the new file's permission bits (0600 for a secret).
Status write_file_atomic(const std::string& path, std::string_view bytes, unsigned mode = 0644);
// Removes the temporaries write_file_atomic leaves in `dir` when its
// process dies between create and rename ("<name>.tmp.<pid>"): those whose
// writer is not running here and that nothing wrote for `idle` (a writer
// on another host sharing the directory keeps its file fresh while it
// writes). The count removed; a directory that cannot be read removes none.
int remove_dead_temporaries(const std::string& dir,
                            std::chrono::seconds idle = std::chrono::seconds(30));
// The whole file; errors name it.
Result<std::string> read_file(const std::string& path);

}  // namespace shoal
