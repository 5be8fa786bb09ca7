// Memory that the other processes of a job on this host can map: a memfd
// mapped MAP_SHARED. A peer maps it through /proc/<pid>/fd/<fd>, which the
// kernel allows under the same ptrace check as process_vm_readv, so a
// collective can reduce straight from a peer's buffer and write the result
// into it with plain loads and stores instead of copying every byte through
// two system calls. Regions are registered process-wide, so a collective can
// ask whether a buffer lies in one (find_shared). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "shoal/core/status.h"

namespace shoal::net {

class SharedRegion {
 public:
  // Zero-filled, page-aligned, `bytes` rounded up to whole pages (at least one).
  static Result<std::shared_ptr<SharedRegion>> create(std::size_t bytes);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  void* data() const { return base_; }
  std::size_t size() const { return bytes_; }

 private:
  SharedRegion() = default;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  int fd_ = -1;  // the id lives in the registry (find_shared)
};

// Where a buffer lies in a live region of this process: what a peer needs
// to map it (PeerMapping::open) and find the buffer in it.
struct SharedRef {
  std::uint64_t id = 0;            // unique in this process's lifetime; 0 = none
  std::int64_t fd = -1;            // the memfd in this process
  std::uint64_t region_bytes = 0;  // size of the whole region
  std::uint64_t offset = 0;        // of the buffer in it
};
// The region holding all of [p, p + n), if any.
std::optional<SharedRef> find_shared(const void* p, std::size_t n);

// Another process's region, mapped read-write here.
class PeerMapping {
 public:
  // Opens /proc/<pid>/fd/<ref.fd> and maps it after checking that it is
  // that process's region `ref.id` of `ref.region_bytes` (an fd number can be
  // reused): the memfd's name carries the id. Errors name pid, fd and why.
  static Result<std::unique_ptr<PeerMapping>> open(int pid, const SharedRef& ref);
  ~PeerMapping();
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;
  std::uint8_t* data() const { return static_cast<std::uint8_t*>(base_); }
  std::size_t size() const { return bytes_; }

 private:
  PeerMapping() = default;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace shoal::net
