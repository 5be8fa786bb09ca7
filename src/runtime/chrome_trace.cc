// The executor's per-node trace as a Chrome trace (chrome://tracing,
// Perfetto): one lane for compute, one for communication.
#include <chrono>

#include "shoal/core/file.h"
#include "shoal/runtime/backend.h"

namespace shoal::runtime {

using graph::Graph;

double trace_clock_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}
double trace_clock_us() { return trace_clock_us(std::chrono::steady_clock::now()); }

Status write_chrome_trace(const std::string& path, const Graph& g,
                          const std::vector<TraceEvent>& events, int pid) {
  std::string s = fmt::format(
      "{{\"traceEvents\":[\n"
      "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":"
      "\"compute\"}}}},\n"
      "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":1,\"args\":{{\"name\":"
      "\"comm\"}}}}",
      pid);
  for (const TraceEvent& e : events) {
    std::string name = e.name;
    if (e.node >= 0 && e.node < g.num_nodes() && !g.node(e.node).name.empty())
      name = g.node(e.node).name;
    s += fmt::format(
        ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},"
        "\"dur\":{:.3f},\"args\":{{\"node\":{}{}}}}}",
        name, e.name, pid, e.lane, e.start_us, e.dur_us, e.node,
        e.impl ? fmt::format(",\"impl\":\"{}\"", e.impl) : "");
  }
  s += "\n],\"displayTimeUnit\":\"ms\"}\n";
  return write_file_atomic(path, s).with_context("writing trace");
}

Status Executor::write_trace(const std::string& path, int pid) const {
  return write_chrome_trace(path, exe_.graph(), exe_.trace(), pid);
}

}  // namespace shoal::runtime
