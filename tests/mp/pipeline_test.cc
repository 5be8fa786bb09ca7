// Pipeline parallelism (mp/pipeline.h): the schedules' orders, the cuts'
// balance, and — across real ranks (threads with TCP/shm communicators) —
// each stage's step graph, whose backward sends and receives autodiff
// builds from pp_send/pp_recv's gradient rules: with 2 and 3 stages and 1
// or 3 micro-batches, under GPipe and 1F1B, the loss and every parameter's
// gradient equal one process's on the whole batch.
#include "shoal/mp/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "ranks.h"
#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"

namespace shoal::mp {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

TEST(PipelineSchedule, EveryMicroBatchRunsForwardThenBackwardInOrder) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B})
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 6; ++m)
        for (int st = 0; st < p; ++st) {
          SCOPED_TRACE(fmt::format("{} p={} m={} stage={}",
                                   s == Schedule::kGPipe ? "gpipe" : "1f1b", p, m, st));
          auto order = schedule_order(s, st, p, m);
          ASSERT_EQ(order.size(), static_cast<std::size_t>(2 * m));
          int next_f = 0, next_b = 0, alive = 0, most = 0;
          for (auto [i, fwd] : order) {
            if (fwd) {
              EXPECT_EQ(i, next_f++);
              most = std::max(most, ++alive);
            } else {
              EXPECT_EQ(i, next_b++);
              EXPECT_LT(i, next_f);  // its forward ran
              --alive;
            }
          }
          // Activations held at once: all m under GPipe, at most p - stage under 1F1B.
          EXPECT_EQ(most, s == Schedule::kGPipe ? m : std::min(m, p - st));
        }
}

// Runs every rank's order as ranks would: sends never wait, a forward of
// piece k waits for piece k-1's forward of its micro-batch, a backward for
// piece k+1's backward (the last piece's for its own forward). Returns false
// if some rank waits forever; `alive[s]` gets the most forwards rank s
// holds at once.
bool runs_to_the_end(const std::vector<std::vector<Work>>& order, int chunks, int micro,
                     std::vector<int>& alive) {
  const int p = static_cast<int>(order.size()), pieces = p * chunks;
  std::set<std::tuple<int, int, bool>> done;  // (piece, micro-batch, forward)
  std::vector<std::size_t> next(order.size(), 0);
  std::vector<int> held(order.size(), 0);
  alive.assign(order.size(), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; ++s)
      while (next[s] < order[s].size()) {
        const Work w = order[s][next[s]];
        const int k = w.chunk * p + s;
        const bool ready =
            w.forward ? k == 0 || done.count({k - 1, w.micro, true})
                      : done.count({k == pieces - 1 ? k : k + 1, w.micro, k == pieces - 1});
        if (!ready) break;
        done.insert({k, w.micro, w.forward});
        held[s] += w.forward ? 1 : -1;
        alive[s] = std::max(alive[s], held[s]);
        ++next[s];
        moved = true;
      }
  }
  for (int s = 0; s < p; ++s)
    if (next[s] != order[s].size()) return false;
  return static_cast<int>(done.size()) == 2 * pieces * micro;
}

TEST(PipelineSchedule, InterleavedChunksRunEveryPieceWithoutDeadlock) {
  for (Schedule sc : {Schedule::kGPipe, Schedule::k1F1B})
    for (int p = 2; p <= 4; ++p)
      for (int v = 1; v <= 3; ++v)
        for (int m = p; m <= 3 * p; m += p) {
          SCOPED_TRACE(fmt::format("{} p={} chunks={} m={}",
                                   sc == Schedule::kGPipe ? "gpipe" : "1f1b", p, v, m));
          std::vector<std::vector<Work>> order;
          for (int s = 0; s < p; ++s) {
            order.push_back(stage_work(sc, s, p, m, v));
            ASSERT_EQ(order.back().size(), static_cast<std::size_t>(2 * m * v));
            // Each chunk takes its micro-batches in order, forward and backward.
            std::vector<int> next_f(static_cast<std::size_t>(v), 0), next_b = next_f;
            for (const Work& w : order.back()) {
              auto& n = w.forward ? next_f : next_b;
              EXPECT_EQ(w.micro, n[static_cast<std::size_t>(w.chunk)]++);
            }
          }
          std::vector<int> alive;
          ASSERT_TRUE(runs_to_the_end(order, v, m, alive));
          for (int s = 0; s < p; ++s) {
            // 1F1B holds its warm-up's forwards and one more; GPipe every one.
            const int warm = v == 1   ? std::min(m, p - s - 1) + 1
                             : m == p ? m * v
                                      : std::min(m * v, 2 * (p - s - 1) + (v - 1) * p + 1);
            EXPECT_EQ(alive[static_cast<std::size_t>(s)],
                      sc == Schedule::kGPipe ? m * v : std::min(warm, m * v))
                << "stage " << s;
          }
        }
}

