// A connection's receive buffer. Private to net.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>

namespace shoal::net {

// What a client sent and the server has not parsed yet: read into place
// (no bounce buffer, no zeroing), consumed from the front, and grown to hold
// a whole frame once its header is known, so a big request (a 64 MiB push)
// arrives in one block the handler reads where it lies.
class InBuffer {
 public:
  const char* data() const { return buf_.get() + begin_; }
  std::size_t size() const { return end_ - begin_; }
  void consume(std::size_t n) {
    begin_ += n;
    if (begin_ == end_) begin_ = end_ = 0;
  }
  // Room for at least `n` bytes after what is held (moved to the front or
  // to a bigger block as needed); how much room there is.
  std::size_t make_room(std::size_t n) {
    if (cap_ - end_ >= n) return cap_ - end_;
    const std::size_t held = size();
    if (cap_ - held >= n && held <= cap_ / 2) {
      std::memmove(buf_.get(), data(), held);
    } else {
      const std::size_t cap = std::max(held + n, 2 * cap_);
      auto b = std::make_unique_for_overwrite<char[]>(cap);
      if (held) std::memcpy(b.get(), data(), held);
      buf_ = std::move(b);
      cap_ = cap;
    }
    begin_ = 0;
    end_ = held;
    return cap_ - end_;
  }
  char* tail() { return buf_.get() + end_; }
  void commit(std::size_t n) { end_ += n; }

 private:
  std::unique_ptr<char[]> buf_;
  std::size_t cap_ = 0, begin_ = 0, end_ = 0;
};

}  // namespace shoal::net
