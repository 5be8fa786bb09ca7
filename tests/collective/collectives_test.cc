// Collective graph ops (mp/collectives.h) across real ranks (threads with
// TCP/shm communicators), at world sizes 2, 3 and 4: allgather and
// reduce_scatter with uneven row counts, broadcast and reduce from the last
// rank, scatter and gather (uneven, from the first and the last rank);
// their values, and their gradients through autodiff (each the other's
// collective), equal what one process computes from every rank's inputs.
// And an all-gather over groups from split().
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "ranks.h"
#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/passes.h"
#include "shoal/net/store.h"
#include "shoal/runtime/backend.h"

namespace shoal::collective {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

constexpr std::int64_t kCols = 3;
const std::vector<std::int64_t> kRows = {2, 0, 3, 1};  // rank r's rows (rank 1: none)

// Rank r's own input and loss weights: distinct values per rank and element.
Tensor block(int r, std::int64_t rows, float scale) {
  std::vector<float> v(static_cast<std::size_t>(rows * kCols));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = scale * (static_cast<float>(r) + 0.1f * static_cast<float>(i + 1));
  return Tensor::from_vector(v, {rows, kCols});
}

struct Got {
  Tensor gathered, gather_grad, scattered, scatter_grad;
};

// Differentiates `loss` for inputs x and w, runs the graph on xs and ws,
// and returns y, dloss/dx, z, dloss/dw.
Result<Got> run_graph(Graph& g, Value loss, Value x, Value w, Value y, Value z, Tensor xs,
                      Tensor ws) {
  SHOAL_ASSIGN_OR_RETURN(auto grads, graph::autodiff(g, loss, {x, w}));
  for (Value v : {y, grads[0], z, grads[1]}) g.mark_output(v);
  SHOAL_ASSIGN_OR_RETURN(auto be, runtime::make_backend("cpu"));
  SHOAL_ASSIGN_OR_RETURN(auto exe, be->compile(std::move(g), {}));
  runtime::Executor ex(*exe);
  SHOAL_ASSIGN_OR_RETURN(auto out, ex.run({{"x", std::move(xs)}, {"w", std::move(ws)}}));
  return Got{out[0].clone(), out[1].clone(), out[2].clone(), out[3].clone()};
}

// On rank r: y = allgather(x_r), loss += sum(y * c_r); z = reduce_scatter(w_r),
// loss += sum(z * d_r); outputs y, dloss/dx_r, z, dloss/dw_r.
Result<Got> run_rank(int r, const std::vector<std::int64_t>& sizes, std::int64_t comm) {
  std::int64_t total = 0;
  for (std::int64_t s : sizes) total += s;
  const std::int64_t mine = sizes[static_cast<std::size_t>(r)];
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {mine, kCols});
  Value w = b.input("w", DType::kF32, {total, kCols});
  Value y = allgather(b, x, comm, sizes);
  Value z = reduce_scatter(b, w, comm, sizes);
  Value c = b.constant(block(r, total, -0.5f));
  Value d = b.constant(block(r, mine, 2.0f));
  Value loss = b.add(b.reduce_sum(b.mul(y, c), {0, 1}), b.reduce_sum(b.mul(z, d), {0, 1}));
  if (!b.ok()) return b.status();
  return run_graph(g, loss, x, w, y, z, block(r, mine, 1.0f), block(r, total, 0.25f));
}

