// A real Slurm on this host for one test suite (munged, slurmctld and four
// slurmd, started by tools/slurm-cluster.sh with its state in a directory of
// the suite's own), stopped after it with nothing left behind. Shared by
// the Slurm launcher tests and the `shoal submit` tests.
#pragma once

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

namespace shoal::testing {

inline bool have_slurm() { return std::system("command -v slurmctld >/dev/null") == 0; }

inline std::string slurm_script() {
  return std::string(SHOAL_SOURCE_DIR) + "/tools/slurm-cluster.sh";
}

// Starts the cluster with its state in `dir` (SHOAL_SLURM_TOPOLOGY and
// SHOAL_SLURM_GPUS, when the caller set them, shape it) and points the
// clients at it (SLURM_CONF). False when it did not start (then stopped).
inline bool start_local_slurm(const std::string& dir) {
  setenv("SHOAL_SLURM_DIR", dir.c_str(), 1);
  const bool started = std::system(("timeout 90 " + slurm_script() + " start").c_str()) == 0;
  if (!started) (void)std::system(("timeout 30 " + slurm_script() + " stop").c_str());
  setenv("SLURM_CONF", (dir + "/slurm.conf").c_str(), 1);
  return started;
}

// Stops it (jobs first) and removes `dir`: its daemons may still write a
// last file while they exit, so the removal retries, bounded.
inline void stop_local_slurm(bool started, const std::string& dir) {
  if (started) (void)std::system(("timeout 30 " + slurm_script() + " stop").c_str());
  for (int i = 0; i < 50 && !dir.empty() && std::filesystem::exists(dir); ++i) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (std::filesystem::exists(dir)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace shoal::testing
