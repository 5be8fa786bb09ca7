#include "ps/snapshot_writer.h"

namespace shoal::ps {

SnapshotWriter::SnapshotWriter(std::string path, std::function<void()> finished)
    : path_(std::move(path)), finished_cb_(std::move(finished)), thread_([this] { run(); }) {}

SnapshotWriter::~SnapshotWriter() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool SnapshotWriter::busy() const {
  std::lock_guard<std::mutex> lk(mu_);
  return pending_ || done_.has_value();
}

void SnapshotWriter::start(train::CheckpointState s, std::uint64_t mark) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = std::move(s);
    mark_ = mark;
    pending_ = true;
  }
  cv_.notify_all();
}

std::optional<std::pair<std::uint64_t, Status>> SnapshotWriter::take_finished() {
  std::lock_guard<std::mutex> lk(mu_);
  return std::exchange(done_, std::nullopt);
}

void SnapshotWriter::run() {
  for (;;) {
    train::CheckpointState job;
    std::uint64_t mark = 0;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || (pending_ && !done_); });
      if (!pending_) return;  // stopping, nothing to write
      job = std::move(job_);
      mark = mark_;
    }
    Status st = train::save_checkpoint(path_, job);
    {
      std::lock_guard<std::mutex> lk(mu_);
      pending_ = false;
      done_.emplace(mark, std::move(st));
    }
    if (finished_cb_) finished_cb_();
  }
}

}  // namespace shoal::ps
