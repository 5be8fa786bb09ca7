// What the direct algorithms (allreduce_direct.cc, gather_scatter_direct.cc)
// share: every rank publishes one buffer's address (and, when it lies in
// shared memory, its region); each peer's is mapped here when it can be,
// else reached through cross-memory attach. Private to comm.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/mesh.h"

namespace shoal::comm {

struct DirectPeers {
  struct Addr {
    std::uint64_t addr, bytes;
    net::SharedRef shared;  // id 0: private memory
  };
  std::vector<Addr> theirs;           // by rank
  std::vector<std::uint8_t*> mapped;  // by rank: the buffer here, or null (copy through CMA)
};

// Exchanges the address of `buf` (`bytes` long, the same on every rank:
// an error names the peer and both sizes) and maps what it can; sets
// m.last_mapped to whether every peer's buffer is mapped.
Result<DirectPeers> publish_buffers(Mesh& m, const void* buf, std::size_t bytes, std::uint64_t fp,
                                    const char* what);

// The closing barrier: every rank is done reading and writing the others'
// buffers. Plain stores into a peer's mapping are ordered before it.
Status direct_barrier(Mesh& m, std::uint64_t fp, const char* what);

}  // namespace shoal::comm
