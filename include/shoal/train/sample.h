// Text from a trained character-level GPT: `shoal sample`. The checkpoint
// carries what rebuilds the model (metadata "gpt": its size, "vocab": its
// bytes), so nothing but the file is needed. Each new character is drawn
// from softmax(logits / temperature) over the k most likely (all when k is
// 0) at the last position of the window; the window is the last --context
// characters, right-padded (the causal mask makes padding invisible to the
// positions before it). Draws come from Philox(seed): a seed fixes the text.
#pragma once

#include <cstdint>
#include <string>

#include "shoal/core/status.h"
#include "shoal/train/weights.h"

namespace shoal::train {

struct SampleOptions {
  std::string prompt = "\n";  // every character must be in the model's vocabulary
  std::int64_t chars = 200;   // characters generated after the prompt
  double temperature = 0.8;   // > 0; 0 picks the most likely character
  int top_k = 0;
  std::uint64_t seed = 0;
};

// The prompt followed by the generated characters.
Result<std::string> sample_text(const WeightsFile& w, const SampleOptions& o);

}  // namespace shoal::train
