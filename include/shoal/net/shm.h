// Shared-memory channel between two processes on one host: a POSIX shm
// segment holding two single-producer/single-consumer byte rings (one per
// direction). Head and tail are monotonically increasing byte counters in
// their own cache lines (acquire/release), so neither side takes a lock or
// makes a system call to move data. The creator unlinks the name as soon
// as the peer has mapped it, so a crash leaves nothing in /dev/shm. A ring
// end is used by one thread.
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
  };
  ShmRing() = default;
  ShmRing(Header* h, std::uint8_t* data) : h_(h), data_(data) {}
  // Copies up to n bytes in/out; returns how many (0 when full/empty).
  std::size_t write_some(const void* p, std::size_t n);
  std::size_t read_some(void* p, std::size_t n);

 private:
  Header* h_ = nullptr;
  std::uint8_t* data_ = nullptr;
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

// Identity of this host for "same host?" decisions: hostname and boot id.
std::string host_identity();

}  // namespace shoal::net
