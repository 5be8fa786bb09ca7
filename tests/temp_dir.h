// A directory for one test that is removed when the test ends, passed or
// failed (RAII): the suite leaves nothing in the system temp directory.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace shoal::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    std::string tmpl = ::testing::TempDir() + "/shoal_" + name + "_XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A fresh directory that lives until the test process exits (for helpers
// that hand out paths): removed at exit, passed or failed, by the process
// that made it only (a forked child's exit leaves it alone).
inline std::string scratch_dir(const std::string& name) {
  struct Registry {
    std::mutex mu;
    std::vector<std::string> dirs;
    pid_t owner = getpid();
    ~Registry() {
      if (getpid() != owner) return;
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Registry reg;
  std::string tmpl = ::testing::TempDir() + "/shoal_" + name + "_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
  std::lock_guard<std::mutex> lk(reg.mu);
  reg.dirs.push_back(tmpl);
  return tmpl;
}

}  // namespace shoal::testing
