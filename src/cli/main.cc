// The `shoal` binary: dispatches to one subcommand per file.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "shoal/train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"Shoal: distributed deep-learning training"};
  app.require_subcommand(1);
  auto* info =
      app.add_subcommand("info", "Print version, build, oneDNN/BLAS versions and CPU features");
  auto* example = app.add_subcommand("example", "Run a built-in example");
  std::string which = "mlp", trace;
  int threads = 0, steps = 10;
  std::uint64_t seed = 1;
  example->add_option("name", which, "Example to run")->check(CLI::IsMember({"mlp"}));
  example->add_option("--threads", threads, "CPU threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  example->add_option("--steps", steps, "SGD steps")->check(CLI::PositiveNumber);
  example->add_option("--seed", seed, "Random seed");
  example->add_option("--trace", trace, "Write Chrome trace JSON to FILE");
  auto train = shoal::cli::add_train_command(app);
  CLI11_PARSE(app, argc, argv);
  if (train.app->parsed()) return shoal::cli::run_train(*train.opts);
  if (info->parsed()) return shoal::cli::run_info();
  if (example->parsed()) return shoal::cli::run_example_mlp(threads, steps, seed, trace);
  return 1;
}