// Runs `rank_fn(rank, comm id)` on `world` ranks (threads), each with its
// own communicator.
std::vector<Result<Got>> run_world(int world,
                                   const std::function<Result<Got>(int, std::int64_t)>& rank_fn) {
  return testing::run_on_ranks<Got>(world, fmt::format("mp{}-", world),
                                    [&](int r, comm::Communicator& c) {
                                      return rank_fn(r, collective::register_communicator(&c));
                                    });
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, ValuesAndGradientsEqualOneProcess) {
  const int world = GetParam();
  const std::vector<std::int64_t> sizes(kRows.begin(), kRows.begin() + world);
  std::int64_t total = 0;
  std::vector<std::int64_t> first;  // each rank's first row
  for (std::int64_t s : sizes) {
    first.push_back(total);
    total += s;
  }
  auto got = run_world(world, [&](int r, std::int64_t id) { return run_rank(r, sizes, id); });
  // One process: the concatenation of every x_r, and the sums over ranks.
  std::vector<float> cat, sum_c(static_cast<std::size_t>(total * kCols), 0.f),
      sum_w(static_cast<std::size_t>(total * kCols), 0.f);
  for (int q = 0; q < world; ++q) {
    const Tensor xq = block(q, sizes[static_cast<std::size_t>(q)], 1.0f);
    cat.insert(cat.end(), xq.data<float>(), xq.data<float>() + xq.numel());
    const Tensor cq = block(q, total, -0.5f), wq = block(q, total, 0.25f);
    for (std::size_t i = 0; i < sum_c.size(); ++i) {
      sum_c[i] += cq.data<float>()[i];
      sum_w[i] += wq.data<float>()[i];
    }
  }
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(fmt::format("world {}, rank {}", world, r));
    ASSERT_TRUE(got[static_cast<std::size_t>(r)].ok())
        << got[static_cast<std::size_t>(r)].status().to_string();
    const Got& g = *got[static_cast<std::size_t>(r)];
    const auto at = static_cast<std::size_t>(first[static_cast<std::size_t>(r)] * kCols);
    const auto n = static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)] * kCols);
    EXPECT_EQ(g.gathered.to_vector<float>(), cat);
    // d/dx_r of sum_q sum(y * c_q) = rows of x_r in the sum of every c_q.
    // (Sums: the ranks' order of addition may differ from this loop's.)
    const auto dx = g.gather_grad.to_vector<float>();
    ASSERT_EQ(dx.size(), n);
    for (std::size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(dx[i], sum_c[at + i]) << i;
    // z_r = rank r's block of the sum of every w_q.
    const auto z = g.scattered.to_vector<float>();
    ASSERT_EQ(z.size(), n);
    for (std::size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(z[i], sum_w[at + i]) << i;
    // d/dw_r of sum_q sum(z_q * d_q) = every d_q in its block's place.
    std::vector<float> dw;
    for (int q = 0; q < world; ++q) {
      const Tensor dq = block(q, sizes[static_cast<std::size_t>(q)], 2.0f);
      dw.insert(dw.end(), dq.data<float>(), dq.data<float>() + dq.numel());
    }
    EXPECT_EQ(g.scatter_grad.to_vector<float>(), dw);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, Collectives, ::testing::Values(2, 3, 4));

// On rank r: y = broadcast(x_r), loss += sum(y * c_r); z = reduce(w_r),
// loss += sum(z * d_r); outputs y, dloss/dx_r, z, dloss/dw_r.
Result<Got> run_rooted(int r, int root, std::int64_t comm) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {2, kCols});
  Value w = b.input("w", DType::kF32, {2, kCols});
  Value y = broadcast(b, x, comm, root);
  Value z = reduce(b, w, comm, root);
  Value loss = b.add(b.reduce_sum(b.mul(y, b.constant(block(r, 2, -0.5f))), {0, 1}),
                     b.reduce_sum(b.mul(z, b.constant(block(r, 2, 2.0f))), {0, 1}));
  if (!b.ok()) return b.status();
  return run_graph(g, loss, x, w, y, z, block(r, 2, 1.0f), block(r, 2, 0.25f));
}

