// `shoal sample --weights RUN_OR_FILE --prompt TEXT`: text from a GPT that
// `shoal train --model gpt --data text:PATH` checkpointed (train/sample.h).
#include "shoal/train/sample.h"

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "shoal/core/logging.h"
#include "shoal/runtime/kernel.h"

namespace shoal::cli {

SampleCommand add_sample_command(CLI::App& app) {
  SampleCommand c;
  c.opts = std::make_shared<SampleFlags>();
  auto& o = *c.opts;
  CLI::App* s = app.add_subcommand("sample", "Generate text from a language model's checkpoint");
  c.app = s;
  s->add_option("--weights", o.weights,
                "A checkpoint of shoal train --model gpt, or its run directory (newest checkpoint)")
      ->required();
  s->add_option("--prompt", o.sample.prompt, "Text to continue")->capture_default_str();
  s->add_option("--chars", o.sample.chars, "Characters to generate")
      ->check(non_negative())
      ->capture_default_str();
  s->add_option("--temperature", o.sample.temperature, "Softmax temperature (0 = most likely)")
      ->check(non_negative())
      ->capture_default_str();
  s->add_option("--top-k", o.sample.top_k, "Draw from the k most likely (0 = all)")
      ->check(non_negative());
  s->add_option("--seed", o.sample.seed, "Random seed (the same seed gives the same text)");
  s->add_option("--threads", o.threads, "CPU threads (0 = all cores)")->check(non_negative());
  return c;
}

int run_sample(const SampleFlags& f) {
  if (f.threads > 0) runtime::set_num_threads(f.threads);
  auto w = train::read_weights(f.weights);
  if (!w.ok()) {
    SHOAL_LOG_ERROR("shoal sample: {}", w.status().to_string());
    return 2;
  }
  auto text = train::sample_text(*w, f.sample);
  if (!text.ok()) {
    SHOAL_LOG_ERROR("shoal sample: {}", text.status().to_string());
    return 2;
  }
  fmt::print("{}\n", *text);
  return 0;
}

}  // namespace shoal::cli
