// Runs the built `shoal` binary (SHOAL_BINARY) with arguments, or any shell
// line, and captures its exit code, merged stdout+stderr and wall time.
// Shared by the command-line tests.
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

namespace shoal::testing {

struct ShoalRun {
  int code;
  std::string out;
  double seconds;
};

// Runs a shell command line (stderr merged into stdout).
inline ShoalRun run_sh(const std::string& line) {
  auto t0 = std::chrono::steady_clock::now();
  std::string cmd = "(" + line + ") 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) out += buf.data();
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

inline ShoalRun run_shoal(const std::string& args) {
  return run_sh(std::string(SHOAL_BINARY) + " " + args);
}

}  // namespace shoal::testing
