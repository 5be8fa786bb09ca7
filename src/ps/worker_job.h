// WorkerJob's private state, shared by attach.cc (joining, start-up) and
// push_pull.cc (the graph op and its client thread). Private to ps.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "ps/heartbeat.h"
#include "shoal/ps/attach.h"

namespace shoal::ps {

// One push-pull in flight: the kernel fills it, the client thread runs it.
struct PushPullTask {
  std::string key;
  Tensor grad, out;  // views of the kernel's input and output
  double lr = 0;
  // An embedding table's gradient as rows: `grad` holds rows `rows`.
  bool by_rows = false;
  std::vector<std::int64_t> rows;
  int priority = 0;  // of tasks ready together, the highest goes first
  // Set by the client thread: the step it pushed for, and the order it was
  // sent in among all of this job's push-pulls (1, 2, ...).
  std::int64_t step = 0;
  std::uint64_t sent = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::chrono::steady_clock::time_point start{}, end{};
};

struct WorkerJob::Impl {
  std::unique_ptr<net::Store> store;
  std::unique_ptr<Worker> worker;
  std::shared_ptr<train::Peers> peers;
  std::unique_ptr<Heartbeat> heartbeat;
  std::int64_t id = -1;  // in the push-pull op registry
  Mode mode = Mode::kSync;
  double timeout_s = 300;
  bool writer = false;  // holds ps_keys::kWriter: writes the job's checkpoints
  // The step each key's next push is for: sync, the server's version (the
  // open round); async and bounded, this worker's own count.
  std::map<std::string, std::int64_t> next_step;
  // SHOAL_PS_DELAY_MS (benchmarks: one slowed worker): a sleep per step,
  // before its first push-pull (there are `params` per step).
  double delay_ms = 0;
  std::size_t params = 0, tasks = 0;

  // The client thread: sends every task as soon as it is queued (of those
  // queued together, the highest priority first: the first layers', as
  // MXNet orders them) and finishes each as its answers come back.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<PushPullTask>> queue;
  bool stopping = false;
  std::thread thread;
  int wake = -1;  // eventfd: a task was queued (the thread may be polling)
  std::map<Worker::Ticket, std::shared_ptr<PushPullTask>> in_flight;  // client thread's
  std::uint64_t sent = 0;

  void start_thread();
  void stop_thread();
  void enqueue(std::shared_ptr<PushPullTask> t);

 private:
  void loop();
  void start(const std::shared_ptr<PushPullTask>& t);
  void finish(Worker::Done& d);
  static void complete(PushPullTask& t, Status st);
};

// The op's registry of jobs, so that a graph attribute can name one.
std::int64_t register_job(WorkerJob::Impl* j);
void unregister_job(std::int64_t id);
void register_push_pull_op();

}  // namespace shoal::ps
