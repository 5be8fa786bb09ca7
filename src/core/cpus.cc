#include "shoal/core/cpus.h"

#include <sched.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace shoal {

Result<std::vector<int>> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return unavailable("sched_getaffinity: {}", std::strerror(errno));
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) return unavailable("sched_getaffinity: this process may run on no CPU");
  return cpus;
}

std::vector<std::vector<int>> cpu_blocks(const std::vector<int>& cpus, int ranks) {
  const auto c = static_cast<std::int64_t>(cpus.size()), n = static_cast<std::int64_t>(ranks);
  std::vector<std::vector<int>> out(static_cast<std::size_t>(ranks));
  for (std::int64_t r = 0; r < n; ++r) {
    auto& mine = out[static_cast<std::size_t>(r)];
    if (n <= c) {
      for (std::int64_t i = r * c / n; i < (r + 1) * c / n; ++i)
        mine.push_back(cpus[static_cast<std::size_t>(i)]);
    } else {
      mine.push_back(cpus[static_cast<std::size_t>(r % c)]);
    }
  }
  return out;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string s;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    s += fmt::format("{}{}", s.empty() ? "" : ",", cpus[i]);
    if (j > i) s += fmt::format("-{}", cpus[j]);
    i = j + 1;
  }
  return s;
}

Status bind_process(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  // sched_setaffinity binds one thread: every thread already running (a
  // communicator's progress thread, an OpenMP pool) is bound by its id.
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    if (sched_setaffinity(tid, sizeof set, &set) != 0 && errno != ESRCH)
      return unavailable("binding thread {} to CPUs {}: {}", tid, cpu_list(cpus),
                         std::strerror(errno));
  }
  if (ec) return unavailable("listing /proc/self/task: {}", ec.message());
  return ok_status();
}

}  // namespace shoal
