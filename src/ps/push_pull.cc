// The "ps_push_pull" graph op: (grad, lr) -> the parameter's new value from
// its server. Its async kernel hands the work to the job's client thread,
// which sends each push-pull as soon as the backward pass has produced its
// gradient (of several ready together, the highest priority first) and
// finishes them as answers come back, all in flight at once; the executor
// waits for each only when the step ends.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <optional>

#include "ps/worker_job.h"
#include "shoal/core/logging.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/kernel.h"

namespace shoal::ps {
namespace {

std::mutex g_mu;
std::map<std::int64_t, WorkerJob::Impl*>& jobs() {
  static std::map<std::int64_t, WorkerJob::Impl*> m;
  return m;
}
std::int64_t g_next = 0;

WorkerJob::Impl* lookup(std::int64_t id) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = jobs().find(id);
  return it == jobs().end() ? nullptr : it->second;
}

class PushPullKernel final : public runtime::Kernel {
 public:
  PushPullKernel(WorkerJob::Impl* j, std::string key, int priority)
      : j_(j), key_(std::move(key)), priority_(priority) {}

  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    task_ = std::make_shared<PushPullTask>();
    task_->key = key_;
    task_->grad = in[0];
    task_->lr = static_cast<double>(in[1].data<float>()[0]);
    task_->priority = priority_;
    task_->out = out[0];
    j_->enqueue(task_);
    return ok_status();
  }
  bool is_async() const override { return true; }
  Status wait(Deadline dl) override {
    if (!task_) return ok_status();
    std::unique_lock<std::mutex> lk(task_->mu);
    while (!task_->done) {
      if (dl.expired())
        return deadline_exceeded("push-pull of key '{}' not answered by its parameter server",
                                 key_);
      task_->cv.wait_for(lk, std::chrono::milliseconds(100));
    }
    Status st = task_->status;
    start_ = task_->start;
    end_ = task_->end;
    lk.unlock();
    task_.reset();
    return st;
  }
  bool work_interval(std::chrono::steady_clock::time_point* s,
                     std::chrono::steady_clock::time_point* e) const override {
    if (start_ == std::chrono::steady_clock::time_point{}) return false;
    *s = start_;
    *e = end_;
    return true;
  }
  const char* impl() const override { return "ps"; }

 private:
  WorkerJob::Impl* j_;
  std::string key_;
  int priority_;
  std::shared_ptr<PushPullTask> task_;
  std::chrono::steady_clock::time_point start_{}, end_{};
};

}  // namespace

std::int64_t register_job(WorkerJob::Impl* j) {
  std::lock_guard<std::mutex> lk(g_mu);
  jobs()[g_next] = j;
  return g_next++;
}

void unregister_job(std::int64_t id) {
  std::lock_guard<std::mutex> lk(g_mu);
  jobs().erase(id);
}

void WorkerJob::Impl::start_thread() {
  wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  thread = std::thread([this] { loop(); });
}

void WorkerJob::Impl::stop_thread() {
  {
    std::lock_guard<std::mutex> lk(mu);
    stopping = true;
  }
  cv.notify_all();
  if (wake >= 0) (void)::eventfd_write(wake, 1);
  if (thread.joinable()) thread.join();
  if (wake >= 0) ::close(wake);
  wake = -1;
}

void WorkerJob::Impl::enqueue(std::shared_ptr<PushPullTask> t) {
  {
    std::lock_guard<std::mutex> lk(mu);
    queue.push_back(std::move(t));
  }
  cv.notify_one();
  if (wake >= 0) (void)::eventfd_write(wake, 1);
}

void WorkerJob::Impl::loop() {
  while (true) {
    std::vector<std::shared_ptr<PushPullTask>> ready;
    {
      std::unique_lock<std::mutex> lk(mu);
      if (in_flight.empty()) cv.wait(lk, [&] { return stopping || !queue.empty(); });
      ready.assign(queue.begin(), queue.end());
      queue.clear();
      if (stopping) {
        // Training is over (every step waits for its push-pulls) or failing:
        // whatever is left is not waited for; its waiters hear why.
        for (auto& t : ready) complete(*t, aborted("the parameter-server client stopped"));
        for (auto& [tk, t] : in_flight)
          complete(*t, aborted("the parameter-server client stopped"));
        in_flight.clear();
        return;
      }
    }
    eventfd_t drained;
    (void)::eventfd_read(wake, &drained);
    std::stable_sort(ready.begin(), ready.end(),
                     [](const auto& a, const auto& b) { return a->priority > b->priority; });
    for (const auto& t : ready) start(t);
    if (in_flight.empty()) continue;
    for (Worker::Done& d : worker->poll_push_pulls(wake, Deadline::after_seconds(timeout_s)))
      finish(d);
  }
}

