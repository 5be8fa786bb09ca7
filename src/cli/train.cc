// `shoal train`: flags (and --config FILE in YAML or JSON) into
// TrainOptions, then train::Trainer. Unknown or invalid options in either
// place are refused with a message that names them.
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <fstream>

#include "cli/commands.h"
#include "shoal/core/logging.h"
#include "shoal/train/trainer.h"

namespace shoal::cli {
namespace {

// CLI11 config formatter over yaml-cpp (YAML is a superset of JSON, so one
// parser reads both). A config is a flat mapping of option names (with '-'
// or '_') to scalars or lists.
class YamlConfig final : public CLI::Config {
 public:
  std::string to_config(const CLI::App*, bool, bool, std::string) const override { return ""; }
  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    YAML::Node root;
    try {
      root = YAML::Load(in);
    } catch (const YAML::Exception& e) {
      throw CLI::ConfigError(fmt::format("--config: not valid YAML/JSON at line {}, column {}: {}",
                                         e.mark.line + 1, e.mark.column + 1, e.msg));
    }
    std::vector<CLI::ConfigItem> items;
    if (root.IsNull()) return items;
    if (!root.IsMap())
      throw CLI::ConfigError("--config: the file must hold a mapping of option: value");
    for (const auto& kv : root) {
      CLI::ConfigItem it;
      it.name = kv.first.as<std::string>();
      std::replace(it.name.begin(), it.name.end(), '_', '-');
      const YAML::Node& v = kv.second;
      if (v.IsScalar()) {
        it.inputs.push_back(v.as<std::string>());
      } else if (v.IsSequence()) {
        for (const auto& e : v) {
          if (!e.IsScalar())
            throw CLI::ConfigError(
                fmt::format("--config: option '{}' holds a nested value", it.name));
          it.inputs.push_back(e.as<std::string>());
        }
      } else {
        throw CLI::ConfigError(fmt::format("--config: option '{}' must be a scalar or a list",
                                           it.name));
      }
      items.push_back(std::move(it));
    }
    return items;
  }
};

}  // namespace

TrainCommand add_train_command(CLI::App& app) {
  TrainCommand c;
  c.opts = std::make_shared<train::TrainOptions>();
  auto& o = *c.opts;
  CLI::App* t = app.add_subcommand("train", "Train a model on an IDX dataset (Fashion-MNIST)");
  c.app = t;
  t->add_option("--model", o.model, "mlp, cnn or resnet (ResNet-20)")
      ->check(CLI::IsMember({"mlp", "cnn", "resnet", "resnet20"}))
      ->capture_default_str();
  t->add_option("--data", o.data, "fashion-mnist, mnist, or a directory of IDX files")
      ->capture_default_str();
  t->add_option("--epochs", o.epochs, "Epochs")->check(CLI::PositiveNumber)->capture_default_str();
  t->add_option("--batch", o.batch, "Batch size per rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  t->add_option("--optimizer", o.optimizer, "sgd, momentum, nesterov, adam, adamw, lars, lamb")
      ->check(CLI::IsMember({"sgd", "momentum", "nesterov", "adam", "adamw", "lars", "lamb"}))
      ->capture_default_str();
  t->add_option("--lr", o.lr, "Learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  t->add_option("--momentum", o.momentum, "Momentum (momentum, nesterov, lars)")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  t->add_option("--weight-decay", o.weight_decay, "Weight decay")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  t->add_option("--trust", o.trust, "LARS trust coefficient (eta)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  t->add_option("--schedule", o.schedule, "LR schedule: constant, step, cosine")
      ->check(CLI::IsMember({"constant", "step", "cosine"}))
      ->capture_default_str();
  t->add_option("--warmup-epochs", o.warmup_epochs, "Linear LR warmup (epochs, may be fractional)")
      ->check(CLI::NonNegativeNumber);
  t->add_option("--step-epochs", o.step_epochs, "Step schedule: epochs between decays")
      ->check(CLI::PositiveNumber);
  t->add_option("--gamma", o.gamma, "Step schedule: decay factor")->check(CLI::PositiveNumber);
  t->add_flag("--linear-scaling", o.linear_scaling, "lr *= global batch / 256 (Goyal et al.)");
  t->add_option("--threads", o.threads, "CPU threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  t->add_option("--seed", o.seed, "Random seed (weights, shuffling, augmentation)");
  t->add_option("--out", o.out, "Run directory (default runs/<model>)");
  t->add_flag("--augment", o.augment, "Random crop (pad 2) and horizontal flip");
  t->add_flag("--deterministic", o.deterministic,
              "Bit-identical reruns: refuse to resume with a different thread count");
  t->add_option("--keep-checkpoints", o.keep_checkpoints, "Checkpoints kept in <out>/checkpoints")
      ->check(CLI::PositiveNumber);
  t->add_option("--checkpoint-every", o.checkpoint_every, "Steps between checkpoints (0 = epoch)")
      ->check(CLI::NonNegativeNumber);
  t->add_flag("!--no-checkpoints", o.checkpoints, "Write no checkpoints");
  t->add_flag("--resume", o.resume, "Continue from the newest loadable checkpoint in <out>");
  t->add_option("--max-steps", o.max_steps, "Stop after this many steps in all")
      ->check(CLI::NonNegativeNumber);
  t->add_option("--limit-train", o.limit_train, "Use only the first N training samples")
      ->check(CLI::NonNegativeNumber);
  t->add_option("--limit-test", o.limit_test, "Use only the first N test samples")
      ->check(CLI::NonNegativeNumber);
  t->add_option("--eval-batch", o.eval_batch, "Evaluation batch")->check(CLI::PositiveNumber);
  t->add_flag("!--no-plot", o.plot, "Do not write metrics.png");
  t->add_flag("--quiet", o.quiet, "No progress output");
  t->add_option("--trace", o.trace, "Write a Chrome trace of the last step of each epoch");
  t->set_config("--config", "", "YAML or JSON file with the same options (flags win)");
  t->config_formatter(std::make_shared<YamlConfig>());
  t->allow_config_extras(CLI::config_extras_mode::error);
  return c;
}

int run_train(const train::TrainOptions& o) {
  auto t = train::Trainer::create(o);
  if (!t.ok()) {
    SHOAL_LOG_ERROR("shoal train: {}", t.status().to_string());
    return 2;
  }
  auto& tr = **t;
  if (o.rank == 0 && !o.quiet)
    fmt::print("shoal train: {} on {} ({} steps/epoch, batch {}), {} lr {}, run dir {}\n", o.model,
               o.data, tr.steps_per_epoch(), o.batch, o.optimizer, o.lr, tr.run_dir());
  Status st = tr.run();
  if (!st.ok()) {
    SHOAL_LOG_ERROR("shoal train: {}", st.to_string());
    return 1;
  }
  if (!tr.history().empty() && o.rank == 0 && !o.quiet) {
    const auto& last = tr.history().back();
    double secs = 0;
    for (const auto& e : tr.history()) secs += e.wall_seconds;
    fmt::print("final: test accuracy {:.2f}% after {} epochs, {:.0f} img/s, {:.1f} s\n",
               100 * last.test_acc, last.epoch, last.images_per_s, secs);
  }
  return 0;
}

}  // namespace shoal::cli
