// ShardOptions as text: what a worker sends a server (wire op 'C') and
// what a server compares with its own options.
#include <cstdlib>
#include <sstream>
#include <utility>
#include <vector>

#include "shoal/ps/shard.h"

namespace shoal::ps {
namespace {

using Fields = std::vector<std::pair<std::string, std::string>>;

// Every field that changes the math, in a fixed order. Numbers are printed
// with enough digits to read back the same double.
Fields fields(const ShardOptions& o) {
  auto num = [](double v) { return fmt::format("{}", v); };
  return {
      {"mode", mode_name(o.mode)},
      {"staleness", std::to_string(o.staleness)},
      {"optimizer", o.optimizer.name},
      {"momentum", num(o.optimizer.momentum)},
      {"weight_decay", num(o.optimizer.weight_decay)},
      {"beta1", num(o.optimizer.beta1)},
      {"beta2", num(o.optimizer.beta2)},
      {"eps", num(o.optimizer.eps)},
      {"trust", num(o.optimizer.trust)},
      {"lr", num(o.lr)},
      {"compress", compression_text(o.compression)},
      {"slice_bound", std::to_string(o.slice_bound)},
      {"stale_lr", o.stale_lr ? "1" : "0"},
  };
}

Result<double> number(const std::string& field, const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size())
    return invalid_argument("ps config: field '{}' is '{}', not a number", field, v);
  return d;
}

}  // namespace

std::string config_text(const ShardOptions& o) {
  std::string s;
  for (const auto& [k, v] : fields(o)) s += (s.empty() ? "" : " ") + k + "=" + v;
  return s;
}

Result<ShardOptions> parse_config(const std::string& text) {
  ShardOptions o;
  std::istringstream in(text);
  std::string item;
  int seen = 0;
  while (in >> item) {
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      return invalid_argument("ps config: '{}' is not field=value", item);
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    ++seen;
    if (k == "mode") {
      SHOAL_ASSIGN_OR_RETURN(o.mode, parse_mode(v));
    } else if (k == "optimizer") {
      o.optimizer.name = v;
    } else if (k == "compress") {
      SHOAL_ASSIGN_OR_RETURN(o.compression, parse_compression(v));
    } else {
      SHOAL_ASSIGN_OR_RETURN(double d, number(k, v));
      if (k == "staleness")
        o.staleness = static_cast<int>(d);
      else if (k == "momentum")
        o.optimizer.momentum = d;
      else if (k == "weight_decay")
        o.optimizer.weight_decay = d;
      else if (k == "beta1")
        o.optimizer.beta1 = d;
      else if (k == "beta2")
        o.optimizer.beta2 = d;
      else if (k == "eps")
        o.optimizer.eps = d;
      else if (k == "trust")
        o.optimizer.trust = d;
      else if (k == "lr")
        o.lr = d;
      else if (k == "slice_bound")
        o.slice_bound = static_cast<std::int64_t>(d);
      else if (k == "stale_lr") {
        if (d != 0 && d != 1)
          return invalid_argument("ps config: field 'stale_lr' is '{}', not 0 or 1", v);
        o.stale_lr = d == 1;
      } else
        return invalid_argument("ps config: unknown field '{}'", k);
    }
  }
  const auto want = fields(ShardOptions{}).size();
  if (static_cast<std::size_t>(seen) != want)
    return invalid_argument("ps config: {} fields, expected {} ('{}')", seen, want, text);
  return o;
}

std::string config_diff(const ShardOptions& server, const ShardOptions& worker) {
  const Fields a = fields(server), b = fields(worker);
  for (std::size_t i = 0; i < a.size(); ++i) {
    // A worker's lr is only the base of its schedule: every push carries
    // the step's own, so servers need not agree on it.
    if (a[i].first == "lr") continue;
    if (a[i].second != b[i].second)
      return fmt::format("{}: the server has {}, the worker asks for {}", a[i].first, a[i].second,
                         b[i].second);
  }
  return "";
}

}  // namespace shoal::ps
