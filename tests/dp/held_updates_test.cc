// Updates held until every all-reduce of the step has landed
// (runtime::Executable::hold_writes): what lets an elastic job's survivors
// go on from their live parameters, with no copy kept. Two ranks (threads,
// real communicators) train one step together; in the second, rank 1 takes
// part in the first gradient bucket's all-reduce and leaves. Rank 0's step
// fails in the next bucket: held, it wrote no parameter; not held, the
// first bucket's parameters were already updated (the mutation the hold
// exists for, run here so the test shows it can fail).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "ranks.h"
#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/dp/allreduce.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/tensor/philox.h"
#include "shoal/train/optim.h"

namespace shoal::dp {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

const std::vector<std::pair<std::string, Shape>> kParams = {
    {"w1", {16, 8}}, {"b1", {16}}, {"w2", {4, 16}}, {"b2", {4}}};

// Rank 0's view of the failed second step.
struct Seen {
  Status second;                                // rank 0's second step
  bool held_written = true;                     // whether it reached the updates
  std::vector<std::string> first_bucket;        // the parameters of bucket 0
  std::map<std::string, bool> changed;          // by the failed step
  std::map<std::string, Tensor> after_first;    // after the step both ranks ran
  std::map<std::string, Tensor> after_failure;  // rank 0's bound tensors after it
};

// One rank: a small MLP step, every gradient a bucket of its own (the
// first bucket small), updates written in place over the bound parameters
// as the trainer binds them.
Result<Seen> rank_steps(int rank, comm::Communicator& c, bool hold) {
  const std::int64_t id = collective::register_communicator(&c, true);
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {6, 8});
  Value y = b.input("y", DType::kI32, {6});
  std::vector<Value> ps;
  for (const auto& [n, s] : kParams) ps.push_back(b.input(n, DType::kF32, s));
  Value loss = b.cross_entropy(b.linear(b.relu(b.linear(x, ps[0], ps[1])), ps[2], ps[3]), y);
  SHOAL_ASSIGN_OR_RETURN(auto grads, graph::autodiff(g, loss, ps));
  std::vector<train::ParamRef> refs;
  for (std::size_t i = 0; i < ps.size(); ++i) refs.push_back({kParams[i].first, ps[i], grads[i]});
  DpOptions dpo;
  dpo.first_bucket_mb = 1e-5;  // every gradient closes a bucket of its own
  dpo.bucket_mb = 1e-5;
  SHOAL_ASSIGN_OR_RETURN(BucketPlan plan, inject_allreduce(g, refs, id, dpo));
  if (plan.buckets.size() < 2) return internal_error("want 2+ buckets, got {}", plan.str());
  // The updates in backward order (the last layer's first), so the first
  // update waits only for the first bucket: without the hold it runs while
  // the later buckets are still on the wire. (In a model's own order the
  // first update is the first layer's, whose gradient is in the last
  // bucket, and the others wait behind it by chance, not by rule.)
  std::stable_sort(refs.begin(), refs.end(), [](const auto& p, const auto& q) {
    return p.grad.node < q.grad.node;  // the all-reduce's node: its bucket
  });
  train::OptimizerOptions oo;
  oo.name = "sgd";
  SHOAL_ASSIGN_OR_RETURN(auto og, train::append_optimizer(b, oo, refs));
  for (Value v : og.new_params) g.mark_output(v);
  SHOAL_ASSIGN_OR_RETURN(auto be, runtime::make_backend("cpu"));
  runtime::CompileOptions co;
  for (int i = 0; i < static_cast<int>(kParams.size()); ++i) co.outputs_bound_later.insert(i);
  SHOAL_ASSIGN_OR_RETURN(auto exe, be->compile(std::move(g), co));
  Seen seen;
  seen.first_bucket = plan.buckets[0].params;
  Tensor xs = Tensor::empty({6, 8}, DType::kF32), ys = Tensor::empty({6}, DType::kI32);
  PhiloxRng(3, static_cast<std::uint64_t>(rank)).fill_normal(xs, 0, 1);
  for (int r = 0; r < 6; ++r) ys.data<std::int32_t>()[r] = r % 4;
  SHOAL_RETURN_IF_ERROR(exe->bind("x", xs));
  SHOAL_RETURN_IF_ERROR(exe->bind("y", ys));
  SHOAL_RETURN_IF_ERROR(exe->bind("lr", Tensor::scalar(0.3)));
  std::map<std::string, Tensor> live;
  for (std::size_t i = 0; i < kParams.size(); ++i) {
    Tensor& t = live[kParams[i].first] = Tensor::empty(kParams[i].second, DType::kF32);
    PhiloxRng(7, 100 + i).fill_normal(t, 0, 0.5);
    SHOAL_RETURN_IF_ERROR(exe->bind(kParams[i].first, t));
  }
  for (std::size_t i = 0; i < refs.size(); ++i)
    SHOAL_RETURN_IF_ERROR(exe->bind_output(static_cast<int>(i), live[refs[i].name]));
  if (hold) {
    std::vector<int> outs = {0, 1, 2, 3};
    SHOAL_RETURN_IF_ERROR(exe->hold_writes(outs));
  }
  SHOAL_RETURN_IF_ERROR(exe->run());
  EXPECT_EQ(exe->held_written(), hold);
  for (const auto& [n, t] : live) seen.after_first[n] = t.clone();
  if (rank == 1) {  // the first bucket of the next step, then gone
    std::vector<float> g0(static_cast<std::size_t>(plan.buckets[0].elements), 0.0f);
    SHOAL_RETURN_IF_ERROR(
        c.allreduce(g0.data(), g0.data(), g0.size(), DType::kF32, comm::ReduceOp::kAvg));
    return seen;
  }
  seen.second = exe->run();
  seen.held_written = exe->held_written();
  for (const auto& [n, t] : live) {
    seen.after_failure[n] = t.clone();
    seen.changed[n] = std::memcmp(t.raw_data(), seen.after_first[n].raw_data(), t.nbytes()) != 0;
  }
  return seen;
}

