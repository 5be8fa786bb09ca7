// The CPU executable: binding, arena reuse, async nodes, trace output,
// constant folding, activation fusion and run-time errors that name nodes.
#include <dlfcn.h>
#include <execinfo.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <new>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/cpu/kernels_internal.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"
#include "shoal/tensor/philox.h"

// The replacement operator new below is malloc-backed, so free() in the
// matching delete is correct; GCC cannot see that across the replacement.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

// Counts operator new calls while armed, to prove steady-state runs do not
// allocate. Calls made from inside libdnnl are counted apart: oneDNN 2.6
// builds an argument map inside every primitive execution, which Shoal
// cannot avoid through its public API.
static std::atomic<bool> g_count_allocs{false};
static std::atomic<long> g_allocs{0};
static std::atomic<long> g_onednn_allocs{0};
static bool called_from_onednn() {
  void* bt[10];
  int k = backtrace(bt, 10);
  for (int i = 1; i < k; ++i) {
    Dl_info info;
    if (dladdr(bt[i], &info) != 0 && info.dli_fname != nullptr &&
        std::strstr(info.dli_fname, "libdnnl") != nullptr)
      return true;
  }
  return false;
}
void* operator new(std::size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed)) {
    g_count_allocs = false;  // backtrace/dladdr must not count themselves
    (called_from_onednn() ? g_onednn_allocs : g_allocs).fetch_add(1);
    g_count_allocs = true;
  }
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
// Every non-aligned form is replaced so new and delete always pair (ASan
// checks that).
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept {
  return ::operator new(n, t);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

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
  auto out =
      ex.run({{"x", Tensor::from_vector<float>({1, 1, 1, -1, -1, -1, 2, 0, 0, 0, 0, 0}, {4, 3})}});
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
    if (fut_.wait_for(d.remaining()) != std::future_status::ready)
      return deadline_exceeded("async_double");
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
    KernelRegistry::cpu().add(
        "test_async_double", [](const graph::Node&, const std::vector<graph::TensorType>&) {
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
  for (const TraceEvent& e : exe->trace())
    saw_wait = saw_wait || (std::string(e.name) == "wait" && e.lane == 0);
  EXPECT_TRUE(saw_wait);
  std::string path = testing::TempDir() + "/trace.json";
  ASSERT_TRUE(ex.write_trace(path).ok());
  std::ifstream f(path);
  auto j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  // The last run only: three kernels and one wait (plus two thread names).
  int spans = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++spans;
    // Each kernel's span names the implementation that ran it; a wait none.
    const std::string cat = e["cat"];
    EXPECT_EQ(e["args"].contains("impl"), cat != "wait") << cat;
    if (cat == "wait") continue;
    EXPECT_EQ(e["args"]["impl"], exe->kernel_impls().at(cat)) << cat;
  }
  EXPECT_EQ(spans, 4);
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

namespace shoal::runtime {
namespace {

TEST(CpuBackend, BindOutputRefusesUnsafeInPlaceWrites) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {4});
  Value a = b.input("a", DType::kF32, {4});
  g.mark_output(b.neg(a));   // output 0: written before relu reads x
  g.mark_output(b.relu(x));  // output 1: relu reads x and is not in-place safe
  auto exe = compile(g);
  ASSERT_TRUE(exe);
  Tensor xt = Tensor::full({4}, DType::kF32, -1), at = Tensor::full({4}, DType::kF32, 2);
  ASSERT_TRUE(exe->bind("x", xt).ok());
  ASSERT_TRUE(exe->bind("a", at).ok());
  Status st = exe->bind_output(0, xt);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("reads it after"), std::string::npos) << st.to_string();
  st = exe->bind_output(1, xt);
  EXPECT_NE(st.message().find("does not work in place"), std::string::npos) << st.to_string();
  EXPECT_FALSE(exe->bind_output(0, Tensor::zeros({5}, DType::kF32)).ok());  // wrong shape
  // A separate buffer is fine, and binding x over it afterwards is refused.
  Tensor o = Tensor::zeros({4}, DType::kF32);
  ASSERT_TRUE(exe->bind_output(0, o).ok());
  ASSERT_TRUE(exe->run().ok());
  EXPECT_EQ(o.data<float>()[2], -2.0f);
  EXPECT_EQ(exe->output(0).raw_data(), o.raw_data());
  EXPECT_FALSE(exe->bind("x", o).ok());
  ASSERT_TRUE(exe->run().ok());
  EXPECT_EQ(exe->output(1).data<float>()[0], 0.0f);  // x untouched: relu(-1)
}

// Outputs the caller will bind (the trainer's new weights and optimizer
// state) cost no arena bytes; one left unbound gets storage of its own at
// the first run, with the right values.
TEST(CpuBackend, OutputsBoundLaterLiveOutsideTheArena) {
  auto build = [](Graph& g) {
    Builder b(g);
    Value w = b.input("w", DType::kF32, {1024});
    Value m = b.input("m", DType::kF32, {1024});
    g.mark_output(b.sub(w, b.mul(m, b.scalar(0.5))));  // 0: new w
    g.mark_output(b.mul(m, b.scalar(0.9)));            // 1: new m
  };
  Graph g1, g2;
  build(g1);
  build(g2);
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.ok());
  auto plain = (*backend)->compile(std::move(g1), {});
  CompileOptions later;
  later.outputs_bound_later = {0, 1};
  auto outside = (*backend)->compile(std::move(g2), later);
  ASSERT_TRUE(plain.ok() && outside.ok());
  EXPECT_GE((*plain)->arena_bytes(), 2 * 1024 * sizeof(float));
  EXPECT_LT((*outside)->arena_bytes(), 2 * 1024 * sizeof(float));  // the 0.5 m temporary only
  Tensor w = Tensor::full({1024}, DType::kF32, 1), m = Tensor::full({1024}, DType::kF32, 2);
  for (auto* e : {plain->get(), outside->get()}) {
    ASSERT_TRUE(e->bind("w", w).ok());
    ASSERT_TRUE(e->bind("m", m).ok());
  }
  Tensor o = Tensor::zeros({1024}, DType::kF32);
  Status st = (*outside)->bind_output(0, o);  // output 1 left unbound
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE((*plain)->run().ok());
  EXPECT_EQ((*plain)->output(0).data<float>()[7], 0.0f);
  ASSERT_TRUE((*outside)->run().ok());
  EXPECT_EQ(o.data<float>()[7], 0.0f);
  EXPECT_EQ((*outside)->output(0).raw_data(), o.raw_data());
  EXPECT_FLOAT_EQ((*outside)->output(1).data<float>()[1023], 1.8f);
  EXPECT_NE((*outside)->output(1).raw_data(), m.raw_data());
}

