#include "shoal/core/env.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>

namespace shoal::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

Result<std::int64_t> parse_int(std::string_view text, std::string_view what) {
  std::string s(text);
  if (s.empty()) return invalid_argument("{}: expected an integer, got an empty string", what);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size())
    return invalid_argument("{}: expected an integer, got '{}'", what, s);
  return static_cast<std::int64_t>(v);
}

Result<double> parse_double(std::string_view text, std::string_view what) {
  std::string s(text);
  if (s.empty()) return invalid_argument("{}: expected a number, got an empty string", what);
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size())
    return invalid_argument("{}: expected a number, got '{}'", what, s);
  return v;
}

Result<std::int64_t> get_int(const char* name, std::int64_t fallback) {
  auto v = get(name);
  if (!v) return fallback;
  return parse_int(*v, fmt::format("environment variable {}", name));
}

Result<double> get_double(const char* name, double fallback) {
  auto v = get(name);
  if (!v) return fallback;
  return parse_double(*v, fmt::format("environment variable {}", name));
}

Result<bool> get_bool(const char* name, bool fallback) {
  auto v = get(name);
  if (!v) return fallback;
  // Case-insensitive: Python launchers write str(True), i.e. "True".
  std::string l = *v;
  for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "1" || l == "true" || l == "yes" || l == "on") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off" || l.empty()) return false;
  return invalid_argument("environment variable {}: expected 0/1/true/false, got '{}'", name, *v);
}

}  // namespace shoal::env
