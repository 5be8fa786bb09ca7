// Tensor parallelism as a graph rewrite (mp/tensor_parallel.h) on the GPT:
// the plan found in its forward graph (per block, attention's q, k, v ->
// proj and the MLP's fc -> proj), and T ranks (threads with real
// communicators), each running the rewritten graph with its slices of the
// parameters, compute the loss and, through autodiff, gradients equal to
// one process with the whole parameters, at T = 2, 3 and 4.
#include "shoal/mp/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "ranks.h"
#include "shoal/collective/registry.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/passes.h"
#include "shoal/net/store.h"
#include "shoal/runtime/backend.h"
#include "shoal/train/model.h"

namespace shoal::mp {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

std::int64_t kBatch = 3;  // 12 for sequence parallelism (divisible by 2, 3 and 4)
constexpr int kVocab = 7;

struct Step {
  double loss = 0;
  std::map<std::string, Tensor> grads;  // by parameter name
  TpPlan plan;
};

train::GptConfig config(int heads) {
  train::GptConfig c;
  c.layers = 2;
  c.heads = heads;
  c.dim = 2 * heads;  // head size 2; MLP hidden 8 * heads
  c.context = 5;
  return c;
}

// Loss and gradients of the GPT on a fixed batch; with comm_id >= 0, after
// the tensor-parallel rewrite for this rank of that group.
Result<Step> step(const train::GptConfig& c, std::int64_t comm_id, int rank, int size,
                  bool sequence = false) {
  SHOAL_ASSIGN_OR_RETURN(train::Model model, train::gpt_model(c, kVocab));
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {kBatch, c.context});
  Value y = b.input("y", DType::kI32, {kBatch * c.context});
  train::ModelContext mc(b, true);
  Value loss = b.cross_entropy(model.forward(mc, x), y);
  if (!b.ok()) return b.status();
  g.mark_output(loss);
  Step out;
  if (comm_id >= 0) {
    SHOAL_ASSIGN_OR_RETURN(out.plan, plan_tensor_parallel(g, size));
    SHOAL_RETURN_IF_ERROR(shard_tensor_parallel(g, out.plan, comm_id));
    if (sequence) {
      std::vector<std::string> refused;
      SHOAL_ASSIGN_OR_RETURN(int split, shard_sequence(g, comm_id, &refused));
      // The residual stream from the embedding to the head; the loss reads
      // the head's columns (vocabulary-parallel), its whole logits are dead.
      if (split != 1 || !refused.empty())
        return internal_error("sequence parallelism split {} regions, refused: {}", split,
                              fmt::join(refused, "; "));
    }
  }
  std::vector<Value> wrt;
  for (const auto& s : mc.params()) wrt.push_back(mc.param_values().at(s.name));
  SHOAL_ASSIGN_OR_RETURN(auto grads, graph::autodiff(g, loss, wrt));
  for (Value v : grads) g.mark_output(v);
  SHOAL_ASSIGN_OR_RETURN(auto be, runtime::make_backend("cpu"));
  SHOAL_ASSIGN_OR_RETURN(auto exe, be->compile(std::move(g), {}));
  std::map<std::string, Tensor> feeds;
  auto params = train::init_params(mc.params(), 11);
  for (auto& [name, t] : params) {
    feeds["param/" + name] = t;
    for (const auto& s : out.plan.shards)
      if (s.input == "param/" + name) feeds["param/" + name] = tp_slice(t, s, rank, size);
  }
  Tensor xs = Tensor::empty({kBatch, c.context}, DType::kF32);
  Tensor ys = Tensor::empty({kBatch * c.context}, DType::kI32);
  for (std::int64_t i = 0; i < xs.numel(); ++i) {
    xs.data<float>()[i] = static_cast<float>((i * 3 + 1) % kVocab);
    ys.data<std::int32_t>()[i] = static_cast<std::int32_t>((i * 5 + 2) % kVocab);
  }
  feeds["x"] = xs;
  feeds["y"] = ys;
  runtime::Executor ex(*exe);
  SHOAL_ASSIGN_OR_RETURN(auto res, ex.run(feeds));
  out.loss = res[0].data<float>()[0];
  for (std::size_t i = 0; i < mc.params().size(); ++i)
    out.grads[mc.params()[i].name] = res[i + 1].clone();
  return out;
}

