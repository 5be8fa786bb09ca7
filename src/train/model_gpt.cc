// A GPT-style decoder (Radford et al. 2019's layout, nanoGPT's sizes):
// token + learned position embeddings, N pre-norm blocks of causal
// multi-head self-attention and a GELU MLP (4x wide), a final layer norm,
// and an output head tied to the token embedding (or its own). Built from
// plain graph ops, so autodiff, the passes and the runtime see nothing new.
// Activations are [B*T, D] between blocks; attention reshapes to
// [B, H, T, D/H]. Weights start as GPT-2 does: N(0, 0.02), the residual
// projections N(0, 0.02/sqrt(2 layers)), biases 0, layer norms 1 and 0.
#include <charconv>
#include <cmath>

#include "shoal/train/model.h"

namespace shoal::train {

using graph::Builder;
using graph::Value;

namespace {

constexpr double kInitStd = 0.02;

struct Gpt {
  ModelContext& m;
  const GptConfig& c;
  std::int64_t batch, len, head_dim;

  Builder& b() { return m.b(); }

  Value dense(Value x, std::int64_t in, std::int64_t out, const std::string& name, double std) {
    Value w = m.normal_param(name + ".weight", {out, in}, std);
    Value bias = m.param(name + ".bias", {out}, "zeros", 1, 1);
    return b().linear(x, w, bias);
  }

  Value norm(Value x, const std::string& name) {
    Value g = m.param(name + ".weight", {c.dim}, "ones", 1, 1);
    Value bt = m.param(name + ".bias", {c.dim}, "zeros", 1, 1);
    return b().layer_norm(x, g, bt, 1e-5);
  }

  // [B*T, D] -> [B, H, T, D/H]
  Value heads(Value x) {
    Value r = b().reshape(x, {batch, len, c.heads, head_dim});
    return b().transpose(r, {0, 2, 1, 3});
  }

  Value attention(Value x, const std::string& n) {
    const double proj_std = kInitStd / std::sqrt(2.0 * c.layers);
    Value q = heads(dense(x, c.dim, c.dim, n + ".q", kInitStd));
    Value k = heads(dense(x, c.dim, c.dim, n + ".k", kInitStd));
    Value v = heads(dense(x, c.dim, c.dim, n + ".v", kInitStd));
    Value s = b().matmul(q, k, false, true);  // [B, H, T, T]
    // Scaled, causally masked (t attends to positions <= t) and normalised
    // in one op and one pass, its gradient in one more.
    Value p = b().attention_softmax(s, 1.0 / std::sqrt(static_cast<double>(head_dim)), true);
    Value o = b().transpose(b().matmul(p, v), {0, 2, 1, 3});  // [B, T, H, D/H]
    o = b().reshape(o, {batch * len, c.dim});
    return dense(o, c.dim, c.dim, n + ".proj", proj_std);
  }

  Value mlp(Value x, const std::string& n) {
    const double proj_std = kInitStd / std::sqrt(2.0 * c.layers);
    Value h = b().gelu(dense(x, c.dim, 4 * c.dim, n + ".fc", kInitStd));
    return dense(h, 4 * c.dim, c.dim, n + ".proj", proj_std);
  }

  Value forward(Value x, int vocab) {
    Value ids = b().cast(x, DType::kI32);
    Value wte = m.normal_param("wte.weight", {vocab, c.dim}, kInitStd);
    Value wpe = m.normal_param("wpe.weight", {c.context, c.dim}, kInitStd);
    Value pos = len == c.context ? wpe : b().slice(wpe, 0, 0, len, 1);
    Value h = b().add(b().embedding(wte, ids), pos);  // [B, T, D]
    h = b().reshape(h, {batch * len, c.dim});
    for (int l = 0; l < c.layers; ++l) {
      std::string n = "h." + std::to_string(l);
      h = b().add(h, attention(norm(h, n + ".ln_1"), n + ".attn"));
      h = b().add(h, mlp(norm(h, n + ".ln_2"), n + ".mlp"));
    }
    h = norm(h, "ln_f");
    if (c.tied) return b().matmul(h, wte, false, true);  // [B*T, vocab]
    Value head = m.normal_param("lm_head.weight", {vocab, c.dim}, kInitStd);
    return b().matmul(h, head, false, true);
  }
};

}  // namespace

std::string GptConfig::str() const {
  return fmt::format("layers={} heads={} dim={} context={} tied={}", layers, heads, dim, context,
                     tied ? 1 : 0);
}

Status validate(const GptConfig& c) {
  if (c.layers < 1) return invalid_argument("--layers must be >= 1, got {}", c.layers);
  if (c.heads < 1) return invalid_argument("--heads must be >= 1, got {}", c.heads);
  if (c.dim < 1 || c.dim % c.heads != 0)
    return invalid_argument("--dim {} must be a positive multiple of --heads {}", c.dim, c.heads);
  if (c.context < 1) return invalid_argument("--context must be >= 1, got {}", c.context);
  return ok_status();
}

Result<GptConfig> parse_gpt_config(std::string_view s) {
  GptConfig c;
  std::int64_t seen = 0;
  while (!s.empty()) {
    std::size_t sp = s.find(' ');
    std::string_view item = s.substr(0, sp);
    s = sp == std::string_view::npos ? std::string_view{} : s.substr(sp + 1);
    std::size_t eq = item.find('=');
    std::int64_t v = 0;
    auto [end, ec] = eq == std::string_view::npos
                         ? std::from_chars(item.data(), item.data(), v)
                         : std::from_chars(item.data() + eq + 1, item.data() + item.size(), v);
    if (eq == std::string_view::npos || ec != std::errc{} || end != item.data() + item.size())
      return invalid_argument("GPT config: '{}' is not key=integer", item);
    std::string_view k = item.substr(0, eq);
    if (k == "layers")
      c.layers = static_cast<int>(v);
    else if (k == "heads")
      c.heads = static_cast<int>(v);
    else if (k == "dim")
      c.dim = v;
    else if (k == "context")
      c.context = v;
    else if (k == "tied")
      c.tied = v != 0;
    else
      return invalid_argument("GPT config: unknown key '{}'", k);
    ++seen;
  }
  if (seen != 5) return invalid_argument("GPT config: expected 5 keys, got {}", seen);
  SHOAL_RETURN_IF_ERROR(validate(c));
  return c;
}

Result<Model> gpt_model(const GptConfig& c, int vocab) {
  SHOAL_RETURN_IF_ERROR(validate(c));
  if (vocab < 1) return invalid_argument("--model gpt needs a vocabulary; got {} classes", vocab);
  Model md;
  md.name = "gpt";
  md.forward = [c, vocab](ModelContext& m, Value x) -> Value {
    const Shape& s = m.b().shape(x);
    if (s.size() != 2 || s[1] > c.context) {
      m.b().fail(invalid_argument(
          "--model gpt takes token ids [T] with T <= --context {} (--data text:PATH); the data's "
          "samples are {}",
          c.context, shape_str(Shape(s.begin() + 1, s.end()))));
      return {};
    }
    Gpt g{m, c, s[0], s[1], c.dim / c.heads};
    return g.forward(x, vocab);
  };
  return md;
}

}  // namespace shoal::train