// A reshape whose input nobody reads afterwards is the same bytes: its
// output is planned over its input and nothing is copied. One whose input
// is read again copies, and both give the same values, step after step.
TEST(CpuBackend, ReshapesAreViewsWhereTheirInputDies) {
  constexpr std::int64_t n = 4096;
  auto build = [](Graph& g, bool reread) {
    Builder b(g);
    Value x = b.input("x", DType::kF32, {n});
    Value a = b.relu(x);
    Value r = b.reshape(a, {64, n / 64});
    Value y = b.mul(r, b.scalar(2.0));
    g.mark_output(reread ? b.add(y, b.reshape(a, {64, n / 64})) : y);
  };
  Graph g1, g2;
  build(g1, false);
  build(g2, true);
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.ok());
  auto view = (*backend)->compile(std::move(g1), {});
  auto copy = (*backend)->compile(std::move(g2), {});
  ASSERT_TRUE(view.ok() && copy.ok());
  Tensor x = Tensor::empty({n}, DType::kF32);
  for (std::int64_t i = 0; i < n; ++i) x.data<float>()[i] = static_cast<float>(i % 7) - 3;
  for (auto* e : {view->get(), copy->get()}) {
    ASSERT_TRUE(e->bind("x", x).ok());
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(e->run().ok());
  }
  EXPECT_EQ((*view)->kernel_impls().at("reshape"), "view");
  EXPECT_EQ((*copy)->kernel_impls().at("reshape"), "copy+view");  // the second one is a view
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = std::max(0.0f, x.data<float>()[i]);
    ASSERT_EQ((*view)->output(0).data<float>()[i], 2 * a) << i;
    ASSERT_EQ((*copy)->output(0).data<float>()[i], 3 * a) << i;
  }
}