std::vector<Result<Step>> run_group(const train::GptConfig& c, int size, bool sequence = false) {
  return testing::run_on_ranks<Step>(size, "tp", [&](int r, comm::Communicator& comm) {
    return step(c, collective::register_communicator(&comm), r, size, sequence);
  });
}

class TensorParallel : public ::testing::TestWithParam<int> {};

void expect_equal_one_process(int size, bool sequence, int heads = 0) {
  if (heads == 0) heads = size == 3 ? 3 : 4;  // heads divisible by T
  const train::GptConfig c = config(heads);
  auto ref = step(c, -1, 0, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto got = run_group(c, size, sequence);
  for (int r = 0; r < size; ++r) {
    SCOPED_TRACE(fmt::format("T = {}, rank {}", size, r));
    const auto& g = got[static_cast<std::size_t>(r)];
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    // Per block: attention (q, k, v -> proj) and the MLP (fc -> proj).
    ASSERT_EQ(g->plan.regions.size(), 4u) << g->plan.str();
    EXPECT_EQ(g->plan.regions[0].columns.size(), 3u) << g->plan.str();
    // ... and the tied token table, read by the lookup and the output head,
    // by vocabulary rows: 20 + 1.
    EXPECT_EQ(g->plan.shards.size(), 21u) << g->plan.str();
    EXPECT_EQ(g->plan.tables, std::vector<std::string>{"param/wte.weight"}) << g->plan.str();
    EXPECT_EQ(g->plan.heads, std::vector<std::string>{"param/wte.weight"}) << g->plan.str();
    EXPECT_NEAR(g->loss, ref->loss, 1e-5 * std::abs(ref->loss));
    int sharded = 0;
    for (const auto& [name, want_full] : ref->grads) {
      Tensor want = want_full;
      for (const auto& s : g->plan.shards)
        if (s.input == "param/" + name) {
          want = tp_slice(want_full, s, r, size);
          ++sharded;
        }
      const Tensor& have = g->grads.at(name);
      ASSERT_EQ(have.shape(), want.shape()) << name;
      double scale = 1e-6;
      for (std::int64_t i = 0; i < want.numel(); ++i)
        scale = std::max(scale, std::abs(static_cast<double>(want.data<float>()[i])));
      for (std::int64_t i = 0; i < want.numel(); ++i)
        ASSERT_NEAR(have.data<float>()[i], want.data<float>()[i], 1e-4 * scale)
            << name << " element " << i;
    }
    EXPECT_EQ(sharded, 21);
  }
}

TEST_P(TensorParallel, LossAndGradientsEqualOneProcess) {
  expect_equal_one_process(GetParam(), false);
}

// Heads that T does not divide: ranks hold whole heads, as evenly as they
// go (3 over 2: 1 and 2; 5 over 3: 1, 2, 2; 6 over 4: 1, 2, 1, 2), and the
// MLP's hidden units the same way.
TEST_P(TensorParallel, HeadsThatTDoesNotDivideSplitByWholeHeads) {
  const int size = GetParam();
  expect_equal_one_process(size, false, size == 2 ? 3 : size == 3 ? 5 : 6);
}

// Sequence parallelism on top: the residual stream, its layer norms and
// adds on 1/T of the rows between reduce-scatters and all-gathers.
TEST_P(TensorParallel, WithSequenceParallelismToo) {
  kBatch = 12;
  expect_equal_one_process(GetParam(), true);
  kBatch = 3;
}

// Megatron's vocabulary-parallel cross-entropy on its own: 6 rows of 7
// logits split 4/3, 3/2/2 or 2/2/2/1 columns (labels in every rank's
// columns, the first and last column among them): the loss, its gradient
// with respect to each rank's columns and the count of rows whose label
// scores highest equal one process's cross_entropy (and argmax) on the
// whole logits.
TEST_P(TensorParallel, VocabularyParallelCrossEntropyEqualsOneProcess) {
  const int size = GetParam();
  constexpr std::int64_t kRows = 6, kCols = 7;
  Tensor logits = Tensor::empty({kRows, kCols}, DType::kF32);
  for (std::int64_t i = 0; i < logits.numel(); ++i)
    logits.data<float>()[i] = static_cast<float>((i * 37 % 23) - 11) * 0.25f;
  const std::vector<std::int32_t> label_v = {0, 6, 3, 2, 5, 1};
  const Tensor labels = Tensor::from_vector<std::int32_t>(label_v, {kRows});
  std::int64_t want_correct = 0;
  for (std::int64_t i = 0; i < kRows; ++i) {
    const float* row = logits.data<float>() + i * kCols;
    want_correct += std::max_element(row, row + kCols) - row == label_v[i];
  }
  // One process: cross_entropy and autodiff on the whole logits.
  Graph g1;
  Builder b1(g1);
  Value x1 = b1.input("x", DType::kF32, {kRows, kCols});
  Value loss1 = b1.cross_entropy(x1, b1.input("y", DType::kI32, {kRows}));
  auto dx1 = graph::autodiff(g1, loss1, {x1});
  ASSERT_TRUE(dx1.ok()) << dx1.status().to_string();
  g1.mark_output(loss1);
  g1.mark_output((*dx1)[0]);
  auto be = runtime::make_backend("cpu");
  auto exe1 = (*be)->compile(std::move(g1), {});
  ASSERT_TRUE(exe1.ok()) << exe1.status().to_string();
  runtime::Executor ex1(**exe1);
  auto want = ex1.run({{"x", logits}, {"y", labels}});
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  struct Out {
    float loss, correct;
    Tensor dx;
  };
  TpShard cols{"logits", 1, {kRows, kCols}, true};  // as a head splits its vocabulary
  auto got =
      testing::run_on_ranks<Out>(size, "vce", [&](int r, comm::Communicator& c) -> Result<Out> {
        register_tensor_parallel_ops();
        const auto [lo, hi] = tp_range(cols, r, size);
        Graph g;
        Builder b(g);
        Value x = b.input("x", DType::kF32, {kRows, hi - lo});
        Value ce = b.op(
            "vocab_parallel_cross_entropy", {x, b.input("y", DType::kI32, {kRows})},
            {{"comm", collective::register_communicator(&c)}, {"offset", lo}, {"vocab", kCols}});
        SHOAL_ASSIGN_OR_RETURN(auto dx, graph::autodiff(g, ce, {x}));
        g.mark_output(ce);
        g.mark_output(Value{ce.node, 2});
        g.mark_output(dx[0]);
        SHOAL_ASSIGN_OR_RETURN(auto bk, runtime::make_backend("cpu"));
        SHOAL_ASSIGN_OR_RETURN(auto exe, bk->compile(std::move(g), {}));
        runtime::Executor ex(*exe);
        SHOAL_ASSIGN_OR_RETURN(auto res,
                               ex.run({{"x", tp_slice(logits, cols, r, size)}, {"y", labels}}));
        return Out{res[0].data<float>()[0], res[1].data<float>()[0], res[2].clone()};
      });
  const Tensor& dx_whole = (*want)[1];
  for (int r = 0; r < size; ++r) {
    SCOPED_TRACE(fmt::format("T = {}, rank {}", size, r));
    const auto& o = got[static_cast<std::size_t>(r)];
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_NEAR(o->loss, (*want)[0].data<float>()[0], 1e-6);
    EXPECT_EQ(o->correct, static_cast<float>(want_correct));
    const Tensor dx = tp_slice(dx_whole, cols, r, size);
    ASSERT_EQ(o->dx.shape(), dx.shape());
    for (std::int64_t i = 0; i < dx.numel(); ++i)
      EXPECT_NEAR(o->dx.data<float>()[i], dx.data<float>()[i], 1e-6) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Groups, TensorParallel, ::testing::Values(2, 3, 4));

TEST(TensorParallelPlan, FewerHeadsThanRanksAreNamed) {
  auto model = train::gpt_model(config(3), kVocab);
  ASSERT_TRUE(model.ok());
  Graph g;
  Builder b(g);
  train::ModelContext mc(b, true);
  Value out = model->forward(mc, b.input("x", DType::kF32, {2, 5}));
  g.mark_output(out);
  auto plan = plan_tensor_parallel(g, 4);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find(
                "splits the sharded axis 1 of [10, 6] into [2, 5, 3, 2]: 3 units that are fewer "
                "than the ranks"),
            std::string::npos)
      << plan.status().to_string();
}

}  // namespace
}  // namespace shoal::mp