// A chain of linears with relu between: widths 5 -> 9 -> 3 -> 8 -> 6 -> 4,
// so the layers' costs differ. Inputs "x" [rows, 5] and "labels" [rows].
struct Chain {
  Graph g;
  Value loss, logits;
  std::vector<std::string> params;
};
// `deep`: one more linear (6 in all, for 3 stages of 2 chunks).
Chain chain(std::int64_t rows, bool deep = false) {
  const std::vector<std::int64_t> w = deep ? std::vector<std::int64_t>{5, 9, 3, 8, 6, 7, 4}
                                           : std::vector<std::int64_t>{5, 9, 3, 8, 6, 4};
  Chain c;
  Builder b(c.g);
  Value h = b.input("x", DType::kF32, {rows, w[0]});
  Value y = b.input("labels", DType::kI32, {rows});
  for (std::size_t k = 0; k + 1 < w.size(); ++k) {
    const std::string name = fmt::format("l{}.weight", k);
    c.params.push_back(name);
    h = b.linear(h, b.input("param/" + name, DType::kF32, {w[k + 1], w[k]}));
    if (k + 2 < w.size()) h = b.relu(h);
  }
  c.logits = h;
  c.loss = b.cross_entropy(h, y);
  return c;
}

TEST(PipelinePlan, BalancedCutsMinimizeTheLargestStage) {
  Chain c = chain(4);
  for (int p : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("{} stages", p));
    auto plan = plan_pipeline(c.g, {c.loss, c.logits}, p);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    const double best = *std::max_element(plan->stage_cost.begin(), plan->stage_cost.end());
    // Every other choice of cuts is no better.
    const std::size_t n = plan->candidates.size();
    ASSERT_GE(n, static_cast<std::size_t>(p - 1));
    std::vector<std::size_t> idx(static_cast<std::size_t>(p - 1));
    std::function<void(std::size_t, std::size_t)> all = [&](std::size_t k, std::size_t from) {
      if (k == idx.size()) {
        auto other = plan_pipeline(c.g, {c.loss, c.logits}, p, idx);
        ASSERT_TRUE(other.ok()) << other.status().to_string();
        EXPECT_GE(*std::max_element(other->stage_cost.begin(), other->stage_cost.end()), best);
        return;
      }
      for (std::size_t j = from; j < n; ++j) {
        idx[k] = j;
        all(k + 1, j + 1);
      }
    };
    all(0, 0);
    double sum = 0;
    for (double x : plan->stage_cost) sum += x;
    EXPECT_NEAR(sum, plan->total_cost, 1e-6 * plan->total_cost);
  }
  EXPECT_FALSE(plan_pipeline(c.g, {c.loss, c.logits}, 3, {2, 1}).ok());
  EXPECT_FALSE(plan_pipeline(c.g, {c.loss, c.logits}, 40).ok());
}