// Transposes and concatenations against index arithmetic: perms that
// keep the last axis (whole rows moved, in 64-byte pieces where a row is a
// multiple of 64 bytes, blocks split over threads when large) and ones that
// do not, 4- and 2-byte elements, odd sizes.
TEST(CpuBackend, TransposesAndConcatsMoveEveryElementWhereItBelongs) {
  struct Case {
    Shape shape;
    std::vector<std::int64_t> perm;
    DType dtype;
  };
  const Case cases[] = {
      {{32, 64, 4, 32}, {0, 2, 1, 3}, DType::kF32},   // attention's heads: 128-byte rows
      {{32, 64, 4, 32}, {0, 2, 1, 3}, DType::kBF16},  // 64-byte rows
      {{3, 5, 7, 11}, {0, 2, 1, 3}, DType::kF32},     // rows of 44 bytes
      {{5, 9, 3, 16}, {2, 0, 1, 3}, DType::kBF16},    // 32-byte rows
      {{7, 13, 48}, {1, 0, 2}, DType::kF32},          // 3-D
      {{3, 1, 5, 32}, {0, 2, 1, 3}, DType::kF32},     // a size-1 axis
      {{4, 6, 5}, {2, 0, 1}, DType::kF32},            // the last axis moves
      {{33, 300, 80}, {1, 0, 2}, DType::kF32},        // large: threads share blocks
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} perm {} {}", shape_str(c.shape), fmt::join(c.perm, ","),
                             dtype_name(c.dtype)));
    Graph g;
    Builder b(g);
    Value x = b.input("x", c.dtype, c.shape);
    Value t = b.transpose(x, c.perm);
    // The concat of the transpose with itself along its last axis.
    const auto last = static_cast<std::int64_t>(c.shape.size()) - 1;
    g.mark_output(b.concat({t, t}, last));
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
    ASSERT_TRUE(exe.ok()) << exe.status().to_string();
    Tensor xs = Tensor::empty(c.shape, c.dtype);
    const std::int64_t n = xs.numel();
    for (std::int64_t i = 0; i < n; ++i) xs.set(i, static_cast<double>(i % 251));
    ASSERT_TRUE((*exe)->bind("x", xs).ok());
    ASSERT_TRUE((*exe)->run().ok());
    const Tensor& y = (*exe)->output(0);
    const std::size_t r = c.shape.size();
    Shape ts(r), in_st(r, 1);
    for (std::size_t k = 0; k < r; ++k) ts[k] = c.shape[static_cast<std::size_t>(c.perm[k])];
    for (std::size_t k = r - 1; k > 0; --k) in_st[k - 1] = in_st[k] * c.shape[k];
    const std::int64_t inner = ts[r - 1];
    std::vector<std::int64_t> idx(r, 0);
    for (std::int64_t o = 0; o < n; ++o) {  // o: the transpose's flat index
      std::int64_t src = 0;
      for (std::size_t k = 0; k < r; ++k)
        src += idx[k] * in_st[static_cast<std::size_t>(c.perm[k])];
      const double want = static_cast<double>(src % 251);
      const std::int64_t row = o / inner, col = o % inner;
      ASSERT_EQ(y.get(row * 2 * inner + col), want) << "element " << o;
      ASSERT_EQ(y.get(row * 2 * inner + inner + col), want) << "element " << o << ", second copy";
      for (std::size_t k = r; k-- > 0;) {
        if (++idx[k] < ts[k]) break;
        idx[k] = 0;
      }
    }
  }
}

// Reductions merge neighbouring dims that are both reduced or both kept, and
// long rows go through partial results in lanes (reduce.cc): sums, means,
// maxima and sum_to (a broadcast's gradient) of a [4, 3, 1, 9, 23] tensor over axis sets that make
// rows of 1 to 621 elements, against a loop in double.
TEST(CpuBackend, ReductionsOverMergedDimsMatchALoopInDouble) {
  const Shape shape = {4, 3, 1, 9, 23};
  Tensor xs = Tensor::empty(shape, DType::kF32);
  for (std::int64_t i = 0; i < xs.numel(); ++i) xs.set(i, std::sin(0.37 * i) + 0.01 * (i % 7));
  const std::vector<std::vector<std::int64_t>> axis_sets = {
      {0, 2, 3, 4}, {1}, {3, 4}, {}, {0, 1}, {2}, {0, 3}, {1, 2, 3, 4}, {4}};
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "sum_to"}) {
    for (const auto& axes : axis_sets) {
      SCOPED_TRACE(fmt::format("{} over [{}]", op, fmt::join(axes, ",")));
      std::vector<bool> red(shape.size(), axes.empty());
      for (auto a : axes) red[static_cast<std::size_t>(a)] = true;
      Shape ost(shape.size(), 0);  // output strides of the kept dims
      std::int64_t m = 1;
      for (std::size_t d = shape.size(); d-- > 0;)
        if (!red[d]) ost[d] = m, m *= shape[d];
      const bool max = std::string(op) == "reduce_max";
      std::vector<double> want(static_cast<std::size_t>(m), max ? -1e300 : 0.0);
      for (std::int64_t i = 0; i < xs.numel(); ++i) {
        std::int64_t at = 0, rest = i;
        for (std::size_t d = shape.size(); d-- > 0; rest /= shape[d])
          at += rest % shape[d] * ost[d];
        auto& w = want[static_cast<std::size_t>(at)];
        w = max ? std::max(w, xs.get(i)) : w + xs.get(i);
      }
      if (std::string(op) == "reduce_mean")
        for (double& w : want) w /= static_cast<double>(xs.numel() / m);
      Graph g;
      Builder b(g);
      Shape to = shape;  // sum_to's target: 1 where reduced
      for (std::size_t d = 0; d < shape.size(); ++d)
        if (red[d]) to[d] = 1;
      Value x = b.input("x", DType::kF32, shape);
      g.mark_output(std::string(op) == "sum_to" ? b.sum_to(x, to)
                                                : b.op(op, {x}, {{"axes", axes}}));
      auto exe = compile(g);
      ASSERT_TRUE(exe && exe->bind("x", xs).ok());
      ASSERT_TRUE(exe->run().ok());
      const Tensor& y = exe->output(0);
      ASSERT_EQ(y.numel(), m);
      for (std::int64_t j = 0; j < m; ++j)
        ASSERT_NEAR(y.get(j), want[static_cast<std::size_t>(j)], max ? 0.0 : 1e-4) << j;
    }
  }
}

