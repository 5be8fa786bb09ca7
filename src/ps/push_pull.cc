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

// An embedding table's gradient as rows: the distinct ids in `ids` (in
// order of first use) and, for each, the sum of its rows of `dy` ([...,
// dim], one row per id), added in the order the dense scatter adds them, so
// the server's dense sum is bit for bit the dense gradient's.
Status rows_of_ids(const Tensor& ids_in, const Tensor& dy_in, std::int64_t table_rows,
                   const std::string& key, std::vector<std::int64_t>* rows, Tensor* values) {
  const Tensor ids = ids_in.contiguous(), dy = dy_in.contiguous();
  const std::int64_t n = ids.numel(), dim = dy.rank() ? dy.shape().back() : 0;
  if (dy.numel() != n * dim)
    return invalid_argument("rows of '{}': {} ids for a gradient of shape {}", key, n,
                            shape_str(dy.shape()));
  std::vector<std::int64_t> slot(static_cast<std::size_t>(table_rows), -1);
  std::vector<float> sum;
  const float* d = dy.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t id = ids.dtype() == DType::kI32
                                ? static_cast<std::int64_t>(ids.data<std::int32_t>()[i])
                                : ids.data<std::int64_t>()[i];
    if (id < 0 || id >= table_rows)
      return invalid_argument("rows of '{}': id {} at position {} is outside the table's {} rows",
                              key, id, i, table_rows);
    auto& k = slot[static_cast<std::size_t>(id)];
    if (k < 0) {
      k = static_cast<std::int64_t>(rows->size());
      rows->push_back(id);
      sum.resize(sum.size() + static_cast<std::size_t>(dim), 0.f);
    }
    float* row = sum.data() + k * dim;
    for (std::int64_t j = 0; j < dim; ++j) row[j] += d[i * dim + j];
  }
  *values = Tensor::from_vector(sum, {static_cast<std::int64_t>(rows->size()), dim});
  return ok_status();
}

// (grad, lr) -> value, or for an embedding table (ids, dy, lr) -> value
// with the gradient pushed as rows.
class PushPullKernel final : public runtime::Kernel {
 public:
  PushPullKernel(WorkerJob::Impl* j, std::string key, int priority, std::int64_t table_rows)
      : j_(j), key_(std::move(key)), priority_(priority), table_rows_(table_rows) {}

  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    auto t = std::make_shared<PushPullTask>();
    t->key = key_;
    if (table_rows_ > 0) {
      t->by_rows = true;
      SHOAL_RETURN_IF_ERROR(rows_of_ids(in[0], in[1], table_rows_, key_, &t->rows, &t->grad));
    } else {
      t->grad = in[0];
    }
    t->lr = static_cast<double>(in[in.size() - 1].data<float>()[0]);
    t->priority = priority_;
    t->out = out[0];
    task_ = std::move(t);
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
  std::int64_t table_rows_;  // > 0: an embedding table, pushed as rows
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
  const Deadline dl = Deadline::after_seconds(timeout_s);
  auto tk = t->by_rows
                ? worker->start_push_rows_pull(t->key, t->step, t->rows, t->grad, t->lr, t->out, dl)
                : worker->start_push_pull(t->key, t->step, t->grad, t->lr, t->out, dl);
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

namespace {

Result<std::unique_ptr<runtime::Kernel>> make_kernel(const graph::Node& n,
                                                     const std::vector<graph::TensorType>&) {
  const std::int64_t id = n.attrs.get_int_or("job", -1);
  WorkerJob::Impl* j = lookup(id);
  if (!j) return failed_precondition("{}: no parameter-server job registered as {}", n.label(), id);
  return std::unique_ptr<runtime::Kernel>(std::make_unique<PushPullKernel>(
      j, n.attrs.get_string_or("key", ""), static_cast<int>(n.attrs.get_int_or("priority", 0)),
      n.op == "ps_push_rows_pull" ? n.attrs.get_int_or("rows", 0) : 0));
}

}  // namespace

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
    // (ids, dy, lr) -> the table's new value: an embedding table's gradient
    // pushed as the rows the step touched.
    graph::OpDef r;
    r.name = "ps_push_rows_pull";
    r.min_inputs = 3;
    r.max_inputs = 3;
    r.attrs = {"job", "key", "priority", "rows"};
    r.random = true;
    r.infer =
        [](const graph::Node& n,
           const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
      SHOAL_ASSIGN_OR_RETURN(std::int64_t rows, n.attrs.get_int("rows"));
      if (in[0].dtype != DType::kI32 && in[0].dtype != DType::kI64)
        return invalid_argument("{}: ids must be i32 or i64, got {}", n.label(), in[0].str());
      if (in[1].dtype != DType::kF32 || in[1].shape.empty())
        return invalid_argument("{}: the gradient must be f32 [..., dim], got {}", n.label(),
                                in[1].str());
      if (!in[2].shape.empty())
        return invalid_argument("{}: lr must be a scalar, got {}", n.label(), in[2].str());
      return std::vector<graph::TensorType>{{DType::kF32, {rows, in[1].shape.back()}}};
    };
    graph::OpRegistry::global().add(r);
    runtime::KernelRegistry::cpu().add("ps_push_pull", make_kernel);
    runtime::KernelRegistry::cpu().add("ps_push_rows_pull", make_kernel);
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
    graph::Attrs a{
        {"job", job.impl().id}, {"key", p.name}, {"priority", -static_cast<std::int64_t>(i)}};
    // A table whose whole gradient is one embedding's scatter: the rows
    // that step touched go instead of the dense table (the scatter is then
    // dead code).
    const graph::Node& g = b.graph().node(p.grad.node);
    if (g.op == "embedding_grad") {
      a.set("rows", g.attrs.get_int_or("rows", 0));
      og.new_params.push_back(
          b.op("ps_push_rows_pull", {g.inputs[0], g.inputs[1], og.lr}, a, "ps/" + p.name));
      SHOAL_LOG_INFO("ps: '{}' (an embedding table) is pushed as the rows each step uses", p.name);
    } else {
      og.new_params.push_back(b.op("ps_push_pull", {p.grad, og.lr}, a, "ps/" + p.name));
    }
    if (!b.ok()) return b.status().with_context(fmt::format("push-pull of '{}'", p.name));
  }
  return og;
}

}  // namespace shoal::ps
