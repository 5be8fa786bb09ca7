// Reading typed fields out of a YAML mapping, with errors that name the
// file, the line, the field and the value (cluster specs and topologies).
#pragma once

#include <yaml-cpp/yaml.h>

#include <set>
#include <string>

#include "shoal/core/status.h"

namespace shoal::cluster {

class Fields {
 public:
  // `node` must be a mapping; keys outside `known` are refused by name.
  static Result<Fields> open(const YAML::Node& node, const std::string& where,
                             const std::set<std::string>& known);

  bool has(const std::string& key) const { return node_[key].IsDefined(); }
  const YAML::Node& node() const { return node_; }
  std::string at(const std::string& key) const;  // "where:line: field `key`"

  Result<std::string> text(const std::string& key, std::string fallback) const;
  Result<std::int64_t> integer(const std::string& key, std::int64_t fallback, std::int64_t lo,
                               std::int64_t hi) const;
  Result<double> number(const std::string& key, double fallback, double lo, double hi) const;

 private:
  YAML::Node node_;
  std::string where_;
};

// YAML text → root node; parse errors name the place.
Result<YAML::Node> load_yaml(const std::string& text, const std::string& where);
// A `links:` field: none, ring or mesh WxH (kind 0, 1, 2; w, h for mesh).
struct LinkShape {
  int kind = 0, w = 0, h = 0;
};
Result<LinkShape> read_link_shape(const Fields& f, const std::string& key);
// "WxH" → (w, h), both ≥ 1.
Result<std::pair<int, int>> parse_dims(const std::string& s, const std::string& at);

}  // namespace shoal::cluster