void WorkerJob::Impl::start(const std::shared_ptr<PushPullTask>& t) {
  if (delay_ms > 0 && params > 0 && tasks++ % params == 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
  t->start = std::chrono::steady_clock::now();
  t->step = next_step[t->key];
  t->sent = ++sent;
  auto tk = worker->start_push_pull(t->key, t->step, t->grad, t->lr, t->out,
                                    Deadline::after_seconds(timeout_s));
  if (!tk.ok()) return complete(*t, tk.status());
  in_flight[*tk] = t;
}

void WorkerJob::Impl::finish(Worker::Done& d) {
  auto it = in_flight.find(d.ticket);
  if (it == in_flight.end()) return;
  std::shared_ptr<PushPullTask> t = std::move(it->second);
  in_flight.erase(it);
  Status st = d.pulled.status();
  if (st.ok()) {
    const Tensor& v = d.pulled->value;
    if (v.shape() != t->out.shape())
      st = failed_precondition("key '{}': the server sent {}, the parameter is {}", t->key,
                               shape_str(v.shape()), shape_str(t->out.shape()));
    else if (v.raw_data() != t->out.raw_data())  // received in place when it could be
      st = t->out.copy_from(v);
  }
  if (st.ok())
    next_step[t->key] =
        mode == Mode::kSync ? static_cast<std::int64_t>(d.pulled->version) : t->step + 1;
  complete(*t, std::move(st));
}

void WorkerJob::Impl::complete(PushPullTask& t, Status st) {
  std::lock_guard<std::mutex> lk(t.mu);
  t.status = std::move(st);
  t.end = std::chrono::steady_clock::now();
  t.done = true;
  t.cv.notify_all();
}

void register_push_pull_op() {
  static std::once_flag once;
  std::call_once(once, [] {
    graph::OpDef d;
    d.name = "ps_push_pull";
    d.min_inputs = 2;
    d.max_inputs = 2;
    d.attrs = {"job", "key", "priority"};
    d.random = true;  // never constant-folded: its value comes from a server
    d.infer =
        [](const graph::Node& n,
           const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
      if (in[0].dtype != DType::kF32)
        return invalid_argument("{}: gradients must be f32, got {}", n.label(), in[0].str());
      if (!in[1].shape.empty())
        return invalid_argument("{}: lr must be a scalar, got {}", n.label(), in[1].str());
      return std::vector<graph::TensorType>{in[0]};
    };
    graph::OpRegistry::global().add(d);
    runtime::KernelRegistry::cpu().add(
        "ps_push_pull",
        [](const graph::Node& n,
           const std::vector<graph::TensorType>&) -> Result<std::unique_ptr<runtime::Kernel>> {
          const std::int64_t id = n.attrs.get_int_or("job", -1);
          WorkerJob::Impl* j = lookup(id);
          if (!j)
            return failed_precondition("{}: no parameter-server job registered as {}", n.label(),
                                       id);
          return std::unique_ptr<runtime::Kernel>(std::make_unique<PushPullKernel>(
              j, n.attrs.get_string_or("key", ""),
              static_cast<int>(n.attrs.get_int_or("priority", 0))));
        });
  });
}

Result<train::OptimizerGraph> inject_push_pull(graph::Builder& b,
                                               const std::vector<train::ParamRef>& params,
                                               WorkerJob& job) {
  register_push_pull_op();
  train::OptimizerGraph og;
  og.lr = b.input("lr", DType::kF32, {});
  // Priorities as MXNet gives them: the first parameter (the first layer,
  // which the next step needs first) highest.
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    og.new_params.push_back(
        b.op("ps_push_pull", {p.grad, og.lr},
             {{"job", job.impl().id}, {"key", p.name}, {"priority", -static_cast<std::int64_t>(i)}},
             "ps/" + p.name));
    if (!b.ok()) return b.status().with_context(fmt::format("push-pull of '{}'", p.name));
  }
  return og;
}

}  // namespace shoal::ps
