#include "shoal/ps/shard.h"

#include <algorithm>
#include <vector>

#include "ps/shard_key.h"
#include "shoal/core/logging.h"
#include "shoal/graph/builder.h"
#include "shoal/runtime/backend.h"

namespace shoal::ps {

Result<Mode> parse_mode(const std::string& s) {
  if (s == "sync") return Mode::kSync;
  if (s == "async") return Mode::kAsync;
  if (s == "bounded") return Mode::kBounded;
  return invalid_argument("parameter-server mode '{}' is not one of sync, async, bounded", s);
}

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kSync:
      return "sync";
    case Mode::kAsync:
      return "async";
    case Mode::kBounded:
      return "bounded";
  }
  return "?";
}

const char* push_result_name(PushResult r) {
  switch (r) {
    case PushResult::kApplied:
      return "applied";
    case PushResult::kCollected:
      return "collected";
    case PushResult::kClosed:
      return "closed";
    case PushResult::kDuplicate:
      return "duplicate";
    case PushResult::kWait:
      return "wait";
  }
  return "?";
}

Status check_options(const ShardOptions& o) {
  if (o.staleness < 0) return invalid_argument("--staleness {} must be >= 0", o.staleness);
  if (o.mode == Mode::kBounded && o.staleness == 0)
    return invalid_argument(
        "--staleness 0 under --ps-mode bounded would let no worker run ahead of the others, "
        "not even by the step it is on, so every worker would wait forever: use --ps-mode sync "
        "for lockstep rounds, or --staleness 1 or more");
  return ok_status();
}

Result<std::unique_ptr<Shard>> Shard::create(const ShardOptions& o) {
  SHOAL_RETURN_IF_ERROR(train::validate(o.optimizer).with_context("server optimizer"));
  if (!(o.lr > 0)) return invalid_argument("server learning rate {} must be > 0", o.lr);
  SHOAL_RETURN_IF_ERROR(check_options(o));
  train::register_optimizer_ops();
  std::unique_ptr<Shard> s(new Shard());
  s->o_ = o;
  return s;
}

Shard::~Shard() = default;

Status Shard::init(const std::string& key, const Tensor& value) {
  if (value.dtype() != DType::kF32)
    return invalid_argument("key '{}': initial value is {}, servers hold f32", key,
                            dtype_name(value.dtype()));
  if (auto it = keys_.find(key); it != keys_.end()) {
    if (it->second->value.shape() != value.shape())
      return invalid_argument("key '{}' is {} on this server, initialized again as {}", key,
                              shape_str(it->second->value.shape()), shape_str(value.shape()));
    return ok_status();
  }
  auto k = std::make_unique<Key>();
  k->name = key;
  k->value = value.contiguous().clone();
  // The update step as a graph of the training optimizer's fused op.
  graph::Graph g;
  graph::Builder b(g);
  graph::Value p = b.input("param", DType::kF32, value.shape());
  graph::Value gr = b.input("grad", DType::kF32, value.shape());
  SHOAL_ASSIGN_OR_RETURN(train::OptimizerGraph og,
                         train::append_optimizer(b, o_.optimizer, {{key, p, gr}}));
  if (!b.ok()) return b.status().with_context(fmt::format("key '{}': server optimizer", key));
  g.mark_output(og.new_params[0]);
  for (const auto& st : og.state) {
    k->state[st.name] = Tensor::zeros(g.type(st.input).shape, DType::kF32);
    k->state_order.push_back(st.name);
    g.mark_output(st.output);
  }
  SHOAL_ASSIGN_OR_RETURN(auto backend, runtime::make_backend("cpu"));
  SHOAL_ASSIGN_OR_RETURN(k->update, backend->compile(std::move(g), {}));
  k->sum = Tensor::zeros(value.shape(), DType::kF32);
  k->lr = Tensor::scalar(o_.lr);
  SHOAL_RETURN_IF_ERROR(k->update->bind("param", k->value));
  SHOAL_RETURN_IF_ERROR(k->update->bind("grad", k->sum));
  SHOAL_RETURN_IF_ERROR(k->update->bind("lr", k->lr));
  if (og.step.valid()) {
    k->opt_step = Tensor::scalar(0.0);
    SHOAL_RETURN_IF_ERROR(k->update->bind("opt_step", k->opt_step));
  }
  for (auto& [n, t] : k->state) SHOAL_RETURN_IF_ERROR(k->update->bind(n, t));
  // Outputs written over the value and state where the executable proves
  // that safe (the update kernels work element-wise); the rest are copied.
  k->copy_out.push_back(!k->update->bind_output(0, k->value).ok());
  for (std::size_t i = 0; i < k->state_order.size(); ++i)
    k->copy_out.push_back(
        !k->update->bind_output(static_cast<int>(i + 1), k->state.at(k->state_order[i])).ok());
  keys_[key] = std::move(k);
  return ok_status();
}