TEST_P(Collectives, BroadcastAndReduceEqualOneProcess) {
  const int world = GetParam(), root = world - 1;
  auto got = run_world(world, [&](int r, std::int64_t id) { return run_rooted(r, root, id); });
  const auto n = static_cast<std::size_t>(2 * kCols);
  std::vector<float> sum_c(n, 0.f), sum_w(n, 0.f);
  for (int q = 0; q < world; ++q)
    for (std::size_t i = 0; i < n; ++i) {
      sum_c[i] += block(q, 2, -0.5f).data<float>()[i];
      sum_w[i] += block(q, 2, 0.25f).data<float>()[i];
    }
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(fmt::format("world {}, rank {}, root {}", world, r, root));
    ASSERT_TRUE(got[static_cast<std::size_t>(r)].ok())
        << got[static_cast<std::size_t>(r)].status().to_string();
    const Got& g = *got[static_cast<std::size_t>(r)];
    EXPECT_EQ(g.gathered.to_vector<float>(), block(root, 2, 1.0f).to_vector<float>());
    // Every rank's loss used the root's x: the root's gradient is the sum
    // of every c_q, the others' zero.
    const auto dx = g.gather_grad.to_vector<float>();
    for (std::size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(dx[i], r == root ? sum_c[i] : 0.f) << i;
    const auto z = g.scattered.to_vector<float>();
    for (std::size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(z[i], r == root ? sum_w[i] : 0.f) << i;
    // Only the root's output is not zero: every w_r gets the root's d.
    EXPECT_EQ(g.scatter_grad.to_vector<float>(), block(root, 2, 2.0f).to_vector<float>());
  }
}

// On rank r: y = scatter(x_r) from the root, loss += sum(y * c_r); z =
// gather(w_r) to the root, loss += sum(z * d_r); outputs y, dloss/dx_r, z,
// dloss/dw_r.
Result<Got> run_dealt(int r, int root, const std::vector<std::int64_t>& sizes, std::int64_t comm) {
  std::int64_t total = 0;
  for (std::int64_t s : sizes) total += s;
  const std::int64_t mine = sizes[static_cast<std::size_t>(r)];
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {total, kCols});
  Value w = b.input("w", DType::kF32, {mine, kCols});
  Value y = scatter(b, x, comm, root, sizes);
  Value z = gather(b, w, comm, root, sizes);
  Value loss = b.add(b.reduce_sum(b.mul(y, b.constant(block(r, mine, -0.5f))), {0, 1}),
                     b.reduce_sum(b.mul(z, b.constant(block(r, total, 2.0f))), {0, 1}));
  if (!b.ok()) return b.status();
  return run_graph(g, loss, x, w, y, z, block(r, total, 1.0f), block(r, mine, 0.25f));
}

TEST_P(Collectives, ScatterAndGatherEqualOneProcess) {
  const int world = GetParam();
  const std::vector<std::int64_t> sizes(kRows.begin(), kRows.begin() + world);
  std::int64_t total = 0;
  std::vector<std::int64_t> first;
  for (std::int64_t s : sizes) {
    first.push_back(total);
    total += s;
  }
  for (int root : {0, world - 1}) {
    auto got =
        run_world(world, [&](int r, std::int64_t id) { return run_dealt(r, root, sizes, id); });
    const auto root_x = block(root, total, 1.0f).to_vector<float>();
    std::vector<float> cat;  // every w_q in rank order
    for (int q = 0; q < world; ++q) {
      const Tensor wq = block(q, sizes[static_cast<std::size_t>(q)], 0.25f);
      cat.insert(cat.end(), wq.data<float>(), wq.data<float>() + wq.numel());
    }
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE(fmt::format("world {}, rank {}, root {}", world, r, root));
      ASSERT_TRUE(got[static_cast<std::size_t>(r)].ok())
          << got[static_cast<std::size_t>(r)].status().to_string();
      const Got& g = *got[static_cast<std::size_t>(r)];
      const auto at = static_cast<std::size_t>(first[static_cast<std::size_t>(r)] * kCols);
      const auto n = static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)] * kCols);
      // y_r: block r of the root's x.
      EXPECT_EQ(g.gathered.to_vector<float>(),
                std::vector<float>(root_x.begin() + static_cast<std::ptrdiff_t>(at),
                                   root_x.begin() + static_cast<std::ptrdiff_t>(at + n)));
      // d/dx_root: every rank's c_q in its block's place; others' x unused.
      std::vector<float> dx(static_cast<std::size_t>(total * kCols), 0.f);
      if (r == root)
        for (int q = 0; q < world; ++q) {
          const Tensor cq = block(q, sizes[static_cast<std::size_t>(q)], -0.5f);
          std::copy(cq.data<float>(), cq.data<float>() + cq.numel(),
                    dx.begin() + first[static_cast<std::size_t>(q)] * kCols);
        }
      EXPECT_EQ(g.gather_grad.to_vector<float>(), dx);
      // z: every w_q stacked on the root, zeros elsewhere.
      EXPECT_EQ(g.scattered.to_vector<float>(),
                r == root ? cat : std::vector<float>(cat.size(), 0.f));
      // d/dw_r: block r of the root's d (the only z that is not zero).
      const auto d_root = block(root, total, 2.0f).to_vector<float>();
      EXPECT_EQ(g.scatter_grad.to_vector<float>(),
                std::vector<float>(d_root.begin() + static_cast<std::ptrdiff_t>(at),
                                   d_root.begin() + static_cast<std::ptrdiff_t>(at + n)));
    }
  }
}

