// Deadline: an absolute point on the steady clock that every blocking call
// takes. There is no "wait forever" default. Value type; thread-compatible.
#pragma once

#include <chrono>

namespace shoal {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline after(std::chrono::milliseconds d) { return Deadline(Clock::now() + d); }
  static Deadline after_seconds(double s) {
    return Deadline(Clock::now() +
                    std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)));
  }
  Clock::time_point when() const { return when_; }
  bool expired() const { return Clock::now() >= when_; }
  std::chrono::milliseconds remaining() const {
    auto r = std::chrono::duration_cast<std::chrono::milliseconds>(when_ - Clock::now());
    return r.count() < 0 ? std::chrono::milliseconds(0) : r;
  }

 private:
  explicit Deadline(Clock::time_point when) : when_(when) {}
  Clock::time_point when_;
};

}  // namespace shoal
