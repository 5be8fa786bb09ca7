// Subcommands of the `shoal` binary, one file each.
#pragma once

#include <memory>
#include <set>
#include <string>

namespace CLI {
class App;
}
namespace shoal::train {
struct TrainOptions;
}

namespace shoal::cli {
int run_info();
int run_example_mlp(int threads, int steps, std::uint64_t seed, const std::string& trace);
std::string cpu_features();

struct TrainCommand {
  CLI::App* app = nullptr;
  std::shared_ptr<train::TrainOptions> opts;
};
TrainCommand add_train_command(CLI::App& app);
int run_train(const train::TrainOptions& o);
}  // namespace shoal::cli
