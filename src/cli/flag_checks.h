// Flag checks whose messages say what is wanted ("--tp: must be >= 1, got
// 0"); CLI11's PositiveNumber prints the limits of a double instead
// ("Value 0 not in range 0.000000 to 17976931348623157...").
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <exception>
#include <string>

namespace shoal::cli {

// A finite number (whole or not, as the option's type then parses it)
// >= lo, or > lo when `strictly`.
inline CLI::Validator number_check(double lo, bool strictly) {
  return CLI::Validator(
      [lo, strictly](std::string& s) -> std::string {
        std::size_t used = 0;
        double v = 0;
        try {
          v = std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size() || !std::isfinite(v))
          return fmt::format("expects a number, got '{}'", s);
        if (strictly ? !(v > lo) : !(v >= lo))
          return fmt::format("must be {} {}, got {}", strictly ? ">" : ">=", lo, s);
        return "";
      },
      fmt::format("{} {}", strictly ? ">" : ">=", lo));
}

inline CLI::Validator positive() { return number_check(0, true); }
inline CLI::Validator non_negative() { return number_check(0, false); }
// Counts: ranks, micro-batches, steps.
inline CLI::Validator at_least_one() { return number_check(1, false); }

}  // namespace shoal::cli
