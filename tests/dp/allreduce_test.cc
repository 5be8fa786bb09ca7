// Data parallelism as a graph pass: N ranks (threads, real TCP/shm
// communicators) each train on their shard of a global batch with
// allreduce(avg) injected between autodiff and the SGD update; after k
// steps every rank's weights equal one process training on the whole batch.
#include "shoal/dp/allreduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"
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
Result<std::map<std::string, Tensor>> train(std::int64_t first, std::int64_t rows, int steps,
                                            std::int64_t comm_id) {
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
  if (comm_id >= 0) SHOAL_RETURN_IF_ERROR(inject_allreduce(g, refs, comm_id));
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
  for (int s = 0; s < steps; ++s) {
    SHOAL_ASSIGN_OR_RETURN(auto out, ex.run(feeds));
    for (std::size_t i = 0; i < kParams.size(); ++i) feeds[kParams[i].first] = out[i];
  }
  std::map<std::string, Tensor> res;
  for (const auto& [n, s] : kParams) res[n] = feeds[n];
  return res;
}

TEST(DataParallel, NRanksEqualOneRankOnTheWholeBatch) {
  auto ref = train(0, 24, 4, -1);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    auto srv = net::TcpStoreServer::start("127.0.0.1", 0);
    ASSERT_TRUE(srv.ok());
    std::vector<Status> st(static_cast<std::size_t>(world));
    std::vector<std::map<std::string, Tensor>> got(static_cast<std::size_t>(world));
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r)
      ts.emplace_back([&, r] {
        auto store =
            net::TcpStore::connect("127.0.0.1", (*srv)->port(), Deadline::after_seconds(10));
        if (!store.ok()) {
          st[static_cast<std::size_t>(r)] = store.status();
          return;
        }
        comm::CommOptions o;
        o.timeout_seconds = 60;
        o.prefix = "dp" + std::to_string(world);
        auto c = comm::Communicator::create(r, world, **store, o);
        if (!c.ok()) {
          st[static_cast<std::size_t>(r)] = c.status();
          return;
        }
        std::int64_t id = register_communicator(c->get());
        std::int64_t rows = 24 / world;
        auto res = train(r * rows, rows, 4, id);
        st[static_cast<std::size_t>(r)] = res.status();
        if (res.ok()) got[static_cast<std::size_t>(r)] = *res;
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(st[static_cast<std::size_t>(r)].ok())
          << st[static_cast<std::size_t>(r)].to_string();
      for (const auto& [n, t] : *ref) {
        const Tensor& u = got[static_cast<std::size_t>(r)].at(n);
        for (std::int64_t i = 0; i < t.numel(); ++i)
          ASSERT_NEAR(u.data<float>()[i], t.data<float>()[i], 1e-5)
              << "rank " << r << " param " << n << " element " << i;
      }
    }
  }
}

// The op's gradient rule (allreduce of dy), checked on one rank where the
// op is the identity: d/dx sum(allreduce(x) * c) = c.
TEST(DataParallel, AllreduceGradientIsAllreduceOfDy) {
  register_ops();
  net::FileStore unused("/nonexistent");
  auto c = comm::Communicator::create(0, 1, unused, {});
  ASSERT_TRUE(c.ok());
  std::int64_t id = register_communicator(c->get());
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {5});
  Value cst = b.constant(Tensor::from_vector<float>({1, -2, 3, 0.5f, 7}, {5}));
  Value ar = b.op("allreduce", {x}, {{"comm", id}, {"op", std::string("avg")}});
  Value loss = b.reduce_sum(b.mul(ar, cst), {0});
  auto grads = graph::autodiff(g, loss, {x});
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  g.mark_output((*grads)[0]);
  auto be = runtime::make_backend("cpu");
  auto exe = (*be)->compile(std::move(g), {});
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  runtime::Executor ex(**exe);
  auto out = ex.run({{"x", Tensor::from_vector<float>({0, 1, 2, 3, 4}, {5})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].to_vector<float>(), (std::vector<float>{1, -2, 3, 0.5f, 7}));
}

TEST(DataParallel, UnknownCommunicatorIsRefused) {
  Graph g;
  Builder b(g);
  Value p = b.input("p", DType::kF32, {3});
  std::vector<train::ParamRef> refs{{"p", p, p}};
  Status st = inject_allreduce(g, refs, 999);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("999"), std::string::npos);
}

}  // namespace
}  // namespace shoal::dp
