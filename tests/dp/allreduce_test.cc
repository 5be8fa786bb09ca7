// Data parallelism as a graph pass: N ranks (threads, real TCP/shm
// communicators) each train on their shard of a global batch with bucketed
// all-reduce(avg) injected between autodiff and the SGD update; after k
// steps every rank's weights equal one process training on the whole batch.
#include "shoal/dp/allreduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "ranks.h"
#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/net/store.h"
#include "shoal/runtime/backend.h"
#include "shoal/tensor/philox.h"

namespace shoal::dp {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

constexpr std::int64_t kIn = 8, kHidden = 16, kOut = 4;
const std::vector<std::pair<std::string, Shape>> kParams = {
    {"w1", {kHidden, kIn}}, {"b1", {kHidden}}, {"w2", {kOut, kHidden}}, {"b2", {kOut}}};

// Trains `steps` SGD steps on rows [first, first+rows) of a fixed global batch.
struct RankRun {
  std::map<std::string, Tensor> params;
  std::vector<std::string> trace;  // op names of the last step, in run order (lane 0)
  BucketPlan plan;
  std::string bucket_impl;  // kernel_impls() of allreduce_bucket
};

Result<RankRun> train(std::int64_t first, std::int64_t rows, int steps, std::int64_t comm_id,
                      const DpOptions& dpo = {}) {
  RankRun res;
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {rows, kIn});
  Value y = b.input("y", DType::kI32, {rows});
  std::vector<Value> ps;
  for (const auto& [n, s] : kParams) ps.push_back(b.input(n, DType::kF32, s));
  Value loss = b.cross_entropy(b.linear(b.relu(b.linear(x, ps[0], ps[1])), ps[2], ps[3]), y);
  SHOAL_ASSIGN_OR_RETURN(auto grads, graph::autodiff(g, loss, ps));
  std::vector<train::ParamRef> refs;
  for (std::size_t i = 0; i < ps.size(); ++i) refs.push_back({kParams[i].first, ps[i], grads[i]});
  if (comm_id >= 0) {
    SHOAL_ASSIGN_OR_RETURN(res.plan, inject_allreduce(g, refs, comm_id, dpo));
  }
  train::OptimizerOptions oo;
  oo.name = "sgd";
  SHOAL_ASSIGN_OR_RETURN(auto og, train::append_optimizer(b, oo, refs));
  for (Value v : og.new_params) g.mark_output(v);
  SHOAL_ASSIGN_OR_RETURN(auto be, runtime::make_backend("cpu"));
  SHOAL_ASSIGN_OR_RETURN(auto exe, be->compile(std::move(g), {}));
  // The same global data and initial weights on every rank.
  PhiloxRng rng(3, 0);
  Tensor gx = Tensor::empty({24, kIn}, DType::kF32);
  rng.fill_normal(gx, 0, 1);
  std::map<std::string, Tensor> feeds;
  Tensor xs = Tensor::empty({rows, kIn}, DType::kF32), ys = Tensor::empty({rows}, DType::kI32);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < kIn; ++c)
      xs.data<float>()[r * kIn + c] = gx.data<float>()[(first + r) * kIn + c];
    ys.data<std::int32_t>()[r] = static_cast<std::int32_t>((first + r) % kOut);
  }
  feeds["x"] = xs;
  feeds["y"] = ys;
  feeds["lr"] = Tensor::scalar(0.3);
  for (std::size_t i = 0; i < kParams.size(); ++i) {
    Tensor t = Tensor::empty(kParams[i].second, DType::kF32);
    PhiloxRng(7, 100 + i).fill_normal(t, 0, 0.5);
    feeds[kParams[i].first] = t;
  }
  runtime::Executor ex(*exe);
  exe->enable_trace(true);
  for (int s = 0; s < steps; ++s) {
    SHOAL_ASSIGN_OR_RETURN(auto out, ex.run(feeds));
    for (std::size_t i = 0; i < kParams.size(); ++i) feeds[kParams[i].first] = out[i];
  }
  for (const auto& [n, s] : kParams) res.params[n] = feeds[n];
  for (const auto& e : exe->trace())
    if (e.lane == 0) res.trace.push_back(e.name);
  res.bucket_impl = exe->kernel_impls()["allreduce_bucket"];
  return res;
}

// Runs `world` ranks (threads) on equal shards of the 24-row batch.
std::vector<Result<RankRun>> train_ranks(int world, const DpOptions& dpo, int steps = 4) {
  comm::CommOptions o = testing::test_comm_options();
  o.deterministic = true;
  return testing::run_on_ranks<RankRun>(
      world, "dp",
      [&](int r, comm::Communicator& c) -> Result<RankRun> {
        std::int64_t id =
            collective::register_communicator(&c, dpo.overlap != DpOptions::Overlap::kOff);
        std::int64_t rows = 24 / world;
        return train(r * rows, rows, steps, id, dpo);
      },
      o);
}