TEST(CpuBackend, SteadyStateTrainingStepDoesNotAllocate) {
  // A small CNN training step: conv+bias+relu, pool, batch norm, global
  // average pool, linear, cross entropy, and all parameter gradients.
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {8, 3, 12, 12});
  Value labels = b.input("labels", DType::kI32, {8});
  std::vector<std::pair<std::string, Shape>> ps = {{"cw", {16, 3, 3, 3}}, {"cb", {16}},
                                                   {"g", {16}},           {"beta", {16}},
                                                   {"fw", {10, 16}},      {"fb", {10}}};
  std::vector<Value> params;
  for (const auto& [n, s] : ps) params.push_back(b.input(n, DType::kF32, s));
  Value rm = b.constant(Tensor::zeros({16}, DType::kF32)),
        rv = b.constant(Tensor::full({16}, DType::kF32, 1));
  Value h = b.relu(b.conv2d(x, params[0], params[1], {1, 1}, {1, 1}));
  h = b.max_pool2d(h, {2, 2}, {2, 2});
  h = b.batch_norm(h, params[2], params[3], rm, rv, true)[0];
  h = b.dropout(b.global_avg_pool(h), 0.1, 3);
  Value loss = b.cross_entropy(b.linear(h, params[4], params[5]), labels);
  auto grads = graph::autodiff(g, loss, params);
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  g.mark_output(loss);
  for (Value v : *grads) g.mark_output(v);
  auto exe = compile(g);
  ASSERT_TRUE(exe);
  PhiloxRng rng(5, 0);
  for (int id : g.input_nodes()) {
    const auto& t = g.node(id).outputs[0];
    Tensor v = Tensor::empty(t.shape, t.dtype);
    if (t.dtype == DType::kF32) rng.fill_normal(v, 0, 1);
    ASSERT_TRUE(exe->bind(g.node(id).name, v).ok());
  }
  ASSERT_TRUE(exe->run().ok());
  ASSERT_TRUE(exe->run().ok());
  (void)called_from_onednn();  // warm up backtrace's lazy initialisation
  g_allocs = 0;
  g_onednn_allocs = 0;
  g_count_allocs = true;
  Status st = exe->run();
  g_count_allocs = false;
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(g_allocs.load(), 0) << "operator new calls outside oneDNN during a steady-state step";
  std::printf("allocations inside oneDNN's execute during the step: %ld\n", g_onednn_allocs.load());
}

// Nodes too small to be worth waking a second thread for are built and run on
// one under the passive wait (runtime/cpu/op_threads.cc); the limits are the
// node's FLOPs (matmul, convolution) or its largest operand.
TEST(CpuBackend, SmallNodesRunOnOneThread) {
  Graph g;
  Builder b(g);
  auto small_a = b.input("sa", DType::kF32, {64, 128});
  auto small_w = b.input("sw", DType::kF32, {128, 384});
  auto big_a = b.input("ba", DType::kF32, {512, 256});
  auto big_w = b.input("bw", DType::kF32, {256, 256});
  auto small_mm = b.matmul(small_a, small_w);  // 6.3 MFLOP
  auto big_mm = b.matmul(big_a, big_w);        // 67 MFLOP
  auto small_add = b.add(small_a, small_a);    // 8k elements
  auto big_add = b.add(big_mm, big_mm);        // 131k elements
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_TRUE(cpu::small_node(g, g.node(small_mm.node)));
  EXPECT_FALSE(cpu::small_node(g, g.node(big_mm.node)));
  EXPECT_TRUE(cpu::small_node(g, g.node(small_add.node)));
  EXPECT_FALSE(cpu::small_node(g, g.node(big_add.node)));
  const int before = omp_get_max_threads();
  omp_set_num_threads(2);
  {
    cpu::SerialScope one(true);
    EXPECT_EQ(omp_get_max_threads(), 1);
  }
  EXPECT_EQ(omp_get_max_threads(), 2);
  {
    cpu::SerialScope all(false);
    EXPECT_EQ(omp_get_max_threads(), 2);
  }
  omp_set_num_threads(1);
  EXPECT_FALSE(cpu::runs_serial(g, g.node(small_mm.node))) << "one thread: nothing to save";
  omp_set_num_threads(before);
}

}  // namespace
}  // namespace shoal::runtime
