// `shoal eval --model M --weights FILE`: the test-split loss and accuracy
// of weights that a Shoal run or another tool (PyTorch state_dict names)
// wrote, with the input normalization the file records (a Shoal
// checkpoint) or, failing that, the training split's.
#include <CLI/CLI.hpp>
#include <cmath>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "shoal/core/logging.h"
#include "shoal/train/sample.h"
#include "shoal/train/trainer.h"

namespace shoal::cli {

EvalCommand add_eval_command(CLI::App& app) {
  EvalCommand c;
  c.opts = std::make_shared<train::TrainOptions>();
  auto& o = *c.opts;
  CLI::App* e = app.add_subcommand("eval", "Evaluate weights on a dataset's test split");
  c.app = e;
  e->add_option("--model", o.model,
                "mlp, cnn, resnet (ResNet-20), gpt (its size read from the checkpoint), or an "
                "ONNX file (path ending in .onnx)")
      ->check(model_name_check())
      ->capture_default_str();
  e->add_option("--weights", o.init_from,
                "A Shoal checkpoint, a run directory (its newest checkpoint), or a safetensors "
                "state_dict (PyTorch names)")
      ->required();
  e->add_option("--data", o.data,
                "fashion-mnist, mnist, a .npz file (x_train, y_train, x_test, y_test), or a "
                "directory of IDX files, of those arrays as .npy, or of train/ and test/ image "
                "folders (one subfolder per class)")
      ->capture_default_str();
  e->add_option("--limit-test", o.limit_test, "Use the first N test samples (0 = all)")
      ->check(non_negative());
  e->add_option("--eval-batch", o.eval_batch, "Evaluation batch")
      ->check(at_least_one())
      ->capture_default_str();
  e->add_option("--threads", o.threads, "CPU threads (0 = all cores)")->check(non_negative());
  return c;
}

int run_eval(const train::TrainOptions& given) {
  train::TrainOptions o = given;
  // A run directory means its newest checkpoint that loads.
  auto w = train::read_weights(o.init_from);
  if (w.ok()) o.init_from = w->path;
  if (o.model == "gpt" && w.ok()) {  // the size is the checkpoint's (train --model gpt writes it)
    auto it = w->meta.find("gpt");
    if (it != w->meta.end()) {
      auto cfg = train::parse_gpt_config(it->second);
      if (!cfg.ok()) {
        SHOAL_LOG_ERROR("shoal eval: {}: {}", o.init_from, cfg.status().to_string());
        return 2;
      }
      o.gpt = *cfg;
    }
  }
  o.checkpoints = false;  // nothing is written: no run directory is made
  o.plot = false;
  o.quiet = true;
  o.out = "/nonexistent/shoal-eval";
  auto t = train::Trainer::create(o);
  if (!t.ok()) {
    SHOAL_LOG_ERROR("shoal eval: {}", t.status().to_string());
    return 2;
  }
  auto r = (*t)->evaluate();
  if (!r.ok()) {
    SHOAL_LOG_ERROR("shoal eval: {}", r.status().to_string());
    return 1;
  }
  if (o.model == "gpt")
    fmt::print(
        "eval: validation {:.3f} bits/char, loss {:.4f} accuracy {:.2f}% on {} tokens ({} "
        "on {})\n",
        r->loss / std::log(2.0), r->loss, 100 * r->accuracy, r->samples, o.init_from, o.data);
  else
    fmt::print("eval: test loss {:.4f} accuracy {:.2f}% on {} images ({} on {})\n", r->loss,
               100 * r->accuracy, r->samples, o.init_from, o.data);
  return 0;
}

}  // namespace shoal::cli
