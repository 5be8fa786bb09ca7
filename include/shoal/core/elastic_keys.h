// The store keys of an elastic data-parallel job (`shoal run --elastic`):
// the contract between the launcher, which decides each generation
// (launch/elastic_coordinator.h), and the ranks (dist/elastic.h), as
// launch_env.h is for the launcher's variables. Under shoal/elastic/:
// "gen" the current generation ("end" when the launcher ended the job,
// "end_why" then says why); "g<G>/members" its member ids, comma-separated,
// in rank order; "g<G>/note" what changed; "g<G>/in/<id>" a member's
// check-in (the step it holds, -1 for none) after generation G ended;
// "g<G>/regroup" set when ranks wait to join; "join/<id>" a newcomer's
// announcement; "max" the job's --elastic MAX and "grow" the count of ranks
// asked for by `shoal join` (the launcher starts them up to MAX);
// "alive/<id>" a rank's lease (a count it raises twice a second for as long
// as it lives, so a launcher that cannot see its process, srun's or another
// host's, tells a dead or frozen one from a busy one), and "exit/<id>" how
// it ended ("0", or its exit code), written as it leaves; "ids" the count
// of rank ids given out (ranks started by something else claim theirs
// there: the first generation's first, then newcomers'; only where
// "claims" is "yes", as under --engine external), and "min",
// "world" the job's --elastic MIN
// and first generation's size, for ranks that claim an id.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "shoal/core/status.h"

namespace shoal::elastic_keys {

inline std::string key(const std::string& rest) { return "shoal/elastic/" + rest; }
inline std::string members(int generation) { return key(fmt::format("g{}/members", generation)); }
inline std::string note(int generation) { return key(fmt::format("g{}/note", generation)); }
inline std::string check_in(int generation, int id) {
  return key(fmt::format("g{}/in/{}", generation, id));
}
inline std::string regroup(int generation) { return key(fmt::format("g{}/regroup", generation)); }
inline std::string join(int id) { return key(fmt::format("join/{}", id)); }
inline std::string max() { return key("max"); }
inline std::string grow() { return key("grow"); }
inline std::string alive(int id) { return key(fmt::format("alive/{}", id)); }
inline std::string exit(int id) { return key(fmt::format("exit/{}", id)); }
inline std::string ids() { return key("ids"); }
inline std::string claims() { return key("claims"); }
inline std::string min() { return key("min"); }
inline std::string world() { return key("world"); }

// "0,1,3" <-> {0, 1, 3}.
inline std::string join_ids(const std::vector<int>& ids) {
  return fmt::format("{}", fmt::join(ids, ","));
}
inline Result<std::vector<int>> parse_ids(const std::string& s) {
  std::vector<int> ids;
  std::size_t at = 0;
  while (at < s.size()) {
    std::size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    const std::string one = s.substr(at, comma - at);
    char* end = nullptr;
    const long v = std::strtol(one.c_str(), &end, 10);
    if (one.empty() || *end != '\0' || v < 0 || v > 65535)
      return data_loss("elastic membership '{}': '{}' is not a rank id", s, one);
    ids.push_back(static_cast<int>(v));
    at = comma + 1;
  }
  return ids;
}

}  // namespace shoal::elastic_keys
