// A directory for one test that is removed when the test ends, passed or
// failed (RAII): the suite leaves nothing in the system temp directory.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

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

}  // namespace shoal::testing