// Interleaved stages: the cuts minimize the schedule's estimated step,
// micro x the largest sum of a rank's pieces + (ranks - 1) x the largest
// piece, over every choice that leaves a parameter in each piece.
TEST(PipelinePlan, InterleavedCutsBalanceEachRanksSumOfPieces) {
  Chain c = chain(4, true);
  const int micro = 4;
  auto step = [&](const PipelinePlan& p, int ranks) {
    std::vector<double> sums(static_cast<std::size_t>(ranks), 0);
    for (std::size_t k = 0; k < p.stage_cost.size(); ++k) sums[k % sums.size()] += p.stage_cost[k];
    return micro * *std::max_element(sums.begin(), sums.end()) +
           (ranks - 1) * *std::max_element(p.stage_cost.begin(), p.stage_cost.end());
  };
  for (auto [ranks, pieces] : std::vector<std::pair<int, int>>{{2, 4}, {2, 6}, {3, 6}}) {
    SCOPED_TRACE(fmt::format("{} ranks, {} pieces", ranks, pieces));
    auto plan = plan_pipeline(c.g, {c.loss, c.logits}, pieces, {}, {ranks, micro});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    ASSERT_TRUE(stage_params(c.g, *plan).ok());
    const double best = step(*plan, ranks);
    int others = 0;
    std::vector<std::size_t> idx(static_cast<std::size_t>(pieces - 1));
    std::function<void(std::size_t, std::size_t)> all = [&](std::size_t k, std::size_t from) {
      if (k == idx.size()) {
        auto other = plan_pipeline(c.g, {c.loss, c.logits}, pieces, idx);
        ASSERT_TRUE(other.ok()) << other.status().to_string();
        if (!stage_params(c.g, *other).ok()) return;  // a piece without a parameter
        ++others;
        EXPECT_GE(step(*other, ranks), best * (1 - 1e-12))
            << fmt::format("{}", fmt::join(idx, ","));
        return;
      }
      for (std::size_t j = from; j < plan->candidates.size(); ++j) {
        idx[k] = j;
        all(k + 1, j + 1);
      }
    };
    all(0, 0);
    EXPECT_GT(others, 1);
  }
}

