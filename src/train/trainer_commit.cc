// Trainer: the state kept in memory at every step boundary for an elastic
// job (TrainOptions::commit), and where the next generation starts from it.
// A step that fails mid-way may have updated some parameters and not
// others (the optimizer runs per gradient bucket as its all-reduce lands),
// so survivors continue from the copy taken before the step, not from the
// tensors they hold.
#include "shoal/core/logging.h"
#include "train/trainer_impl.h"

namespace shoal::train {

std::shared_ptr<const CheckpointState> Trainer::committed() const { return impl_->commit; }

Status Trainer::commit_step() {
  Impl& m = *impl_;
  if (m.layout || m.slices)
    return failed_precondition(
        "an elastic job keeps whole copies of the parameters and optimizer state: sharded "
        "(ZeRO) or sliced (--tp, --pp) state is not built for it");
  const bool first = m.commit == nullptr;
  if (first) m.commit = std::make_shared<CheckpointState>();
  auto keep = [&](const std::string& key, const Tensor& t) {
    Tensor& dst = m.commit->tensors[key];
    if (first)
      dst = t.clone();
    else
      copy_into(dst, t);
  };
  for (const auto& [n, t] : params_) keep("param/" + n, t);
  for (const auto& [n, t] : buffers_) keep("buf/" + n, t);
  for (const auto& [n, t] : state_) keep(n, t);
  describe_checkpoint(*m.commit);
  return ok_status();
}

}  // namespace shoal::train