void expect_near(const RankRun& got, const RankRun& want, double tol, const std::string& what) {
  for (const auto& [n, t] : want.params) {
    const Tensor& u = got.params.at(n);
    for (std::int64_t i = 0; i < t.numel(); ++i)
      ASSERT_NEAR(u.data<float>()[i], t.data<float>()[i], tol)
          << what << " param " << n << " element " << i;
  }
}

TEST(DataParallel, NRanksEqualOneRankOnTheWholeBatch) {
  auto ref = train(0, 24, 4, -1);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  // One bucket for everything, and a bucket per tensor (tiny caps); the
  // last runs each bucket on the compute thread (no overlap).
  DpOptions one, many, inline_many;
  many.bucket_mb = many.first_bucket_mb = 1e-6;
  inline_many = many;
  inline_many.overlap = DpOptions::Overlap::kOff;
  for (int world : {2, 3, 4}) {
    for (const DpOptions* dpo : {&one, &many, &inline_many}) {
      std::string what = fmt::format("world {} bucket cap {} MiB{}", world, dpo->bucket_mb,
                                     dpo == &inline_many ? ", no overlap" : "");
      SCOPED_TRACE(what);
      auto got = train_ranks(world, *dpo);
      for (int r = 0; r < world; ++r) {
        const auto& g = got[static_cast<std::size_t>(r)];
        ASSERT_TRUE(g.ok()) << g.status().to_string();
        EXPECT_EQ(g->plan.buckets.size(), dpo == &one ? 1u : kParams.size());
        // f32 buckets are reduced in place where the memory planner put the
        // gradients back to back (the four-gradient bucket) or the output
        // over its gradient (one-tensor buckets).
        EXPECT_EQ(g->bucket_impl, "comm, in place");
        expect_near(*g, *ref, 1e-5, fmt::format("rank {}", r));
        // Every rank holds bit-identical weights.
        if (r == 0) continue;
        for (const auto& [n, t] : g->params)
          ASSERT_EQ(0, std::memcmp(t.raw_data(), got[0]->params.at(n).raw_data(), t.nbytes()))
              << "rank " << r << " differs from rank 0 in " << n;
      }
    }
  }
}

// The first bucket is small and starts before the backward pass ends: the
// executor runs the all-reduce as soon as its gradients exist.
TEST(DataParallel, FirstBucketStartsBeforeBackwardEnds) {
  DpOptions dpo;
  dpo.first_bucket_mb = 1e-6;  // just the first gradient
  auto got = train_ranks(2, dpo, 1);
  ASSERT_TRUE(got[0].ok()) << got[0].status().to_string();
  const RankRun& r = *got[0];
  ASSERT_GE(r.plan.buckets.size(), 2u);
  EXPECT_EQ(r.plan.buckets[0].params.size(), 1u);
  auto first = std::find(r.trace.begin(), r.trace.end(), "allreduce_bucket");
  ASSERT_NE(first, r.trace.end());
  // Some backward compute (not an update, not a wait, not another bucket) runs after it.
  bool compute_after = false;
  for (auto it = first + 1; it != r.trace.end(); ++it)
    compute_after |=
        *it != "wait" && *it != "allreduce_bucket" && it->find("_update") == std::string::npos;
  EXPECT_TRUE(compute_after) << fmt::format("{}", fmt::join(r.trace, " "));
}

// Half-precision gradients on the wire: close to f32 (not equal: the wire
// really is narrower).
TEST(DataParallel, HalfPrecisionWire) {
  auto ref = train(0, 24, 4, -1);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (auto [wire, tol] : {std::pair{DType::kF16, 2e-3}, std::pair{DType::kBF16, 1e-2}}) {
    SCOPED_TRACE(dtype_name(wire));
    DpOptions dpo;
    dpo.wire = wire;
    auto got = train_ranks(3, dpo);
    ASSERT_TRUE(got[1].ok()) << got[1].status().to_string();
    expect_near(*got[1], *ref, tol, "rank 1");
    EXPECT_EQ(got[1]->bucket_impl, "comm");  // packs and converts through its wire buffer
    bool differs = false;
    for (const auto& [n, t] : ref->params)
      differs |= std::memcmp(t.raw_data(), got[1]->params.at(n).raw_data(), t.nbytes()) != 0;
    EXPECT_TRUE(differs) << "the half-precision wire left no trace";
  }
}

TEST(DataParallel, OptionsAreChecked) {
  DpOptions o;
  o.bucket_mb = 0;
  EXPECT_NE(validate(o).message().find("--bucket-mb"), std::string::npos);
  o = {};
  o.wire = DType::kI32;
  EXPECT_NE(validate(o).message().find("--wire"), std::string::npos);
}

