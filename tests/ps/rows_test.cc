// Row-sparse pushes and pulls (embedding tables) and keys sliced over
// servers: a row push updates exactly as the dense gradient with zeros
// elsewhere would (momentum included); bad rows are named; and two workers
// pushing rows of a key sliced over two real servers (loopback) in a sync
// job end with the one-process result, reading rows back in any order.
#include <gtest/gtest.h>

#include <latch>
#include <thread>

#include "shoal/ps/server.h"
#include "shoal/ps/shard.h"
#include "shoal/ps/worker.h"

namespace shoal::ps {
namespace {

const std::string kToken = "rows-token";
Deadline soon() { return Deadline::after_seconds(20); }

ShardOptions momentum(Mode mode) {
  ShardOptions o;
  o.mode = mode;
  o.optimizer.name = "momentum";
  o.optimizer.momentum = 0.9;
  o.lr = 0.1;
  return o;
}

Tensor table(std::int64_t rows, std::int64_t width) {
  std::vector<float> v(static_cast<std::size_t>(rows * width));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i) - 0.3f;
  return Tensor::from_vector(v, {rows, width});
}

TEST(PsRows, ARowPushUpdatesAsTheDenseGradientWithZerosElsewhere) {
  auto sparse = Shard::create(momentum(Mode::kAsync));
  auto dense = Shard::create(momentum(Mode::kAsync));
  ASSERT_TRUE(sparse.ok() && dense.ok());
  for (auto* s : {sparse->get(), dense->get()}) {
    ASSERT_TRUE(s->init("emb", table(7, 3)).ok());
    ASSERT_TRUE(s->add_worker(0).ok());
  }
  // Row 5 twice (it adds), row 1 once; three steps so momentum carries.
  const std::vector<std::int64_t> rows = {5, 1, 5};
  const Tensor vals =
      Tensor::from_vector(std::vector<float>{1, 2, 3, -1, 0.5f, 4, 0.25f, 0.25f, -2}, {3, 3});
  Tensor g = Tensor::zeros({7, 3}, DType::kF32);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      g.data<float>()[rows[static_cast<std::size_t>(i)] * 3 + j] += vals.data<float>()[i * 3 + j];
  for (std::uint64_t step = 0; step < 3; ++step) {
    auto a = (*sparse)->push_rows(0, "emb", static_cast<std::int64_t>(step), step + 1, rows, vals);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE((*dense)->push(0, "emb", static_cast<std::int64_t>(step), step + 1, g).ok());
  }
  auto a = (*sparse)->pull("emb");
  auto b = (*dense)->pull("emb");
  for (std::int64_t i = 0; i < 21; ++i)
    ASSERT_EQ(a->second.data<float>()[i], b->second.data<float>()[i]) << i;
  // Untouched rows kept their value; touched ones moved.
  EXPECT_EQ(a->second.data<float>()[0], table(7, 3).data<float>()[0]);
  EXPECT_NE(a->second.data<float>()[15], table(7, 3).data<float>()[15]);
  auto picked = (*sparse)->pull_rows("emb", {6, 1});
  ASSERT_TRUE(picked.ok());
  EXPECT_EQ(picked->second.shape(), (Shape{2, 3}));
  EXPECT_EQ(picked->second.data<float>()[0], a->second.data<float>()[18]);
  EXPECT_EQ(picked->second.data<float>()[3], a->second.data<float>()[3]);
}

TEST(PsRows, BadRowsAreNamed) {
  auto s = Shard::create(momentum(Mode::kAsync));
  ASSERT_TRUE((*s)->init("emb", table(7, 3)).ok());
  ASSERT_TRUE((*s)->init("scale", Tensor::scalar(1)).ok());
  ASSERT_TRUE((*s)->add_worker(0).ok());
  auto expect = [](const Status& st, const char* what) {
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  const Tensor one = Tensor::zeros({1, 3}, DType::kF32);
  expect((*s)->push_rows(0, "emb", 0, 1, {7}, one).status(),
         "row 7 (entry 0 of the list) is outside its 7 rows");
  expect((*s)->push_rows(0, "emb", 0, 1, {-1}, one).status(), "row -1");
  expect((*s)->push_rows(0, "emb", 0, 1, {1, 2}, one).status(), "expected f32 [2, 3]");
  expect((*s)->push_rows(0, "scale", 0, 1, {}, Tensor::zeros({0}, DType::kF32)).status(),
         "is a scalar");
  expect((*s)->pull_rows("emb", {3, 9}).status(), "row 9 (entry 1");
  EXPECT_TRUE((*s)->pull_rows("emb", {}).ok());
}

TEST(PsRows, TwoWorkersPushRowsOfAKeySlicedOverTwoServers) {
  ServerOptions so;
  so.shard = momentum(Mode::kSync);
  so.shard.optimizer.name = "sgd";
  so.shard.slice_bound = 10;  // the 9x4 table (36 elements) is sliced: rows 0-3, 4-8
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::string> addrs;
  for (int i = 0; i < 2; ++i) {
    auto s = Server::start("127.0.0.1", 0, kToken, so);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    addrs.push_back("127.0.0.1:" + std::to_string((*s)->port()));
    servers.push_back(std::move(s).value());
  }
  const Tensor init = table(9, 4);
  // Worker 0 touches rows 1 and 6 (one on each server), worker 1 rows 8, 6
  // and 0; neither touches 2-5 or 7.
  const std::vector<std::vector<std::int64_t>> rows = {{1, 6}, {8, 6, 0}};
  auto values = [](int w, std::size_t n) {
    std::vector<float> v(n * 4);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(w + 1) * 0.5f + 0.1f * i;
    return Tensor::from_vector(v, {static_cast<std::int64_t>(n), 4});
  };
  std::vector<Tensor> got(2), picked(2);
  std::latch joined(2);
  auto work = [&](int id) {
    auto w = Worker::connect(addrs, kToken, id, soon(), &so.shard);
    const Status st = w.ok() ? (*w)->init("emb", init) : w.status();
    joined.arrive_and_wait();
    ASSERT_TRUE(st.ok()) << st.to_string();
    const auto& mine = rows[static_cast<std::size_t>(id)];
    for (std::int64_t step = 0; step < 2; ++step) {
      auto pr = (*w)->push_rows("emb", step, mine, values(id, mine.size()), 0, soon());
      ASSERT_TRUE(pr.ok()) << pr.status().to_string();
      // Sync: the next step's rows once this round closed on every server.
      auto next = (*w)->pull_rows("emb", mine, static_cast<std::uint64_t>(step + 1), soon());
      ASSERT_TRUE(next.ok()) << next.status().to_string();
    }
    auto p = (*w)->pull("emb", 2, soon());
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    got[static_cast<std::size_t>(id)] = p->second;
    auto r = (*w)->pull_rows("emb", {8, 1, 6, 1}, 2, soon());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    picked[static_cast<std::size_t>(id)] = r->second;
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  // One process: two SGD steps on the mean of both workers' dense gradients.
  std::vector<float> ref(init.data<float>(), init.data<float>() + 36);
  for (int step = 0; step < 2; ++step)
    for (int w = 0; w < 2; ++w) {
      const Tensor v = values(w, rows[static_cast<std::size_t>(w)].size());
      for (std::size_t i = 0; i < rows[static_cast<std::size_t>(w)].size(); ++i)
        for (int j = 0; j < 4; ++j)
          ref[static_cast<std::size_t>(rows[static_cast<std::size_t>(w)][i] * 4 + j)] -=
              0.1f * 0.5f * v.data<float>()[i * 4 + static_cast<std::size_t>(j)];
    }
  for (int id : {0, 1}) {
    ASSERT_EQ(got[static_cast<std::size_t>(id)].shape(), (Shape{9, 4}));
    for (std::size_t i = 0; i < 36; ++i)
      EXPECT_NEAR(got[static_cast<std::size_t>(id)].data<float>()[i], ref[i], 1e-6)
          << "worker " << id << " element " << i;
    const std::vector<std::int64_t> order = {8, 1, 6, 1};
    for (std::size_t i = 0; i < order.size(); ++i)
      for (std::size_t j = 0; j < 4; ++j)
        EXPECT_EQ(picked[static_cast<std::size_t>(id)].data<float>()[i * 4 + j],
                  got[static_cast<std::size_t>(id)].data<float>()[order[i] * 4 + j]);
  }
  // Both servers held a slice and closed both rounds of it.
  for (const auto& s : servers) EXPECT_EQ(s->stats().rounds, 2u);
}

}  // namespace
}  // namespace shoal::ps
