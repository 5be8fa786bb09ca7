// Start-up checks that ranks agree on facts about their hosts, run once
// the mesh is connected: their wall clocks (within a limit) and, when the
// launcher says every rank runs on one host, that they really do. Each
// refusal names the ranks and both values. Not thread-safe: called by
// Communicator::create before its progress thread starts.
#pragma once

#include <string>
#include <vector>

#include "shoal/core/deadline.h"
#include "shoal/core/status.h"
#include "shoal/net/socket.h"

namespace shoal::comm {

// Rank r > 0 measures its wall clock against rank 0's with one round trip
// over their connection (NTP's offset: t2 - (t1 + t3) / 2, independent of
// when the ranks started) and tells rank 0 the result; both fail when the
// offset passes max_skew_s (<= 0: no check).
Status check_clocks(int rank, int world, std::vector<net::Socket>& peers, double max_skew_s,
                    Deadline dl);

// host_of[j] is rank j's host identity ("hostname/boot id"). When
// `launcher_local` (the launcher declared all ranks local to one host), a
// rank on another host is an error naming it and both hostnames. Every rank
// compares with rank 0, so all ranks report the same pair.
Status check_one_host(const std::vector<std::string>& host_of, bool launcher_local);

}  // namespace shoal::comm