// The op's gradient rule (all-reduce of dy), checked on one rank where the
// op is the identity: d/dx sum(ar(x) * c) = c, d/dx2 sum(ar(x2)^2) = 2 x2.
TEST(DataParallel, AllreduceGradientIsAllreduceOfDy) {
  collective::register_ops();
  auto c = testing::one_rank_communicator();
  ASSERT_TRUE(c.ok());
  std::int64_t id = collective::register_communicator(c->get());
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {5});
  Value cst = b.constant(Tensor::from_vector<float>({1, -2, 3, 0.5f, 7}, {5}));
  Value x2 = b.input("x2", DType::kF32, {2});
  Value ar = b.op("allreduce_bucket", {x, x2}, {{"comm", id}, {"op", std::string("avg")}});
  Value ar2{ar.node, 1};
  Value loss = b.add(b.reduce_sum(b.mul(ar, cst), {0}), b.reduce_sum(b.mul(ar2, ar2), {0}));
  auto grads = graph::autodiff(g, loss, {x, x2});
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  g.mark_output((*grads)[0]);
  g.mark_output((*grads)[1]);
  auto be = runtime::make_backend("cpu");
  auto exe = (*be)->compile(std::move(g), {});
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  runtime::Executor ex(**exe);
  auto out = ex.run({{"x", Tensor::from_vector<float>({0, 1, 2, 3, 4}, {5})},
                     {"x2", Tensor::from_vector<float>({1.5f, -2}, {2})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].to_vector<float>(), (std::vector<float>{1, -2, 3, 0.5f, 7}));
  EXPECT_EQ((*out)[1].to_vector<float>(), (std::vector<float>{3, -4}));
}

// A bucket reading another bucket's output (sequence parallelism's sum of
// parameter gradients over the tensor group, then data parallelism's
// average): the first one's outputs share its packed inputs' bytes, so they
// cannot be packed again; the memory plan once threw out_of_range here.
TEST(DataParallel, ABucketOfAnotherBucketsOutputsCompilesAndRuns) {
  collective::register_ops();
  auto c = testing::one_rank_communicator();
  ASSERT_TRUE(c.ok());
  std::int64_t id = collective::register_communicator(c->get(), false);
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {3});
  Value two = b.constant(Tensor::from_vector<float>({2, 2, 2}, {3}));
  Value a = b.mul(x, two), d = b.add(x, two);
  Value first = b.op("allreduce_bucket", {a, d}, {{"comm", id}, {"op", std::string("sum")}});
  Value e = b.sub(x, two);
  Value second = b.op("allreduce_bucket", {first, Value{first.node, 1}, e},
                      {{"comm", id}, {"op", std::string("avg")}});
  for (int i = 0; i < 3; ++i) g.mark_output(Value{second.node, i});
  auto be = runtime::make_backend("cpu");
  auto exe = (*be)->compile(std::move(g), {});
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  runtime::Executor ex(**exe);
  auto out = ex.run({{"x", Tensor::from_vector<float>({1, -1, 0.5f}, {3})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].to_vector<float>(), (std::vector<float>{2, -2, 1}));
  EXPECT_EQ((*out)[1].to_vector<float>(), (std::vector<float>{3, 1, 2.5f}));
  EXPECT_EQ((*out)[2].to_vector<float>(), (std::vector<float>{-1, -3, -1.5f}));
}

// Eight layers of 8x8 + 8 (576 gradient elements), none big enough to
// close a bucket of its own: with overlap, no bucket holds more than a
// quarter of them (DDP's 25 MiB cap put all but the first bucket's in one,
// sent only after the whole backward pass; docs/data-parallel.md).
TEST(DataParallel, NoBucketHoldsMoreThanAQuarterOfTheGradients) {
  collective::register_ops();
  auto c = testing::one_rank_communicator();
  ASSERT_TRUE(c.ok());
  const std::int64_t id = collective::register_communicator(c->get(), true);
  Graph g;
  Builder b(g);
  Value h = b.input("x", DType::kF32, {2, 8});
  std::vector<Value> ps;
  for (int l = 0; l < 8; ++l) {
    ps.push_back(b.input(fmt::format("w{}", l), DType::kF32, {8, 8}));
    ps.push_back(b.input(fmt::format("b{}", l), DType::kF32, {8}));
    h = b.tanh(b.linear(h, ps[ps.size() - 2], ps.back()));
  }
  auto grads = graph::autodiff(g, b.reduce_sum(h, {0, 1}), ps);
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  std::vector<train::ParamRef> refs;
  for (std::size_t i = 0; i < ps.size(); ++i)
    refs.push_back({fmt::format("p{}", i), ps[i], (*grads)[i]});
  DpOptions o;
  o.first_bucket_mb = 100.0 * 4 / (1 << 20);  // 100 elements
  auto plan = inject_allreduce(g, refs, id, o);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  std::int64_t total = 0, most = 0;
  for (const auto& bk : plan->buckets) {
    total += bk.elements;
    most = std::max(most, bk.elements);
  }
  EXPECT_EQ(total, 8 * 72);
  EXPECT_LE(most, 8 * 72 / 4);
  EXPECT_GE(plan->buckets.size(), 4u);
}

TEST(DataParallel, UnknownCommunicatorIsRefused) {
  Graph g;
  Builder b(g);
  Value p = b.input("p", DType::kF32, {3});
  std::vector<train::ParamRef> refs{{"p", p, p}};
  Status st = inject_allreduce(g, refs, 999).status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("999"), std::string::npos);
}

}  // namespace
}  // namespace shoal::dp
