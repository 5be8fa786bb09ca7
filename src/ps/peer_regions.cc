#include "ps/peer_regions.h"

#include <algorithm>

namespace shoal::ps {

Result<std::uint8_t*> PeerRegions::locate(std::uint64_t conn, int pid, const net::SharedRef& ref,
                                          std::uint64_t bytes) {
  const auto key = std::tuple{conn, pid, ref.id};
  auto it = maps_.find(key);
  if (it == maps_.end()) {
    const auto mine = std::count_if(maps_.begin(), maps_.end(),
                                    [&](const auto& kv) { return std::get<0>(kv.first) == conn; });
    if (static_cast<std::size_t>(mine) >= kMaxPerConnection)
      return out_of_range(
          "process {} announced its region {}, over the {} regions a connection may map", pid,
          ref.id, kMaxPerConnection);
    auto m = net::PeerMapping::open(pid, ref);
    if (!m.ok())
      return m.status().with_context(
          fmt::format("mapping region {} of process {} (same host only)", ref.id, pid));
    it = maps_.emplace(key, std::move(*m)).first;
  }
  const net::PeerMapping& m = *it->second;
  if (ref.offset > m.size() || bytes > m.size() - ref.offset)
    return invalid_argument("{} bytes at offset {} of process {}'s region {} of {} bytes", bytes,
                            ref.offset, pid, ref.id, m.size());
  return m.data() + ref.offset;
}

void PeerRegions::drop(std::uint64_t conn) {
  std::erase_if(maps_, [&](const auto& kv) { return std::get<0>(kv.first) == conn; });
}

}  // namespace shoal::ps
