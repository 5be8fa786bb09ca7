// Hints for a mistyped command line: the nearest subcommand or flag, as git
// and cargo give them ("shoal trian" -> "did you mean 'train'?").
#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace shoal::cli {
namespace {

// Edits (insert, delete, replace, swap of two neighbours) from a to b:
// "trian" is one swap from "train".
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The closest candidate within 2 edits (1 for words of 3 letters or
// fewer), the shorter on a tie; or "".
std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = (word.size() <= 3 ? 1 : 2) + 1;
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_d || (d == best_d && !best.empty() && c.size() < best.size())) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

}  // namespace

std::string suggestion(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* at = &app;
  std::string path = at->get_name().empty() ? "shoal" : at->get_name();
  for (const auto& a : args) {
    if (a == "--") break;
    auto subs = at->get_subcommands([](const CLI::App*) { return true; });
    auto it = std::find_if(subs.begin(), subs.end(),
                           [&](const CLI::App* s) { return s->get_name() == a; });
    if (it != subs.end()) {
      at = *it;
      path += " " + a;
      continue;
    }
    if (a.rfind("--", 0) == 0) {
      const std::string flag =
          a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
      std::vector<std::string> names;
      bool known = false;
      for (const CLI::Option* o : at->get_options()) {
        for (const auto& n : o->get_lnames()) {
          names.push_back(n);
          known |= n == flag;
        }
      }
      if (known) continue;
      if (std::string n = nearest(flag, names); !n.empty())
        return fmt::format("'--{}' is not an option of {}: did you mean --{}?", flag, path, n);
      return fmt::format("'--{}' is not an option of {} (`{} --help` lists them)", flag, path,
                         path);
    }
    if (!subs.empty() && a.rfind('-', 0) != 0) {
      std::vector<std::string> names;
      for (const CLI::App* s : subs)
        if (!s->get_group().empty()) names.push_back(s->get_name());
      if (std::string n = nearest(a, names); !n.empty())
        return fmt::format("'{}' is not a command of {}: did you mean '{}'?", a, path, n);
      return "";
    }
  }
  return "";
}

}  // namespace shoal::cli
