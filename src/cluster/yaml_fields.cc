#include "cluster/yaml_fields.h"

#include <charconv>
#include <cmath>

namespace shoal::cluster {

Result<YAML::Node> load_yaml(const std::string& text, const std::string& where) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return invalid_argument("{}:{}: not YAML: {}", where, e.mark.line + 1, e.msg);
  }
}

Result<Fields> Fields::open(const YAML::Node& node, const std::string& where,
                            const std::set<std::string>& known) {
  if (!node.IsMap())
    return invalid_argument("{}:{}: expected a mapping of fields", where, node.Mark().line + 1);
  for (const auto& kv : node) {
    std::string key = kv.first.Scalar();
    if (!known.contains(key)) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      return invalid_argument("{}:{}: unknown field `{}` (known: {})", where,
                              kv.first.Mark().line + 1, key, list);
    }
  }
  Fields f;
  f.node_ = node;
  f.where_ = where;
  return f;
}

std::string Fields::at(const std::string& key) const {
  const YAML::Node v = node_[key];
  int line = v.IsDefined() ? v.Mark().line + 1 : node_.Mark().line + 1;
  return fmt::format("{}:{}: field `{}`", where_, line, key);
}

Result<std::string> Fields::text(const std::string& key, std::string fallback) const {
  const YAML::Node v = node_[key];
  if (!v.IsDefined()) return fallback;
  if (!v.IsScalar()) return invalid_argument("{}: expected a string", at(key));
  return v.Scalar();
}

Result<double> Fields::number(const std::string& key, double fallback, double lo, double hi) const {
  const YAML::Node v = node_[key];
  if (!v.IsDefined()) return fallback;
  double x = 0;
  if (!v.IsScalar() || !YAML::convert<double>::decode(v, x) || !std::isfinite(x))
    return invalid_argument("{}: `{}` is not a number", at(key), v.IsScalar() ? v.Scalar() : "?");
  if (x < lo || x > hi)
    return invalid_argument("{}: {} is outside [{}, {}]", at(key), v.Scalar(), lo, hi);
  return x;
}

Result<std::int64_t> Fields::integer(const std::string& key, std::int64_t fallback, std::int64_t lo,
                                     std::int64_t hi) const {
  const YAML::Node v = node_[key];
  if (!v.IsDefined()) return fallback;
  std::int64_t x = 0;
  const std::string s = v.IsScalar() ? v.Scalar() : "";
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (!v.IsScalar() || ec != std::errc() || end != s.data() + s.size())
    return invalid_argument("{}: `{}` is not an integer", at(key), v.IsScalar() ? s : "?");
  if (x < lo || x > hi) return invalid_argument("{}: {} is outside [{}, {}]", at(key), x, lo, hi);
  return x;
}

Result<LinkShape> read_link_shape(const Fields& f, const std::string& key) {
  SHOAL_ASSIGN_OR_RETURN(std::string links, f.text(key, "none"));
  if (links == "none") return LinkShape{0, 0, 0};
  if (links == "ring") return LinkShape{1, 0, 0};
  if (links.rfind("mesh", 0) == 0) {
    std::string dims = links.substr(4);
    while (!dims.empty() && dims.front() == ' ') dims.erase(dims.begin());
    SHOAL_ASSIGN_OR_RETURN(auto wh, parse_dims(dims, f.at(key)));
    return LinkShape{2, wh.first, wh.second};
  }
  return invalid_argument("{}: `{}` is not one of none, ring, mesh WxH", f.at(key), links);
}

Result<std::pair<int, int>> parse_dims(const std::string& s, const std::string& at) {
  auto x = s.find_first_of("xX×");
  int w = 0, h = 0;
  if (x != std::string::npos) {
    std::size_t skip = s.compare(x, 2, "×") == 0 ? 2 : 1;
    auto r1 = std::from_chars(s.data(), s.data() + x, w);
    auto r2 = std::from_chars(s.data() + x + skip, s.data() + s.size(), h);
    if (r1.ec == std::errc() && r1.ptr == s.data() + x && r2.ec == std::errc() &&
        r2.ptr == s.data() + s.size() && w >= 1 && h >= 1 && w <= 64 && h <= 64)
      return std::pair{w, h};
  }
  return invalid_argument("{}: `{}` is not WxH (two integers in 1..64, e.g. 4x2)", at, s);
}

}  // namespace shoal::cluster
