// bench/ops: matmul 1024x1024x1024 f32 and conv2d (batch 64, 32->64
// channels, 28x28, 3x3, padding 1) forward and backward on Shoal's CPU
// backend, beside PyTorch (tools/peer_ops_torch.py) at the same thread
// count, in one run. Prints the table and the ratio (peer time / ours).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "shoal/graph/builder.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"
#include "shoal/tensor/philox.h"

using namespace shoal;
using graph::Builder;
using graph::Graph;
using graph::Value;

namespace {

double median_ms(runtime::Executable& exe, int reps) {
  for (int i = 0; i < 3; ++i) SHOAL_CHECK(exe.run().ok(), "run failed");
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Status st = exe.run();
    SHOAL_CHECK(st.ok(), "{}", st.to_string());
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Compiles g, binds random inputs, returns the median step time.
double time_graph(Graph& g, int reps) {
  auto exe = (*runtime::make_backend("cpu"))->compile(g, {});
  SHOAL_CHECK(exe.ok(), "{}", exe.status().to_string());
  PhiloxRng rng(1, 0);
  for (int id : g.input_nodes()) {
    const auto& t = g.node(id).outputs[0];
    Tensor x = Tensor::empty(t.shape, t.dtype);
    rng.fill_uniform(x, -1, 1);
    SHOAL_CHECK((*exe)->bind(g.node(id).name, x).ok(), "bind");
  }
  return median_ms(**exe, reps);
}

std::string run_peer(int threads, int reps) {
  std::string cmd = "/usr/bin/python3 tools/peer_ops_torch.py " + std::to_string(threads) + " " +
                    std::to_string(reps) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  int rc = pclose(p);
  if (rc != 0) {
    std::fprintf(stderr, "peer failed (rc %d): %s\n", rc, out.c_str());
    return "";
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  runtime::set_num_threads(threads);
  threads = runtime::num_threads();
  double ms[4];
  {
    Graph g;
    Builder b(g);
    g.mark_output(
        b.matmul(b.input("a", DType::kF32, {1024, 1024}), b.input("b", DType::kF32, {1024, 1024})));
    ms[0] = time_graph(g, reps);
  }
  {
    Graph g;
    Builder b(g);
    Value a = b.input("a", DType::kF32, {1024, 1024}), w = b.input("b", DType::kF32, {1024, 1024});
    Value dy = b.input("dy", DType::kF32, {1024, 1024});
    g.mark_output(b.matmul(dy, w, false, true));
    g.mark_output(b.matmul(a, dy, true, false));
    ms[1] = time_graph(g, reps);
  }
  const Shape xs = {64, 32, 28, 28}, ws = {64, 32, 3, 3}, ys = {64, 64, 28, 28};
  graph::Attrs ca{{"stride", std::vector<std::int64_t>{1, 1}},
                  {"padding", std::vector<std::int64_t>{1, 1}},
                  {"dilation", std::vector<std::int64_t>{1, 1}},
                  {"groups", std::int64_t{1}}};
  {
    Graph g;
    Builder b(g);
    g.mark_output(
        b.op("conv2d", {b.input("x", DType::kF32, xs), b.input("w", DType::kF32, ws)}, ca));
    ms[2] = time_graph(g, reps);
  }
  {
    Graph g;
    Builder b(g);
    Value x = b.input("x", DType::kF32, xs), w = b.input("w", DType::kF32, ws),
          dy = b.input("dy", DType::kF32, ys);
    graph::Attrs ai = ca, aw = ca;
    ai.set("input_shape", xs);
    aw.set("weight_shape", ws);
    g.mark_output(b.op("conv2d_grad_input", {dy, w}, ai));
    g.mark_output(b.op("conv2d_grad_weight", {x, dy}, aw));
    ms[3] = time_graph(g, reps);
  }
  std::string peer_out = run_peer(threads, reps);
  auto pj = nlohmann::json::parse(peer_out, nullptr, false);
  bool have_peer = !pj.is_discarded() && pj.contains("conv_bwd_ms");
  std::printf("# bench/ops: %d threads, median of %d runs", threads, reps);
  if (have_peer)
    std::printf("; peer PyTorch %s, %d threads, libblas.so.3 -> %s\n",
                pj["torch"].get<std::string>().c_str(), pj["threads"].get<int>(),
                pj["blas"].get<std::string>().c_str());
  else
    std::printf("; peer unavailable (%s)\n", peer_out.c_str());
  const char* names[4] = {"matmul 1024^3 fwd", "matmul 1024^3 bwd",
                          "conv2d 64x32x28x28 3x3->64 fwd", "conv2d 64x32x28x28 3x3->64 bwd"};
  const char* keys[4] = {"matmul_fwd_ms", "matmul_bwd_ms", "conv_fwd_ms", "conv_bwd_ms"};
  double flops[4] = {2.0 * 1024 * 1024 * 1024, 4.0 * 1024 * 1024 * 1024,
                     2.0 * 64 * 64 * 28 * 28 * 32 * 9, 4.0 * 64 * 64 * 28 * 28 * 32 * 9};
  std::printf(
      "| op | shoal ms | shoal GFLOP/s | pytorch ms | ratio (pytorch/shoal) "
      "|\n|---|---|---|---|---|\n");
  for (int i = 0; i < 4; ++i) {
    double peer = have_peer ? pj[keys[i]].get<double>() : 0;
    std::printf("| %s | %.2f | %.1f | %s | %s |\n", names[i], ms[i], flops[i] / ms[i] / 1e6,
                have_peer ? fmt::format("{:.2f}", peer).c_str() : "-",
                have_peer ? fmt::format("{:.2f}x", peer / ms[i]).c_str() : "-");
  }
  return 0;
}
