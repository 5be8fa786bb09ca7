// The keys of a parameter-server job's store (the scheduler's), in one
// place: the ps roles write and read them, and `shoal run --ps` (launch)
// watches them. Plain names in core, so that launch needs no ps.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace shoal::ps_keys {

// "DMLC_NUM_SERVER=S DMLC_NUM_WORKER=W|who": the counts of the job's first
// role; every later role must agree.
inline constexpr const char* kCounts = "ps/counts";
// Counter: server slots taken by servers started without an index.
inline constexpr const char* kServers = "ps/servers";
// "host:port" of server i; "" while the launcher replaces it.
inline std::string server(int i) { return fmt::format("ps/server/{}", i); }
// The mode the workers train in (sync, async, bounded).
inline constexpr const char* kMode = "ps/mode";
// Counters: workers that joined, workers that left.
inline constexpr const char* kWorkers = "ps/workers";
inline constexpr const char* kLeft = "ps/left";
// "1" once worker `id` has joined.
inline std::string joined(int id) { return fmt::format("ps/joined/{}", id); }
// "id line": the last worker a server dropped for silence.
inline constexpr const char* kDropped = "ps/dropped";
// "id why": the worker whose loss ended a sync job (a server saw its
// connection close before it left, or its silence): the scheduler stops
// the job and ends the waits of the workers left.
inline constexpr const char* kLost = "ps/lost";
// kLost's value ("id why") as the reason the job ended.
inline std::string lost_reason(const std::string& lost) {
  return "the job lost a worker: " + lost.substr(lost.find(' ') + 1);
}
// The id of the worker that writes the job's checkpoints and reports (a
// rank 0's duties): worker 0, then, once it is gone ("" again: it left, or
// the launcher saw it fail), the first replacement or joined worker to take
// it. One writer per job, whoever joins.
inline constexpr const char* kWriter = "ps/writer";
// "min:max" under `shoal run --ps-elastic`.
inline constexpr const char* kElastic = "ps/elastic";
// Counter: workers asked for by `shoal ps join`.
inline constexpr const char* kGrow = "ps/grow";

// The stop rule of the job's server and scheduler: every worker the job
// counts has joined, and every worker that joined has left.
inline bool job_over(std::int64_t joined, std::int64_t left, std::int64_t num_workers) {
  return joined >= num_workers && left >= joined;
}

}  // namespace shoal::ps_keys
