// `shoal example mlp`: the foundation's end-to-end demo. Builds a 2-layer MLP
// graph, differentiates it, compiles it on the CPU backend and runs SGD on a
// fixed random batch, printing loss and gradient norms each step.
#include <chrono>
#include <cmath>

#include "cli/commands.h"
#include "shoal/core/logging.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"
#include "shoal/tensor/philox.h"

namespace shoal::cli {

int run_example_mlp(int threads, int steps, std::uint64_t seed, const std::string& trace) {
  using namespace graph;
  runtime::set_num_threads(threads);
  const std::int64_t n = 64, in = 784, hidden = 256, classes = 10;
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {n, in});
  Value y = b.input("labels", DType::kI32, {n});
  std::vector<std::pair<std::string, Shape>> pshapes = {
      {"w1", {hidden, in}}, {"b1", {hidden}}, {"w2", {classes, hidden}}, {"b2", {classes}}};
  std::vector<Value> params;
  for (const auto& [name, s] : pshapes) params.push_back(b.input(name, DType::kF32, s));
  Value logits = b.linear(b.relu(b.linear(x, params[0], params[1])), params[2], params[3]);
  Value loss = b.cross_entropy(logits, y);
  if (!b.ok()) {
    SHOAL_LOG_ERROR("building the MLP: {}", b.status().to_string());
    return 1;
  }
  auto grads = autodiff(g, loss, params);
  if (!grads.ok()) {
    SHOAL_LOG_ERROR("{}", grads.status().to_string());
    return 1;
  }
  g.mark_output(loss);
  for (Value gv : *grads) g.mark_output(gv);

  auto backend = runtime::make_backend("cpu");
  auto exe = (*backend)->compile(g, {});
  if (!exe.ok()) {
    SHOAL_LOG_ERROR("{}", exe.status().to_string());
    return 1;
  }
  (*exe)->enable_trace(!trace.empty());

  PhiloxRng rng(seed, 0);
  std::map<std::string, Tensor> feeds;
  Tensor xt = Tensor::empty({n, in}, DType::kF32);
  rng.fill_normal(xt, 0, 1);
  Tensor yt = Tensor::empty({n}, DType::kI32);
  for (std::int64_t i = 0; i < n; ++i)
    yt.set(i, static_cast<double>(rng.next_block()[0] % classes));
  feeds["x"] = xt;
  feeds["labels"] = yt;
  for (std::size_t i = 0; i < pshapes.size(); ++i) {
    Tensor p = Tensor::empty(pshapes[i].second, DType::kF32);
    if (pshapes[i].second.size() == 2) {
      double fan_in = static_cast<double>(pshapes[i].second[1]);
      rng.fill_normal(p, 0, std::sqrt(2.0 / fan_in));  // Kaiming
    }
    feeds[pshapes[i].first] = p;
  }
  fmt::print(
      "MLP {}-{}-{} on a random batch of {}: {} threads, arena {:.1f} KiB (without reuse {:.1f} "
      "KiB)\n",
      in, hidden, classes, n, runtime::num_threads(), (*exe)->arena_bytes() / 1024.0,
      (*exe)->naive_bytes() / 1024.0);
  runtime::Executor ex(**exe);
  const float lr = 0.1f;
  auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    auto out = ex.run(feeds);
    if (!out.ok()) {
      SHOAL_LOG_ERROR("{}", out.status().to_string());
      return 1;
    }
    std::string norms;
    for (std::size_t i = 0; i < pshapes.size(); ++i) {
      const Tensor& gr = (*out)[i + 1];
      Tensor& p = feeds[pshapes[i].first];
      double s = 0;
      for (std::int64_t k = 0; k < gr.numel(); ++k) {
        float gv = gr.data<float>()[k];
        s += static_cast<double>(gv) * gv;
        p.data<float>()[k] -= lr * gv;
      }
      norms += fmt::format(" |d{}|={:.4f}", pshapes[i].first, std::sqrt(s));
    }
    fmt::print("step {:2d}  loss {:.4f} {}\n", step, (*out)[0].data<float>()[0], norms);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{} steps in {:.3f} s ({:.0f} samples/s)\n", steps, secs, steps * n / secs);
  if (!trace.empty()) {
    Status st = ex.write_trace(trace);
    if (!st.ok()) {
      SHOAL_LOG_ERROR("{}", st.to_string());
      return 1;
    }
    fmt::print("trace written to {}\n", trace);
  }
  return 0;
}

}  // namespace shoal::cli
