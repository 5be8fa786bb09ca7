// The CPU executable: binding, arena reuse, async nodes, trace output,
// constant folding, activation fusion and run-time errors that name nodes.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"

namespace shoal::runtime {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

std::unique_ptr<Executable> compile(Graph& g, CompileOptions o = {}) {
  auto exe = (*make_backend("cpu"))->compile(g, o);
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  return exe.ok() ? std::move(exe).value() : nullptr;
}

TEST(CpuBackend, BindChecksNamesTypesAndShapes) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {2, 3});
  g.mark_output(b.relu(x));
  auto exe = compile(g);
  ASSERT_TRUE(exe);
  EXPECT_EQ(exe->run().code(), StatusCode::kFailedPrecondition);
  Status st = exe->bind("x", Tensor::empty({3, 2}, DType::kF32));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("f32[2, 3]"), std::string::npos);
  EXPECT_NE(st.message().find("[3, 2]"), std::string::npos);
  EXPECT_EQ(exe->bind("y", Tensor::empty({2, 3}, DType::kF32)).code(), StatusCode::kNotFound);
  Tensor in = Tensor::from_vector<float>({-1, 2, -3, 4, -5, 6}, {2, 3});
  ASSERT_TRUE(exe->bind("x", in).ok());
  ASSERT_TRUE(exe->run().ok());
  EXPECT_EQ(exe->output(0).to_vector<float>(), (std::vector<float>{0, 2, 0, 4, 0, 6}));
  EXPECT_FALSE((*make_backend("cpu"))->compile(Graph(), {}).ok());
  EXPECT_FALSE(make_backend("tpu").ok());
}

TEST(CpuBackend, RunTimeErrorNamesTheNode) {
  Graph g;
  Builder b(g);
  Value logits = b.input("logits", DType::kF32, {2, 3});
  Value labels = b.input("labels", DType::kI32, {2});
  g.mark_output(b.op("cross_entropy", {logits, labels}, {}, "loss"));
  auto exe = compile(g);
  Executor ex(*exe);
  auto r = ex.run({{"logits", Tensor::empty({2, 3}, DType::kF32)},
                   {"labels", Tensor::from_vector<std::int32_t>({1, 7}, {2})}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'loss'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("label/index 7 at position 1"), std::string::npos);
}

TEST(CpuBackend, ConstantFoldingAndFusion) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {4, 3});
  Value w = b.constant(Tensor::full({2, 3}, DType::kF32, 0.5));
  Value w2 = b.mul(w, b.scalar(2.0));  // foldable
  Value y = b.relu(b.linear(x, w2));
  g.mark_output(y);
  auto exe = compile(g);
  auto impls = exe->kernel_impls();
  EXPECT_EQ(impls.count("mul"), 0u) << "constant mul was not folded";
  EXPECT_EQ(impls.count("relu"), 0u) << "relu was not fused into linear";
  Executor ex(*exe);
  auto out = ex.run({{"x", Tensor::from_vector<float>({1, 1, 1, -1, -1, -1, 2, 0, 0, 0, 0, 0}, {4, 3})}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].to_vector<float>(), (std::vector<float>{3, 3, 0, 0, 2, 2, 0, 0}));
}

TEST(CpuBackend, ArenaIsSmallerThanNaiveAndStepsAreStable) {
  Graph g;
  Builder b(g);
  Value v = b.input("x", DType::kF32, {256, 256});
  for (int i = 0; i < 8; ++i) v = b.tanh(v);
  g.mark_output(v);
  auto exe = compile(g);
  EXPECT_LT(exe->arena_bytes(), exe->naive_bytes() / 2);
  ASSERT_TRUE(exe->bind("x", Tensor::full({256, 256}, DType::kF32, 0.3)).ok());
  ASSERT_TRUE(exe->run().ok());
  const void* p = exe->output(0).raw_data();
  ASSERT_TRUE(exe->run().ok());
  EXPECT_EQ(exe->output(0).raw_data(), p);  // same arena slot every step
  EXPECT_EQ(exe->steps(), 2u);
}

// A real async kernel: doubles its input on a worker thread.
class AsyncDouble final : public Kernel {
 public:
  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    const float* x = in[0].data<float>();
    float* y = out[0].data<float>();
    std::int64_t n = in[0].numel();
    fut_ = std::async(std::launch::async, [=] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (std::int64_t i = 0; i < n; ++i) y[i] = 2 * x[i];
    });
    return ok_status();
  }
  bool is_async() const override { return true; }
  Status wait(Deadline d) override {
    if (fut_.wait_for(d.remaining()) != std::future_status::ready) return deadline_exceeded("async_double");
    fut_.get();
    return ok_status();
  }

 private:
  std::future<void> fut_;
};

TEST(CpuBackend, AsyncNodeOverlapsAndConsumersWait) {
  static bool registered = [] {
    graph::OpDef d;
    d.name = "test_async_double";
    d.infer = [](const graph::Node&, const std::vector<graph::TensorType>& in) {
      return Result<std::vector<graph::TensorType>>(in);
    };
    graph::OpRegistry::global().add(d);
    KernelRegistry::cpu().add("test_async_double", [](const graph::Node&, const std::vector<graph::TensorType>&) {
      return Result<std::unique_ptr<Kernel>>(std::make_unique<AsyncDouble>());
    });
    return true;
  }();
  ASSERT_TRUE(registered);
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {1000});
  Value d = b.op("test_async_double", {x});
  Value other = b.exp(x);  // independent work between start and wait
  Value y = b.add(d, other);
  g.mark_output(y);
  auto exe = compile(g);
  exe->enable_trace(true);
  Executor ex(*exe);
  for (int rep = 0; rep < 3; ++rep) {
    auto out = ex.run({{"x", Tensor::full({1000}, DType::kF32, 1.0)}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_FLOAT_EQ((*out)[0].get(999), 2.0f + std::exp(1.0f));
  }
  bool saw_wait = false;
  for (const TraceEvent& e : exe->trace()) saw_wait = saw_wait || (std::string(e.name) == "wait" && e.lane == 1);
  EXPECT_TRUE(saw_wait);
  std::string path = testing::TempDir() + "/trace.json";
  ASSERT_TRUE(ex.write_trace(path).ok());
  std::ifstream f(path);
  auto j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_GE(j["traceEvents"].size(), 9u);
}

TEST(CpuBackend, DropoutMaskDependsOnStepAndIsReplayable) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {4096});
  g.mark_output(b.dropout(x, 0.25, 5));
  auto exe = compile(g);
  Executor ex(*exe);
  std::map<std::string, Tensor> feeds = {{"x", Tensor::full({4096}, DType::kF32, 1.0)}};
  auto a = ex.run(feeds);
  auto c = ex.run(feeds);
  exe->set_step(0);
  auto a2 = ex.run(feeds);
  EXPECT_EQ(a->at(0).to_vector<float>(), a2->at(0).to_vector<float>());
  EXPECT_NE(a->at(0).to_vector<float>(), c->at(0).to_vector<float>());
  int zeros = 0;
  for (float v : a->at(0).to_vector<float>()) {
    zeros += v == 0;
    if (v != 0) {
      EXPECT_FLOAT_EQ(v, 1.0f / 0.75f);
    }
  }
  EXPECT_NEAR(zeros / 4096.0, 0.25, 0.03);
}

}  // namespace
}  // namespace shoal::runtime
