// Autoregressive sampling from a checkpointed GPT.
#include "shoal/train/sample.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "shoal/runtime/backend.h"
#include "shoal/tensor/philox.h"
#include "shoal/train/checkpoint.h"
#include "shoal/train/model.h"
#include "shoal/train/text.h"

namespace shoal::train {

namespace fs = std::filesystem;

namespace {

// Index of the character drawn from `logits` (size V).
std::int32_t draw(const float* logits, std::size_t v, const SampleOptions& o, PhiloxRng& rng) {
  std::vector<std::int32_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b]; };
  if (o.temperature <= 0) return *std::min_element(order.begin(), order.end(), by_logit);
  std::size_t k = o.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(o.top_k), v) : v;
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    by_logit);
  std::vector<double> p(k);
  const double top = logits[order[0]];
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i)
    sum += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  double u = rng.uniform() * sum;
  for (std::size_t i = 0; i < k; ++i) {
    u -= p[i];
    if (u < 0) return order[i];
  }
  return order[k - 1];
}

}  // namespace

Result<std::string> sample_text(const WeightsFile& w, const SampleOptions& o) {
  auto gpt_meta = w.meta.find("gpt"), vocab_meta = w.meta.find("vocab");
  if (gpt_meta == w.meta.end() || vocab_meta == w.meta.end())
    return invalid_argument(
        "{}: not a language model's checkpoint (no 'gpt' and 'vocab' metadata; train with "
        "--model gpt --data text:PATH)",
        w.path);
  SHOAL_ASSIGN_OR_RETURN(GptConfig cfg, parse_gpt_config(gpt_meta->second));
  SHOAL_ASSIGN_OR_RETURN(std::string vocab, vocab_from_hex(vocab_meta->second));
  if (o.prompt.empty()) return invalid_argument("the prompt is empty: give one character or more");
  std::array<std::int32_t, 256> id;
  id.fill(-1);
  for (std::size_t i = 0; i < vocab.size(); ++i)
    id[static_cast<unsigned char>(vocab[i])] = static_cast<std::int32_t>(i);
  std::vector<std::int32_t> toks;
  for (std::size_t i = 0; i < o.prompt.size(); ++i) {
    std::int32_t t = id[static_cast<unsigned char>(o.prompt[i])];
    if (t < 0)
      return invalid_argument(
          "prompt character {:?} (byte 0x{:02x}) at offset {} is not in the "
          "model's vocabulary of {} characters",
          o.prompt.substr(i, 1), static_cast<unsigned char>(o.prompt[i]), i, vocab.size());
    toks.push_back(t);
  }

  SHOAL_ASSIGN_OR_RETURN(Model model, gpt_model(cfg, static_cast<int>(vocab.size())));
  graph::Graph g;
  graph::Builder b(g);
  graph::Value x = b.input("x", DType::kF32, {1, cfg.context});
  ModelContext mc(b, false);
  graph::Value logits = model.forward(mc, x);
  if (!b.ok()) return b.status().with_context("building the sampling graph");
  g.mark_output(logits);
  auto params = init_params(mc.params(), 0);
  std::map<std::string, Tensor> buffers;
  SHOAL_RETURN_IF_ERROR(apply_weights(w, params, buffers).status());
  SHOAL_ASSIGN_OR_RETURN(auto backend, runtime::make_backend("cpu"));
  SHOAL_ASSIGN_OR_RETURN(auto exe, backend->compile(std::move(g), {}));
  for (auto& [name, t] : params) SHOAL_RETURN_IF_ERROR(exe->bind("param/" + name, t));

  Tensor in = Tensor::empty({1, cfg.context}, DType::kF32);
  PhiloxRng rng(o.seed, 0x5a3b1e);
  std::string out = o.prompt;
  const auto v = vocab.size();
  for (std::int64_t n = 0; n < o.chars; ++n) {
    const auto len = std::min<std::int64_t>(static_cast<std::int64_t>(toks.size()), cfg.context);
    float* p = in.data<float>();
    std::fill(p, p + cfg.context, 0.f);
    for (std::int64_t i = 0; i < len; ++i)
      p[i] = static_cast<float>(toks[toks.size() - static_cast<std::size_t>(len - i)]);
    SHOAL_RETURN_IF_ERROR(exe->bind("x", in));
    SHOAL_RETURN_IF_ERROR(exe->run().with_context("sampling"));
    const float* row = exe->output(0).data<float>() + (len - 1) * static_cast<std::int64_t>(v);
    std::int32_t t = draw(row, v, o, rng);
    toks.push_back(t);
    out.push_back(vocab[static_cast<std::size_t>(t)]);
  }
  return out;
}

}  // namespace shoal::train