// The ops over groups from split(): 4 ranks in two groups by rank parity
// ({0, 2} and {1, 3}), each all-gathering its members' rows on its own
// sub-communicator while the other group does the same.
TEST(CollectivesGroups, AllgatherOverSplitGroupsGathersOnlyTheGroup) {
  auto got = testing::run_on_ranks<Tensor>(
      4, "mpgroups", [](int r, comm::Communicator& world) -> Result<Tensor> {
        SHOAL_ASSIGN_OR_RETURN(auto group, world.split(r % 2, r));
        const std::int64_t id = collective::register_communicator(group.get());
        const std::vector<std::int64_t> sizes = {r % 2 ? 1 : 2, r % 2 ? 3 : 1};  // uneven
        const std::int64_t mine = sizes[static_cast<std::size_t>(group->rank())];
        Graph g;
        Builder b(g);
        Value y = allgather(b, b.input("x", DType::kF32, {mine, kCols}), id, sizes);
        if (!b.ok()) return b.status();
        g.mark_output(y);
        SHOAL_ASSIGN_OR_RETURN(auto be, runtime::make_backend("cpu"));
        SHOAL_ASSIGN_OR_RETURN(auto exe, be->compile(std::move(g), {}));
        runtime::Executor ex(*exe);
        SHOAL_ASSIGN_OR_RETURN(auto res, ex.run({{"x", block(r, mine, 1.0f)}}));
        return res[0].clone();
      });
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    ASSERT_TRUE(got[static_cast<std::size_t>(r)].ok())
        << got[static_cast<std::size_t>(r)].status().to_string();
    // Group members in group-rank order: world ranks r % 2 and r % 2 + 2.
    const int a = r % 2, c = r % 2 + 2;
    std::vector<float> want = block(a, r % 2 ? 1 : 2, 1.0f).to_vector<float>();
    const auto more = block(c, r % 2 ? 3 : 1, 1.0f).to_vector<float>();
    want.insert(want.end(), more.begin(), more.end());
    EXPECT_EQ(got[static_cast<std::size_t>(r)]->to_vector<float>(), want);
  }
}

TEST(CollectivesBuild, SizesThatDoNotMatchAreNamed) {
  auto c = testing::one_rank_communicator();
  ASSERT_TRUE(c.ok());
  const std::int64_t id = collective::register_communicator(c->get());
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {4, 2});
  allgather(b, x, id, {3});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("rank 0 holds 4 rows, the sizes say 3"), std::string::npos)
      << b.status().message();
  Graph g2;
  Builder b2(g2);
  reduce_scatter(b2, b2.input("x", DType::kF32, {4, 2}), id, {2, 2});
  ASSERT_FALSE(b2.ok());
  EXPECT_NE(b2.status().message().find("2 sizes for a group of 1 ranks"), std::string::npos)
      << b2.status().message();
  Graph g3;
  Builder b3(g3);
  allgather(b3, b3.input("x", DType::kF32, {4}), 12345, {4});
  ASSERT_FALSE(b3.ok());
  EXPECT_NE(b3.status().message().find("no communicator registered as id 12345"), std::string::npos)
      << b3.status().message();
}

}  // namespace
}  // namespace shoal::collective
