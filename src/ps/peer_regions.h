// The shared-memory regions of same-host workers that a parameter server
// has mapped (wire ops 'M' and 'Y'), by connection: a worker's training
// arena is mapped on its first push-pull and reused for every one after,
// and its mappings go when its connection does. Private to ps; used on the
// serving thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "shoal/core/status.h"
#include "shoal/net/shared_memory.h"

namespace shoal::ps {

class PeerRegions {
 public:
  // A worker with more regions than this is refused: mappings cost address
  // space and descriptors, and a training arena is one region.
  static constexpr std::size_t kMaxPerConnection = 64;

  // Where the `bytes` at ref.offset of process `pid`'s region ref.id lie in
  // this process, mapping the region on first use. Errors name the
  // process, the region and why (another host's process, a region that is
  // not the one announced, bytes past its end).
  Result<std::uint8_t*> locate(std::uint64_t conn, int pid, const net::SharedRef& ref,
                               std::uint64_t bytes);
  // Unmaps what connection `conn` mapped.
  void drop(std::uint64_t conn);
  std::size_t mapped() const { return maps_.size(); }

 private:
  // (connection, pid, region id) -> its mapping here
  std::map<std::tuple<std::uint64_t, int, std::uint64_t>, std::unique_ptr<net::PeerMapping>> maps_;
};

}  // namespace shoal::ps
