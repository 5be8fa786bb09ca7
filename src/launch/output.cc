#include "launch/output.h"

#include <cctype>

namespace shoal::launch {

std::vector<std::pair<int, std::string>> Output::srun_task_ends(const std::string& l) {
  const std::size_t e = l.find("srun: error: ");
  if (e == std::string::npos) return {};
  std::size_t t = l.find(": task ", e + 12);
  std::size_t skip = 7;
  if (t == std::string::npos) {
    t = l.find(": tasks ", e + 12);
    skip = 8;
  }
  if (t == std::string::npos) return {};
  const std::size_t colon = l.find(": ", t + skip);
  if (colon == std::string::npos) return {};
  std::string how = l.substr(colon + 2);
  if (!how.empty()) how[0] = static_cast<char>(std::tolower(how[0]));
  // A list of tasks and ranges: "0-1,3".
  std::vector<std::pair<int, std::string>> ends;
  const std::string list = l.substr(t + skip, colon - t - skip);
  std::size_t at = 0;
  while (at < list.size() && ends.size() < 65536) {
    char* end = nullptr;
    const long a = std::strtol(list.c_str() + at, &end, 10);
    if (end == list.c_str() + at || a < 0) return {};
    long b = a;
    if (*end == '-') {
      const char* from = end + 1;
      b = std::strtol(from, &end, 10);
      if (end == from || b < a || b - a > 65535) return {};
    }
    for (long k = a; k <= b; ++k) ends.emplace_back(static_cast<int>(k), how);
    at = static_cast<std::size_t>(end - list.c_str());
    if (at < list.size() && list[at] != ',') return {};
    ++at;
  }
  return ends;
}

std::optional<std::pair<int, std::string>> engine_failure(const Output& out) {
  if (out.first_rank_exit()) return out.first_rank_exit();
  for (const auto& l : out.engine_tail()) {
    // srun: "srun: error: n1: task 1: Exited with exit code 3" (one task:
    // "tasks 0-1: Terminated" is what a step cancelled from outside says).
    if (auto ends = Output::srun_task_ends(l); ends.size() == 1) return ends.front();
    // mpirun: "... process rank 1 with PID 123 on node h exited on signal 9 (Killed)."
    if (auto t = l.find("process rank "); t != std::string::npos) {
      std::size_t on = l.find(" exited ", t);
      if (on != std::string::npos)
        return std::pair{std::atoi(l.c_str() + t + 13), l.substr(on + 1)};
    }
  }
  return std::nullopt;
}

}  // namespace shoal::launch