Status Shard::add_worker(int worker) {
  if (worker < 0) return invalid_argument("worker id {} must be >= 0", worker);
  live_.insert(worker);
  step_.emplace(worker, 0);
  return ok_status();
}

Status Shard::remove_worker(int worker) {
  if (!live_.erase(worker)) return not_found("worker {} is not a member of this server", worker);
  for (auto& [name, k] : keys_) k->waits_for.erase(worker);
  return close_ready_rounds();
}

void Shard::sent(int worker, const std::string& key, std::uint64_t version) {
  sent_[{worker, key}] = version;
}

double Shard::stale_rate(int worker, const Key& k, double lr) {
  const double base = lr > 0 ? lr : o_.lr;
  auto it = sent_.find({worker, k.name});
  if (it == sent_.end() || it->second > k.version) return base;
  const std::uint64_t tau = k.version - it->second;
  stats_.staleness_sum += tau;
  ++stats_.staleness_pushes;
  return o_.stale_lr && tau > 1 ? base / static_cast<double>(tau) : base;
}

// The update with the gradient bound as "grad" (k.sum, the mean of a sync
// round, unless the caller bound another) through the training kernels;
// the outputs replace value and state.
Status Shard::apply(Key& k, double lr) {
  k.lr.data<float>()[0] = static_cast<float>(lr > 0 ? lr : o_.lr);
  if (k.opt_step.defined()) k.opt_step.data<float>()[0] = static_cast<float>(k.version + 1);
  SHOAL_RETURN_IF_ERROR(k.update->run().with_context(fmt::format("updating key '{}'", k.name)));
  if (k.copy_out[0]) SHOAL_RETURN_IF_ERROR(k.value.copy_from(k.update->output(0)));
  for (std::size_t i = 0; i < k.state_order.size(); ++i)
    if (k.copy_out[i + 1])
      SHOAL_RETURN_IF_ERROR(
          k.state.at(k.state_order[i]).copy_from(k.update->output(static_cast<int>(i + 1))));
  ++k.version;
  ++stats_.applied;
  return ok_status();
}

Status Shard::close_ready_rounds() {
  for (auto& [name, k] : keys_) {
    if (k->pushed.empty()) continue;
    const bool all =
        std::includes(k->pushed.begin(), k->pushed.end(), k->waits_for.begin(), k->waits_for.end());
    if (!all) continue;
    // The mean over the workers that pushed (a worker that left mid-round
    // after pushing still counts: its gradient is in the sum), in place:
    // one pass over the key, none for a single worker.
    if (k->pushed.size() > 1) {
      float* m = k->sum.data<float>();
      const float inv = 1.0f / static_cast<float>(k->pushed.size());
      const std::int64_t n = k->sum.numel();
      for (std::int64_t i = 0; i < n; ++i) m[i] *= inv;
    }
    SHOAL_RETURN_IF_ERROR(apply(*k, k->round_lr));
    stats_.round_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - k->opened).count();
    k->pushed.clear();
    k->waits_for.clear();
    ++stats_.rounds;
  }
  return ok_status();
}

