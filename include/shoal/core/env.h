// Typed reads of environment variables; a malformed value is an error that
// names the variable, never a silent default. Thread-safe (read-only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "shoal/core/status.h"

namespace shoal::env {

std::optional<std::string> get(const char* name);
Result<std::int64_t> get_int(const char* name, std::int64_t fallback);
Result<double> get_double(const char* name, double fallback);
Result<bool> get_bool(const char* name, bool fallback);

// Strict integer parse of a whole string ("12", "-3"); names `what` on error.
Result<std::int64_t> parse_int(std::string_view text, std::string_view what);
Result<double> parse_double(std::string_view text, std::string_view what);

}  // namespace shoal::env
