// Pipelined push-pulls on real servers (loopback): every push-pull of a
// step in flight at once, answers matched to requests in whatever order the
// sync rounds close, and the client thread sending what is ready together
// in priority order.
#include <gtest/gtest.h>

#include <latch>
#include <thread>

#include "ps/worker_job.h"
#include "shoal/ps/server.h"
#include "shoal/ps/worker.h"

namespace shoal::ps {
namespace {

const std::string kToken = "pipeline-token";
Deadline soon() { return Deadline::after_seconds(20); }

float grad_of(int worker, int key, std::int64_t i, int step) {
  return 0.01f * static_cast<float>((i * 5 + key * 3 + worker * 7 + step) % 13) - 0.06f;
}

// Two workers start the same three push-pulls per step in opposite orders
// (one key sliced into blocks over both servers): a client that waited for
// each answer before sending the next would deadlock, each worker waiting on
// a round the other has not pushed to. Every key ends at one process's SGD
// on the mean gradient.
TEST(PsPipeline, PushPullsInFlightInAnyOrderEqualOneProcess) {
  ShardOptions o;
  o.mode = Mode::kSync;
  o.optimizer.name = "sgd";
  o.lr = 0.5;
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::string> addrs;
  for (int i = 0; i < 2; ++i) {
    ServerOptions so;
    so.shard = o;
    auto s = Server::start("127.0.0.1", 0, kToken, so);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    addrs.push_back("127.0.0.1:" + std::to_string((*s)->port()));
    servers.push_back(std::move(s).value());
  }
  const std::vector<std::string> keys = {"a", "b", "big"};
  const std::vector<std::int64_t> sizes = {7, 1001, (std::int64_t{1} << 21) + 3};  // big: 4 blocks
  constexpr int kSteps = 3;
  std::vector<std::vector<Tensor>> got(2);
  std::latch joined(2);
  auto work = [&](int id) {
    auto w = Worker::connect(addrs, kToken, id, soon(), &o);
    Status st = w.status();
    for (std::size_t k = 0; st.ok() && k < keys.size(); ++k)
      st = (*w)->init(keys[k], Tensor::zeros({sizes[k]}, DType::kF32));
    joined.arrive_and_wait();
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::vector<Tensor> out, grads;
    for (auto n : sizes) {
      out.push_back(Tensor::zeros({n}, DType::kF32));
      grads.push_back(Tensor::empty({n}, DType::kF32));
    }
    for (int step = 0; step < kSteps; ++step) {
      std::map<Worker::Ticket, std::size_t> which;
      for (std::size_t j = 0; j < keys.size(); ++j) {
        const std::size_t k = id == 0 ? j : keys.size() - 1 - j;
        for (std::int64_t i = 0; i < sizes[k]; ++i)
          grads[k].data<float>()[i] = grad_of(id, static_cast<int>(k), i, step);
        auto t = (*w)->start_push_pull(keys[k], step, grads[k], 0, out[k], soon());
        ASSERT_TRUE(t.ok()) << t.status().to_string();
        which[*t] = k;
      }
      EXPECT_EQ((*w)->push_pulls_in_flight(), keys.size());
      for (int polls = 0; !which.empty() && polls < 1000; ++polls)
        for (Worker::Done& d : (*w)->poll_push_pulls(-1, soon())) {
          ASSERT_TRUE(d.pulled.ok()) << d.pulled.status().to_string();
          EXPECT_EQ(d.pulled->version, static_cast<std::uint64_t>(step + 1));
          EXPECT_EQ(d.pulled->value.raw_data(), out[which.at(d.ticket)].raw_data());
          which.erase(d.ticket);
        }
      ASSERT_TRUE(which.empty()) << "push-pulls not answered at step " << step;
    }
    got[static_cast<std::size_t>(id)] = out;
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  for (int id : {0, 1})
    for (std::size_t k = 0; k < keys.size(); ++k) {
      ASSERT_EQ(got[static_cast<std::size_t>(id)].size(), keys.size());
      const float* v = got[static_cast<std::size_t>(id)][k].data<float>();
      for (std::int64_t i = 0; i < sizes[k]; i += k == 2 ? 997 : 1) {
        float ref = 0;
        for (int step = 0; step < kSteps; ++step)
          ref -= 0.5f *
                 (grad_of(0, static_cast<int>(k), i, step) +
                  grad_of(1, static_cast<int>(k), i, step)) *
                 0.5f;
        ASSERT_NEAR(v[i], ref, 1e-6f) << "worker " << id << " key " << keys[k] << " element " << i;
      }
    }
}

// Of the push-pulls the backward pass has ready together, the client thread
// sends the highest priority first (the first layer's: the next step needs
// it first), whatever order they were queued in.
TEST(PsPipeline, TasksReadyTogetherGoOutInPriorityOrder) {
  ServerOptions so;
  so.shard.mode = Mode::kAsync;
  auto server = Server::start("127.0.0.1", 0, kToken, so);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  WorkerJob::Impl job;
  job.mode = Mode::kAsync;
  job.timeout_s = 20;
  auto w = Worker::connect({"127.0.0.1:" + std::to_string((*server)->port())}, kToken, 0, soon(),
                           &so.shard);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  job.worker = std::move(w).value();
  std::vector<std::shared_ptr<PushPullTask>> tasks;
  for (int p : {-2, 0, -3, -1}) {
    const std::string key = "k" + std::to_string(-p);
    ASSERT_TRUE(job.worker->init(key, Tensor::zeros({5}, DType::kF32)).ok());
    auto t = std::make_shared<PushPullTask>();
    t->key = key;
    t->grad = Tensor::full({5}, DType::kF32, 1.0);
    t->out = Tensor::zeros({5}, DType::kF32);
    t->priority = p;
    tasks.push_back(t);
  }
  job.start_thread();
  {
    std::lock_guard<std::mutex> lk(job.mu);  // all four ready before the thread looks
    for (auto& t : tasks) job.queue.push_back(t);
  }
  job.cv.notify_one();
  for (auto& t : tasks) {
    std::unique_lock<std::mutex> lk(t->mu);
    ASSERT_TRUE(t->cv.wait_for(lk, std::chrono::seconds(20), [&] { return t->done; }));
    ASSERT_TRUE(t->status.ok()) << t->status.to_string();
  }
  job.stop_thread();
  // Priorities -2, 0, -3, -1 were sent 3rd, 1st, 4th, 2nd.
  EXPECT_EQ(tasks[0]->sent, 3u);
  EXPECT_EQ(tasks[1]->sent, 1u);
  EXPECT_EQ(tasks[2]->sent, 4u);
  EXPECT_EQ(tasks[3]->sent, 2u);
  EXPECT_FLOAT_EQ(tasks[0]->out.data<float>()[0], -0.01f);  // one SGD step at lr 0.01
}

}  // namespace
}  // namespace shoal::ps