Result<PushResult> Shard::push(int worker, const std::string& key, std::int64_t step,
                               std::uint64_t seq, const Tensor& grad, double lr) {
  if (!live_.count(worker))
    return failed_precondition("push from worker {}, which is not a member of this server", worker);
  auto it = keys_.find(key);
  if (it == keys_.end())
    return not_found("worker {} pushed key '{}', which this server does not hold", worker, key);
  Key& k = *it->second;
  if (grad.dtype() != DType::kF32 || grad.shape() != k.value.shape())
    return invalid_argument("worker {} pushed key '{}' as {} {}; the key is f32 {}", worker, key,
                            dtype_name(grad.dtype()), shape_str(grad.shape()),
                            shape_str(k.value.shape()));
  auto& mark = mark_[worker];
  if (seq <= mark) {
    ++stats_.duplicates;
    return PushResult::kDuplicate;
  }
  std::int64_t& last = step_[worker];
  if (o_.mode == Mode::kBounded) {
    std::int64_t slowest = step;
    for (int w : live_) slowest = std::min(slowest, step_[w]);
    if (step - slowest > o_.staleness) return PushResult::kWait;
  }
  if (o_.mode != Mode::kSync) {
    // The push itself is the update's gradient (no copy); k.sum is bound
    // back after, so the executable keeps no caller's buffer.
    SHOAL_RETURN_IF_ERROR(k.update->bind("grad", grad));
    Status st = apply(k, stale_rate(worker, k, lr));
    SHOAL_RETURN_IF_ERROR(k.update->bind("grad", k.sum));
    SHOAL_RETURN_IF_ERROR(st);
    mark = seq;
    last = std::max(last, step);
    ++stats_.pushes;
    ++stats_.by_worker[worker];
    return PushResult::kApplied;
  }
  const auto round = static_cast<std::int64_t>(k.version);
  if (step != round)
    return failed_precondition(
        "worker {} pushed key '{}' for step {}, but the open round is step {}{}", worker, key, step,
        round, step < round ? " (that round closed)" : " (that round has not opened)");
  if (k.pushed.count(worker))
    return failed_precondition("worker {} already pushed key '{}' for step {} (sequence {} now)",
                               worker, key, step, seq);
  if (k.pushed.empty()) {
    k.opened = std::chrono::steady_clock::now();
    k.waits_for = live_;
    // The round's sum reuses its buffer: a fresh one per round costs page
    // faults and zeroing (16% of a 16 MiB push-pull's time, perf).
    SHOAL_RETURN_IF_ERROR(k.sum.copy_from(grad));
    k.round_lr = lr;
  } else {
    float* s = k.sum.data<float>();
    const Tensor g = grad.contiguous();
    const float* d = g.data<float>();
    const std::int64_t n = k.sum.numel();
    for (std::int64_t i = 0; i < n; ++i) s[i] += d[i];
  }
  k.pushed.insert(worker);
  mark = seq;
  last = std::max(last, step);
  ++stats_.pushes;
  ++stats_.by_worker[worker];
  const std::uint64_t before = k.version;
  SHOAL_RETURN_IF_ERROR(close_ready_rounds());
  return k.version != before ? PushResult::kClosed : PushResult::kCollected;
}

Result<std::pair<std::uint64_t, Tensor>> Shard::pull(const std::string& key) const {
  auto it = keys_.find(key);
  if (it == keys_.end()) return not_found("key '{}' is not held by this server", key);
  return std::pair{it->second->version, it->second->value.clone()};
}

Result<std::pair<std::uint64_t, const Tensor*>> Shard::peek(const std::string& key) const {
  auto it = keys_.find(key);
  if (it == keys_.end()) return not_found("key '{}' is not held by this server", key);
  return std::pair<std::uint64_t, const Tensor*>{it->second->version, &it->second->value};
}

std::int64_t Shard::lag(int worker) const {
  std::int64_t top = 0;
  for (int w : live_) top = std::max(top, step_.at(w));
  auto it = step_.find(worker);
  return it == step_.end() ? 0 : top - it->second;
}

}  // namespace shoal::ps
