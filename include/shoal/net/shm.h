// Shared-memory channel between two processes on one host: a POSIX shm
// segment holding two single-producer/single-consumer byte rings (one per
// direction). Head and tail are monotonically increasing byte counters in
// their own cache lines (acquire/release), so neither side takes a lock to
// move data. Each ring also has a doorbell: a futex word bumped on every
// read or write. A side with nothing to do reads the bell, looks at the
// ring once more and sleeps in FUTEX_WAIT until the bell changes, so an
// idle rank gives its core to the ranks (or compute threads) that have
// work; the mover makes a FUTEX_WAKE call only when someone sleeps. The
// creator unlinks the name as soon as the peer has mapped it, so a crash
// leaves nothing in /dev/shm. A ring end is used by one thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "shoal/core/status.h"

namespace shoal::net {

class ShmRing {
 public:
  struct alignas(64) Header {
    alignas(64) std::atomic<std::uint64_t> head{0};  // bytes written (producer)
    alignas(64) std::atomic<std::uint64_t> tail{0};  // bytes read (consumer)
    alignas(64) std::uint64_t capacity = 0;          // power of two
    alignas(64) std::atomic<std::uint32_t> bell{0};  // bumped on every move
    std::atomic<std::uint32_t> sleepers{0};          // threads in sleep()
  };
  ShmRing() = default;
  ShmRing(Header* h, std::uint8_t* data) : h_(h), data_(data) {}
  // Copies up to n bytes in/out; returns how many (0 when full/empty).
  std::size_t write_some(const void* p, std::size_t n);
  std::size_t read_some(void* p, std::size_t n);
  // The doorbell: read it before looking at the ring, then sleep(seen, ...)
  // returns when it moved on (or at once if it already has), or after
  // `timeout_us`, or on a signal.
  std::uint32_t bell() const { return h_->bell.load(std::memory_order_seq_cst); }
  void sleep(std::uint32_t seen, long timeout_us);

 private:
  Header* h_ = nullptr;
  std::uint8_t* data_ = nullptr;
  void ring_bell();
};

class ShmChannel {
 public:
  // Creates a segment with a fresh random name (see name()); `bytes` per
  // direction, rounded up to a power of two.
  static Result<std::unique_ptr<ShmChannel>> create(std::size_t bytes);
  static Result<std::unique_ptr<ShmChannel>> open(const std::string& name);
  ~ShmChannel();
  const std::string& name() const { return name_; }
  void unlink();  // removes the name; mappings stay valid
  ShmRing& tx() { return tx_; }
  ShmRing& rx() { return rx_; }

 private:
  ShmChannel() = default;
  static Result<std::unique_ptr<ShmChannel>> map(int fd, std::string name, bool creator,
                                                 std::size_t bytes);
  std::string name_;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  bool linked_ = false;
  ShmRing tx_, rx_;
};

// Identity of this host for "same host?" decisions (shared memory, CMA, the
// hierarchy): hostname, boot id, IPC and PID namespaces and the /dev/shm
// mount, so namespaced hosts or containers sharing a name stay apart.
std::string host_identity();

}  // namespace shoal::net
