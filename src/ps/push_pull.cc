// The "ps_push_pull" graph op: (grad, lr) -> the parameter's new value from
// its server. Its async kernel hands the work to the job's client thread,
// which runs push-pulls one after another in the order the backward pass
// produced the gradients; the executor waits for each only when the step
// ends.
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
  PushPullKernel(WorkerJob::Impl* j, std::string key) : j_(j), key_(std::move(key)) {}

  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    task_ = std::make_shared<PushPullTask>();
    task_->key = key_;
    task_->grad = in[0];
    task_->lr = static_cast<double>(in[1].data<float>()[0]);
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
  thread = std::thread([this] { loop(); });
}

void WorkerJob::Impl::stop_thread() {
  {
    std::lock_guard<std::mutex> lk(mu);
    stopping = true;
  }
  cv.notify_all();
  if (thread.joinable()) thread.join();
}

void WorkerJob::Impl::enqueue(std::shared_ptr<PushPullTask> t) {
  {
    std::lock_guard<std::mutex> lk(mu);
    queue.push_back(std::move(t));
  }
  cv.notify_one();
}

void WorkerJob::Impl::loop() {
  while (true) {
    std::shared_ptr<PushPullTask> t;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      t = std::move(queue.front());
      queue.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    Status st = run(*t);
    std::lock_guard<std::mutex> lk(t->mu);
    t->status = std::move(st);
    t->start = start;
    t->end = std::chrono::steady_clock::now();
    t->done = true;
    t->cv.notify_all();
  }
}

Status WorkerJob::Impl::run(PushPullTask& t) {
  if (delay_ms > 0 && params > 0 && tasks++ % params == 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
  std::int64_t& step = next_step[t.key];
  SHOAL_ASSIGN_OR_RETURN(
      Worker::Pulled p,
      worker->push_pull(t.key, step, t.grad, t.lr, Deadline::after_seconds(timeout_s), &t.out));
  if (p.value.shape() != t.out.shape())
    return failed_precondition("key '{}': the server sent {}, the parameter is {}", t.key,
                               shape_str(p.value.shape()), shape_str(t.out.shape()));
  // Received straight into the output when it could be; else copied.
  if (p.value.raw_data() != t.out.raw_data()) SHOAL_RETURN_IF_ERROR(t.out.copy_from(p.value));
  step = mode == Mode::kSync ? static_cast<std::int64_t>(p.version) : step + 1;
  return ok_status();
}

void register_push_pull_op() {
  static std::once_flag once;
  std::call_once(once, [] {
    graph::OpDef d;
    d.name = "ps_push_pull";
    d.min_inputs = 2;
    d.max_inputs = 2;
    d.attrs = {"job", "key"};
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
          return std::unique_ptr<runtime::Kernel>(
              std::make_unique<PushPullKernel>(j, n.attrs.get_string_or("key", "")));
        });
  });
}

Result<train::OptimizerGraph> inject_push_pull(graph::Builder& b,
                                               const std::vector<train::ParamRef>& params,
                                               WorkerJob& job) {
  register_push_pull_op();
  train::OptimizerGraph og;
  og.lr = b.input("lr", DType::kF32, {});
  for (const auto& p : params) {
    og.new_params.push_back(b.op("ps_push_pull", {p.grad, og.lr},
                                 {{"job", job.impl().id}, {"key", p.name}}, "ps/" + p.name));
    if (!b.ok()) return b.status().with_context(fmt::format("push-pull of '{}'", p.name));
  }
  return og;
}

}  // namespace shoal::ps
