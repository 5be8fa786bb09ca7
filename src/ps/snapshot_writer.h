// Writes a server's shard snapshots on a thread of its own, one at a time:
// the serving thread only copies the shard (Shard::capture) and goes on
// serving while the file is written, checksummed and synced. Private to
// src/ps/.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "shoal/core/status.h"
#include "shoal/train/checkpoint.h"

namespace shoal::ps {

class SnapshotWriter {
 public:
  // `finished` runs on the writer's thread after each write (the server
  // wakes its serving thread with it).
  SnapshotWriter(std::string path, std::function<void()> finished);
  ~SnapshotWriter();  // waits for a write in progress
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  const std::string& path() const { return path_; }
  // Whether a write is in progress or finished and not yet taken.
  bool busy() const;
  // Starts writing `s`, which holds the shard's first `mark` updates. Only
  // when !busy().
  void start(train::CheckpointState s, std::uint64_t mark);
  // The write that finished: its mark and how it went; then not busy.
  std::optional<std::pair<std::uint64_t, Status>> take_finished();

 private:
  void run();
  const std::string path_;
  const std::function<void()> finished_cb_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, pending_ = false;
  train::CheckpointState job_;
  std::uint64_t mark_ = 0;
  std::optional<std::pair<std::uint64_t, Status>> done_;
  std::thread thread_;
};

}  // namespace shoal::ps
