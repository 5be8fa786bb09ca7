// Subcommands of the `shoal` binary, one file each.
#pragma once

#include <set>
#include <string>

namespace shoal::cli {
int run_info();
int run_example_mlp(int threads, int steps, std::uint64_t seed, const std::string& trace);
std::string cpu_features();
}  // namespace shoal::cli