Result<Seen> rank0_after_a_peer_leaves(bool hold) {
  collective::register_ops();
  auto got = testing::run_on_ranks<Seen>(
      2, hold ? "held" : "unheld",
      [&](int r, comm::Communicator& c) { return rank_steps(r, c, hold); });
  if (!got[1].ok()) return got[1].status().with_context("rank 1");
  return got[0];
}

TEST(HeldUpdates, AStepThatFailsInAnAllReduceWritesNoParameter) {
  auto s = rank0_after_a_peer_leaves(true);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_FALSE(s->second.ok()) << "rank 0's second step should fail: its peer left";
  EXPECT_FALSE(s->held_written);
  for (const auto& [n, changed] : s->changed) EXPECT_FALSE(changed) << n;
}

// The mutation: without the hold the same fault leaves the first bucket's
// parameters updated and the others not, a state no step boundary had.
TEST(HeldUpdates, WithoutTheHoldTheFirstBucketIsHalfApplied) {
  auto s = rank0_after_a_peer_leaves(false);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_FALSE(s->second.ok());
  int changed = 0;
  for (const auto& n : s->first_bucket) changed += s->changed.at(n);
  EXPECT_EQ(changed, static_cast<int>(s->first_bucket.size()));
  int unchanged = 0;
  for (const auto& [n, c] : s->changed) unchanged += !c;
  EXPECT_GT(unchanged, 0);
}

// A collective after the first held writer cannot be held behind: refused
// by name (the trainer then keeps copies instead), as is an output no
// node of the graph has.
TEST(HeldUpdates, ACollectiveAfterAHeldWriterIsRefused) {
  collective::register_ops();
  auto c = testing::one_rank_communicator();
  ASSERT_TRUE(c.ok());
  const std::int64_t id = collective::register_communicator(c->get(), true);
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {3});
  Value two = b.constant(Tensor::from_vector<float>({2, 2, 2}, {3}));
  Value a = b.mul(x, two);
  Value r = b.op("allreduce_bucket", {a}, {{"comm", id}, {"op", std::string("sum")}});
  g.mark_output(a);
  g.mark_output(r);
  auto be = runtime::make_backend("cpu");
  auto exe = (*be)->compile(std::move(g), {});
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  Status st = (*exe)->hold_writes({0});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  EXPECT_NE(st.message().find("starts a collective after"), std::string::npos) << st.message();
  EXPECT_FALSE((*exe)->hold_writes({1}).ok());  // a collective's own output: no holding it
  EXPECT_EQ((*exe)->hold_writes({7}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::dp
