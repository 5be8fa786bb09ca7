// The layering of shared/ARCHITECTURE.md, checked on the sources: every
// `#include "shoal/<module>/..."` (a public header) and `#include
// "<module>/..."` (a private one) under include/ and src/ must be an edge
// that docs/layers.txt allows. A forbidden edge fails the suite with the
// file, the line and the rule it breaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "temp_dir.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;
using Rules = std::map<std::string, std::set<std::string>>;

// docs/layers.txt: `module: allowed modules`, '#' comments.
Rules read_rules(const fs::path& file, std::string* error) {
  Rules rules;
  std::ifstream in(file);
  if (!in) {
    *error = "cannot read " + file.string();
    return rules;
  }
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) {
      *error = file.string() + ":" + std::to_string(no) + ": no ':' in '" + line + "'";
      return rules;
    }
    std::istringstream names(line.substr(colon + 1));
    auto& allowed = rules[line.substr(0, colon)];
    for (std::string m; names >> m;) allowed.insert(m);
  }
  return rules;
}

// The module a file under include/shoal/<m>/ or src/<m>/ belongs to.
std::string module_of(const fs::path& root, const fs::path& file) {
  const fs::path rel = fs::relative(file, root);
  auto it = rel.begin();
  if (*it == "include") ++it;  // include/shoal/<m>/...
  ++it;                        // shoal/ or src/
  return it == rel.end() ? "" : it->string();
}

// The module a `#include "shoal/<m>/..."` or `#include "<m>/..."` line
// names, or "" (another kind of line, or a system header).
std::string included_module(const std::string& line) {
  std::size_t p = line.find_first_not_of(" \t");
  if (p == std::string::npos || line[p] != '#') return "";
  p = line.find_first_not_of(" \t", p + 1);
  if (p == std::string::npos || line.compare(p, 7, "include") != 0) return "";
  p = line.find_first_not_of(" \t", p + 7);
  if (p == std::string::npos || line[p] != '"') return "";
  std::string path = line.substr(p + 1, line.find('"', p + 1) - p - 1);
  if (path.starts_with("shoal/")) path = path.substr(6);
  const auto slash = path.find('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// Every include under root/include and root/src that the rules forbid, as
// "file:line: <from> includes <to> (allowed: ...)".
std::vector<std::string> forbidden_includes(const fs::path& root, const Rules& rules) {
  std::vector<std::string> bad;
  for (const char* top : {"include/shoal", "src"}) {
    if (!fs::exists(root / top)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      const auto ext = e.path().extension();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cc")) continue;
      const std::string from = module_of(root, e.path());
      const auto own = rules.find(from);
      std::ifstream in(e.path());
      std::string line;
      for (int no = 1; std::getline(in, line); ++no) {
        const std::string to = included_module(line);
        if (to.empty() || to == from || !rules.count(to))
          continue;  // itself, or not a module ("cli/..." in cli)
        if (own != rules.end() && own->second.count(to)) continue;
        std::string allowed;
        if (own != rules.end())
          for (const auto& a : own->second) allowed += (allowed.empty() ? "" : " ") + a;
        bad.push_back(fs::relative(e.path(), root).string() + ":" + std::to_string(no) + ": " +
                      from + " includes " + to + " (" +
                      (own == rules.end() ? "module not in docs/layers.txt"
                                          : "allowed: " + (allowed.empty() ? "nothing" : allowed)) +
                      ")");
      }
    }
  }
  return bad;
}

TEST(Layering, EveryIncludeFollowsTheArchitecture) {
  const fs::path root = SHOAL_SOURCE_DIR;
  std::string error;
  const Rules rules = read_rules(root / "docs/layers.txt", &error);
  ASSERT_TRUE(error.empty()) << error;
  // Every module folder has a rule: a new module cannot slip past unseen.
  for (const char* top : {"include/shoal", "src"}) {
    for (const auto& e : fs::directory_iterator(root / top)) {
      if (!e.is_directory()) continue;
      EXPECT_TRUE(rules.count(e.path().filename().string()))
          << e.path() << " is a module without a line in docs/layers.txt";
    }
  }
  std::string all;
  for (const auto& b : forbidden_includes(root, rules)) all += b + "\n";
  EXPECT_TRUE(all.empty()) << "includes that break docs/layers.txt:\n" << all;
}

// The checker itself: a strategy naming another is found, with its place.
TEST(Layering, APlantedForbiddenIncludeIsFound) {
  testing::TempDir dir("layering");
  const fs::path root = dir.path();
  fs::create_directories(root / "src/dp");
  fs::create_directories(root / "include/shoal/mp");
  std::ofstream(root / "src/dp/pass.cc") << "#include \"shoal/dp/pass.h\"\n"
                                         << "#include \"shoal/collective/ops.h\"\n"
                                         << "#include <vector>\n"
                                         << "#include \"shoal/mp/pipeline.h\"\n";
  std::ofstream(root / "include/shoal/mp/pipeline.h") << "#include \"dp/private.h\"\n";
  std::string error;
  std::ofstream(root / "layers.txt") << "# test\ncollective:\ndp: collective\nmp: collective\n";
  const Rules rules = read_rules(root / "layers.txt", &error);
  ASSERT_TRUE(error.empty()) << error;
  auto bad = forbidden_includes(root, rules);
  std::sort(bad.begin(), bad.end());
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_EQ(bad[0], "include/shoal/mp/pipeline.h:1: mp includes dp (allowed: collective)");
  EXPECT_EQ(bad[1], "src/dp/pass.cc:4: dp includes mp (allowed: collective)");
}

}  // namespace
}  // namespace shoal
