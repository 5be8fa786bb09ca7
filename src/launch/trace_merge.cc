// `shoal run --trace`: where the ranks write their traces until they are
// merged, and the merge into one Chrome trace with a summary per rank.
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "shoal/core/file.h"
#include "shoal/launch/launcher.h"

namespace shoal::launch {

Result<std::string> make_trace_dir(const std::string& trace_file) {
  namespace fs = std::filesystem;
  fs::path parent = fs::path(trace_file).parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  fs::create_directories(parent, ec);
  std::string tmpl = (parent / ".shoal-trace-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr)
    return unavailable("--trace {}: cannot make a directory for the ranks' traces in {}: {}",
                       trace_file, parent.string(), std::strerror(errno));
  return tmpl;
}

namespace {

// A parameter server's metrics lines as Chrome trace counter events.
Status add_server_counters(nlohmann::json& events, const std::string& file, int pid, int index) {
  SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(file));
  double last_ts = -1, last_in = 0, last_out = 0, last_shm_in = 0, last_shm_out = 0;
  std::size_t start = 0;
  for (int n = 1; start < text.size(); ++n) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    auto j = nlohmann::json::parse(text.substr(start, end - start), nullptr, false);
    start = end + 1;
    if (j.is_discarded() || !j.is_object())
      return data_loss("{} line {}: not a JSON object", file, n);
    if (!j.contains("trace_us")) continue;
    const double ts = j.value("trace_us", 0.0);
    const double in = j.value("bytes_in", 0.0), out = j.value("bytes_out", 0.0);
    const double shm_in = j.value("shm_bytes_in", 0.0), shm_out = j.value("shm_bytes_out", 0.0);
    auto counter = [&](const char* name, nlohmann::json args) {
      events.push_back({{"name", name}, {"ph", "C"}, {"ts", ts}, {"pid", pid}, {"args", args}});
    };
    if (last_ts >= 0 && ts > last_ts)
      counter("traffic MB/s", {{"in", (in - last_in) / (ts - last_ts)},
                               {"out", (out - last_out) / (ts - last_ts)},
                               {"shared memory in", (shm_in - last_shm_in) / (ts - last_ts)},
                               {"shared memory out", (shm_out - last_shm_out) / (ts - last_ts)}});
    counter("answers waiting", {{"queue", j.value("queue", 0)}});
    counter("round close ms", {{"mean", j.value("round_close_ms", 0.0)}});
    nlohmann::json lag = nlohmann::json::object();
    if (j.contains("lag") && j["lag"].is_object())
      for (auto& [w, l] : j["lag"].items()) lag["worker " + w] = l;
    if (!lag.empty()) counter("lag (steps)", lag);
    last_ts = ts;
    last_in = in;
    last_out = out;
    last_shm_in = shm_in;
    last_shm_out = shm_out;
  }
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"args", {{"name", fmt::format("ps server {}", index)}}}});
  return ok_status();
}

}  // namespace

Result<std::vector<TraceSummary>> merge_traces(const std::vector<std::string>& rank_files,
                                               const std::string& out,
                                               const std::vector<std::string>& server_metrics,
                                               const std::string& rank_name) {
  nlohmann::json merged = {{"traceEvents", nlohmann::json::array()}, {"displayTimeUnit", "ms"}};
  std::vector<TraceSummary> sums;
  for (std::size_t r = 0; r < rank_files.size(); ++r) {
    SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(rank_files[r]));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
      return data_loss("{}: not a Chrome trace (no traceEvents array)", rank_files[r]);
    TraceSummary s;
    s.rank = static_cast<int>(r);
    struct Span {
      double ts, dur;
    };
    std::vector<Span> steps, waits;
    for (auto& e : j["traceEvents"]) {
      if (!e.is_object()) continue;
      e["pid"] = r;
      merged["traceEvents"].push_back(e);
      if (e.value("ph", "") != "X") continue;
      double ts = e.value("ts", 0.0), dur = e.value("dur", 0.0);
      int tid = e.value("tid", 0);
      std::string cat = e.value("cat", "");
      if (tid == 0 && cat == "train_step") steps.push_back({ts, dur});
      if (tid == 0 && cat == "wait") waits.push_back({ts, dur});
      if (tid == 1) s.comm_ms += dur / 1000;
      // A bucket kernel on the compute lane: with overlap it only starts the
      // collective (microseconds), without it runs the whole all-reduce; in
      // both cases the compute thread spends that time on communication.
      if (tid == 0 && cat == "allreduce_bucket") {
        waits.push_back({ts, dur});
        s.comm_ms += dur / 1000;
      }
    }
    merged["traceEvents"].push_back({{"name", "process_name"},
                                     {"ph", "M"},
                                     {"pid", r},
                                     {"args", {{"name", fmt::format("{} {}", rank_name, r)}}}});
    s.steps = static_cast<int>(steps.size());
    for (const auto& st : steps) {
      s.step_ms += st.dur / 1000;
      for (const auto& w : waits)
        if (w.ts >= st.ts && w.ts < st.ts + st.dur) s.exposed_comm_ms += w.dur / 1000;
    }
    if (s.steps > 0) {
      s.step_ms /= s.steps;
      s.exposed_comm_ms /= s.steps;
      s.comm_ms /= s.steps;
    }
    sums.push_back(s);
  }
  for (std::size_t i = 0; i < server_metrics.size(); ++i)
    SHOAL_RETURN_IF_ERROR(add_server_counters(merged["traceEvents"], server_metrics[i],
                                              static_cast<int>(rank_files.size() + i),
                                              static_cast<int>(i)));
  SHOAL_RETURN_IF_ERROR(write_file_atomic(out, merged.dump()));
  return sums;
}

}  // namespace shoal::launch
