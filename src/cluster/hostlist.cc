// Slurm hostlist syntax: "n[1-4,7],gpu[01-02]" ↔ a list of names.
#include <charconv>
#include <map>

#include "shoal/cluster/topology.h"

namespace shoal::cluster {

namespace {

constexpr std::size_t kMaxHosts = 100000;

// Splits at commas outside brackets.
std::vector<std::string> split_top(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

Status expand_one(const std::string& item, const std::string& list, std::vector<std::string>& out) {
  auto open = item.find('[');
  if (open == std::string::npos) {
    if (item.empty()) return invalid_argument("hostlist `{}`: an empty name", list);
    out.push_back(item);
    return ok_status();
  }
  auto close = item.find(']', open);
  if (close == std::string::npos || item.find('[', open + 1) != std::string::npos)
    return invalid_argument("hostlist `{}`: `{}` needs one [range] group", list, item);
  const std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
  for (const std::string& r : split_top(item.substr(open + 1, close - open - 1))) {
    auto dash = r.find('-');
    std::string a = r.substr(0, dash), b = dash == std::string::npos ? a : r.substr(dash + 1);
    long lo = 0, hi = 0;
    auto r1 = std::from_chars(a.data(), a.data() + a.size(), lo);
    auto r2 = std::from_chars(b.data(), b.data() + b.size(), hi);
    if (a.empty() || b.empty() || r1.ptr != a.data() + a.size() || r2.ptr != b.data() + b.size() ||
        lo > hi || hi - lo > 100000)
      return invalid_argument("hostlist `{}`: `{}` is not a range like 1-4", list, r);
    if (out.size() + static_cast<std::size_t>(hi - lo) >= kMaxHosts)
      return invalid_argument("hostlist `{}`: more than {} names", list, kMaxHosts);
    for (long k = 0; k <= hi - lo; ++k) {  // counted, so hi = LONG_MAX cannot overflow
      std::string num = std::to_string(lo + k);
      if (num.size() < a.size()) num.insert(0, a.size() - num.size(), '0');  // n[01-10]
      out.push_back(prefix + num + suffix);
    }
  }
  return ok_status();
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(const std::string& list) {
  std::vector<std::string> out;
  for (const std::string& item : split_top(list))
    SHOAL_RETURN_IF_ERROR(expand_one(item, list, out));
  return out;
}

std::string compress_hostlist(const std::vector<std::string>& names) {
  // Runs of prefix + consecutive unpadded numbers collapse into prefix[a-b].
  std::string out;
  std::size_t i = 0;
  auto split = [](const std::string& n) {
    std::size_t d = n.size();
    while (d > 0 && std::isdigit(static_cast<unsigned char>(n[d - 1]))) --d;
    return d;
  };
  while (i < names.size()) {
    const std::string& n = names[i];
    std::size_t d = split(n);
    // Zero-padded or too long for a long: kept as the name it is.
    if (d == n.size() || (n.size() - d > 1 && n[d] == '0') || n.size() - d > 18) {
      out += (out.empty() ? "" : ",") + n;
      ++i;
      continue;
    }
    const std::string prefix = n.substr(0, d);
    long first = std::stol(n.substr(d)), last = first;
    std::size_t j = i + 1;
    while (j < names.size() && split(names[j]) == d && names[j].compare(0, d, prefix) == 0 &&
           names[j][d] != '0' && names[j].size() - d <= 18 &&
           std::stol(names[j].substr(d)) == last + 1) {
      ++last;
      ++j;
    }
    out += (out.empty() ? "" : ",") + prefix;
    out += first == last ? std::to_string(first)
                         : "[" + std::to_string(first) + "-" + std::to_string(last) + "]";
    i = j;
  }
  return out;
}

}  // namespace shoal::cluster
