// Trainer: the state kept in memory at every step boundary for an elastic
// job (TrainOptions::commit), and where the next generation starts from it.
// A step that fails mid-way may have updated some parameters and not
// others (the optimizer runs per gradient bucket as its all-reduce lands,
// in place), so survivors continue from the last copy, not from the
// tensors they hold.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "shoal/core/logging.h"
#include "train/trainer_impl.h"

namespace shoal::train {

namespace {

// The copy's stores go round the caches (non-temporal): the copy is read
// only if a peer is lost, and ordinary stores of the model's bytes would
// evict the step's own working set, a cost the next steps pay that the
// copy's measured time does not show. (Measured without faults, 4 ranks of
// the MLP: 0.99 and 0.94 of a clean job in two runs; the run-to-run spread
// hides what this saves.)
void copy_around_caches(Tensor& dst, const Tensor& src) {
  auto* d = static_cast<std::uint8_t*>(dst.raw_data());
  const auto* s = static_cast<const std::uint8_t*>(src.raw_data());
  std::size_t n = dst.nbytes();
#if defined(__AVX512F__)
  if (n >= (1u << 16) && reinterpret_cast<std::uintptr_t>(d) % 64 == 0) {
    const std::size_t whole = n & ~static_cast<std::size_t>(255);
    for (std::size_t i = 0; i < whole; i += 256)
      for (std::size_t k = 0; k < 256; k += 64)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i + k), _mm512_loadu_si512(s + i + k));
    _mm_sfence();
    d += whole;
    s += whole;
    n -= whole;
  }
#endif
  std::memcpy(d, s, n);
}

}  // namespace

// Plain data parallelism keeps no copy: its updates wait until every
// all-reduce of the step has landed (runtime::Executable::hold_writes), so
// a step that fails in one (a peer lost) wrote nothing, and one that got
// past them finishes on this rank without a peer. Either way the live
// tensors are the state after a whole step, and a fault loses only the
// step in flight. Not for sharded (ZeRO) or sliced state, whose shards die
// with their rank, nor for running statistics, which the forward updates
// in place and a checkpoint averages over ranks: those keep copies.
void Trainer::hold_updates() {
  Impl& m = *impl_;
  if (!o_.commit || o_.commit_every > 0 || m.layout || !buffers_.empty() ||
      (m.slices && !m.slices->names.empty()))
    return;
  Status st = m.exe->hold_writes(m.update_outputs);
  m.live = st.ok();
  if (!st.ok()) SHOAL_LOG_DEBUG("elastic: the state is copied: {}", st.message());
}

std::shared_ptr<const CheckpointState> Trainer::committed() const {
  const Impl& m = *impl_;
  if (!m.live) return m.commit;
  if (!m.live_from) return nullptr;  // failed in the start-up: the state carried in holds
  if (m.in_step && m.exe->held_written()) {
    SHOAL_LOG_WARN(
        "elastic: step {} failed after its updates began; going on from the state this "
        "generation started from",
        step_ + 1);
    return nullptr;
  }
  auto s = std::make_shared<CheckpointState>();
  for (const auto& [n, t] : params_) s->tensors["param/" + n] = t.clone();
  for (const auto& [n, t] : state_) s->tensors[n] = t.clone();
  describe_checkpoint(*s);
  return s;
}

bool Trainer::commit_due(double step_seconds) const {
  const Impl& m = *impl_;
  if (m.live) return false;
  if (!m.commit) return true;
  const std::int64_t since = step_ - m.commit_at;
  if (o_.commit_every > 0) return since >= o_.commit_every;
  // About 2%: a copy every ceil(copy / (0.02 x step)) steps. Measured
  // (bench/elastic.py, the MLP at 4 ranks on 2 cores): a copy of its 4.3 MB
  // of weights and momentum after every step made training 1.5x slower.
  const double every = std::ceil(m.commit_seconds / (0.02 * std::max(step_seconds, 1e-6)));
  return static_cast<double>(since) >= std::clamp(every, 1.0, 1000.0);
}

Status Trainer::commit_step() {
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  if (m.slices && !m.slices->names.empty())  // accumulation's step pass slices nothing
    return failed_precondition(
        "an elastic job keeps whole copies of the parameters and optimizer state: sliced "
        "(--tp, --pp) state is not built for it");
  // A sharded (ZeRO-1/2) optimizer state is kept whole, as a checkpoint
  // holds it: the shard of a rank that dies is gone with it, and the next
  // generation cuts its own shards (of another world size) from the whole.
  // The gather is collective, so every rank commits at the same steps (the
  // step's vote carries the decision). Gathered first, kept after: a peer
  // lost mid-gather leaves the last copy whole.
  std::map<std::string, Tensor> logical;
  if (m.layout)
    SHOAL_RETURN_IF_ERROR(
        m.layout
            ->gather(
                state_, [](const std::string&) { return true; }, logical)
            .with_context("gathering the optimizer state's shards for the elastic copy"));
  // Batch-norm running statistics differ per rank; a checkpoint holds
  // their mean over ranks (sync_buffers), and so does the copy, so the next
  // generation starts where a checkpoint and a resume would. The live ones
  // are left as they are: training goes on as it would without the copy.
  std::map<std::string, Tensor> mean_buffers;
  if (o_.peers && o_.peers->collective() && o_.world > 1)
    for (const auto& [n, t] : buffers_) {
      Tensor& c = mean_buffers[n] = t.clone();
      SHOAL_RETURN_IF_ERROR(
          o_.peers->average(c).with_context("averaging the running statistics for the copy"));
    }
  const bool first = m.commit == nullptr;
  if (first) m.commit = std::make_shared<CheckpointState>();
  auto keep = [&](const std::string& key, const Tensor& t) {
    Tensor& dst = m.commit->tensors[key];
    if (first)
      dst = t.clone();
    else
      copy_around_caches(dst, t);
  };
  for (const auto& [n, t] : params_) keep("param/" + n, t);
  for (const auto& [n, t] : buffers_)
    keep("buf/" + n, mean_buffers.empty() ? t : mean_buffers.at(n));
  if (m.layout)
    for (auto& [n, t] : logical) m.commit->tensors[n] = std::move(t);  // fresh from the gather
  else
    for (const auto& [n, t] : state_) keep(n, t);
  describe_checkpoint(*m.commit);
  m.commit_at = step_;
  m.commit_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ok_status();
}

}  // namespace shoal::train
