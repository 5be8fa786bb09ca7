#include "launch/output.h"

#include <cctype>

namespace shoal::launch {

std::optional<std::pair<int, std::string>> engine_failure(const Output& out) {
  if (out.first_rank_exit()) return out.first_rank_exit();
  for (const auto& l : out.engine_tail()) {
    // srun: "srun: error: n1: task 1: Exited with exit code 3"
    if (auto t = l.find("task ");
        t != std::string::npos && l.find("srun: error:") != std::string::npos) {
      std::size_t colon = l.find(": ", t);
      if (colon != std::string::npos) {
        std::string how = l.substr(colon + 2);
        if (!how.empty()) how[0] = static_cast<char>(std::tolower(how[0]));
        return std::pair{std::atoi(l.c_str() + t + 5), how};
      }
    }
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