Tensor values(const Shape& s, float seed) {
  std::vector<float> v(static_cast<std::size_t>(num_elements(s)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = 0.5f * std::sin(seed + 0.7f * static_cast<float>(i));
  return Tensor::from_vector(v, s);
}

constexpr std::int64_t kBatch = 6;

std::map<std::string, Tensor> feeds(const Graph& g) {
  std::map<std::string, Tensor> f;
  std::vector<std::int32_t> labels(kBatch);
  for (std::int64_t i = 0; i < kBatch; ++i) labels[static_cast<std::size_t>(i)] = (i * 3) % 4;
  auto put = [&](const std::string& name, Tensor t) {
    if (g.find_input(name).ok()) f[name] = std::move(t);
  };
  put("x", values({kBatch, 5}, 0.3f));
  put("labels", Tensor::from_vector(labels, {kBatch}));
  for (const int id : g.input_nodes()) {
    const graph::Node& n = g.node(id);
    if (n.name.starts_with("param/"))
      f[n.name] = values(n.outputs[0].shape, static_cast<float>(n.name.size()) + n.name[7]);
  }
  return f;
}

// Loss and gradients in params order: one process, the whole batch.
Result<std::vector<Tensor>> one_process(bool deep = false) {
  Chain c = chain(kBatch, deep);
  std::vector<Value> wrt;
  for (const auto& p : c.params) {
    SHOAL_ASSIGN_OR_RETURN(Value v, c.g.find_input("param/" + p));
    wrt.push_back(v);
  }
  SHOAL_ASSIGN_OR_RETURN(auto grads, graph::autodiff(c.g, c.loss, wrt));
  c.g.mark_output(c.loss);
  for (Value v : grads) c.g.mark_output(v);
  const auto f = feeds(c.g);
  SHOAL_ASSIGN_OR_RETURN(auto be, runtime::make_backend("cpu"));
  SHOAL_ASSIGN_OR_RETURN(auto exe, be->compile(std::move(c.g), {}));
  runtime::Executor ex(*exe);
  return ex.run(f);
}

// Stage `c.rank()`'s step: its loss and its parameters' gradients by name.
using Named = std::map<std::string, Tensor>;
Result<Named> run_stage(comm::Communicator& c, int micro, Schedule s, int chunks = 1) {
  Chain t = chain(kBatch / micro, chunks * c.size() > 5);
  SHOAL_ASSIGN_OR_RETURN(PipelinePlan plan,
                         plan_pipeline(t.g, {t.loss, t.logits}, c.size() * chunks));
  SHOAL_ASSIGN_OR_RETURN(auto fwd, c.split(0, c.rank()));
  SHOAL_ASSIGN_OR_RETURN(auto bwd, c.split(0, c.rank()));
  StageOptions o;
  o.stage = c.rank();
  o.stages = c.size();
  o.micro_batches = micro;
  o.schedule = s;
  o.chunks = chunks;
  o.fwd_comm = collective::register_communicator(fwd.get(), false);
  o.bwd_comm = collective::register_communicator(bwd.get(), false);
  o.loss_comm = collective::register_communicator(&c, false);
  collective::register_ops();
  SHOAL_ASSIGN_OR_RETURN(StageStep st, build_stage_step(t.g, t.loss, t.logits, plan, o));
  const int first = static_cast<int>(t.g.outputs().size());
  t.g.mark_output(st.loss);
  for (const auto& p : st.params) t.g.mark_output(p.grad);
  const auto f = feeds(t.g);
  SHOAL_ASSIGN_OR_RETURN(auto be, runtime::make_backend("cpu"));
  SHOAL_ASSIGN_OR_RETURN(auto exe, be->compile(std::move(t.g), {}));
  runtime::Executor ex(*exe);
  Named got;
  for (int step = 0; step < 2; ++step) {  // twice: the second reuses the send buffers
    SHOAL_ASSIGN_OR_RETURN(auto out, ex.run(f));
    got["loss"] = out[static_cast<std::size_t>(first)].clone();
    for (std::size_t i = 0; i < st.params.size(); ++i)
      got[st.params[i].name] = out[static_cast<std::size_t>(first) + 1 + i].clone();
  }
  return got;
}

// Every stage's loss equals one process's, and each parameter's gradient,
// found on exactly one stage, equals its one-process gradient.
void expect_equal(const std::vector<Result<Named>>& got, const std::vector<Tensor>& ref,
                  const Chain& names) {
  std::set<std::string> seen;
  for (std::size_t r = 0; r < got.size(); ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status().to_string();
    const Named& g = *got[r];
    EXPECT_NEAR(g.at("loss").data<float>()[0], ref[0].data<float>()[0], 1e-5);
    for (std::size_t k = 0; k < names.params.size(); ++k) {
      auto it = g.find(names.params[k]);
      if (it == g.end()) continue;
      EXPECT_TRUE(seen.insert(it->first).second) << it->first << " on two stages";
      const Tensor& want = ref[k + 1];
      ASSERT_EQ(it->second.shape(), want.shape());
      for (std::int64_t e = 0; e < want.numel(); ++e)
        ASSERT_NEAR(it->second.data<float>()[e], want.data<float>()[e], 1e-5)
            << it->first << " element " << e << " on stage " << r;
    }
  }
  EXPECT_EQ(seen.size(), names.params.size());
}

const char* name(Schedule s) { return s == Schedule::kGPipe ? "gpipe" : "1f1b"; }

TEST(PipelineStages, LossAndGradientsEqualOneProcess) {
  auto ref = one_process();
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (int p : {2, 3})
    for (int micro : {1, 3})
      for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B}) {
        SCOPED_TRACE(fmt::format("{} stages, {} micro-batches, {}", p, micro, name(s)));
        expect_equal(
            testing::run_on_ranks<Named>(
                p, "pp", [&](int, comm::Communicator& c) { return run_stage(c, micro, s); }),
            *ref, chain(1));
      }
}

// Interleaved stages: each rank holds 2 pieces of the chain (rank s pieces
// s and s + p), a micro-batch goes round the ranks twice.
TEST(PipelineStages, InterleavedChunksEqualOneProcess) {
  for (auto [p, micro] : std::vector<std::pair<int, int>>{{2, 2}, {2, 6}, {3, 3}}) {
    const bool deep = 2 * p > 5;
    auto ref = one_process(deep);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B}) {
      SCOPED_TRACE(fmt::format("{} stages x 2 chunks, {} micro-batches, {}", p, micro, name(s)));
      expect_equal(
          testing::run_on_ranks<Named>(
              p, "ppv", [&](int, comm::Communicator& c) { return run_stage(c, micro, s, 2); }),
          *ref, chain(1, deep));
    }
  }
}

}  // namespace
}  // namespace shoal::mp
