// Trainer: parameters held as per-rank slices (TrainOptions::forward_pass,
// tensor parallelism). Each rank trains its slices; checkpoints hold the
// whole tensors, gathered from every rank, and a resume cuts each rank's
// slices from the whole tensors rank 0 read.
#include "shoal/train/trainer.h"
#include "train/trainer_impl.h"

namespace shoal::train {

bool Trainer::sliced(const std::string& param) const {
  return impl_->slices && impl_->slices->names.count(param) != 0;
}

Shape Trainer::whole_shape(const std::string& param) const {
  for (const auto& s : impl_->specs)
    if (s.name == param) return s.shape;
  return {};
}

Result<std::map<std::string, Tensor>> Trainer::gather_slices(
    const std::map<std::string, Tensor>& state,
    const std::function<bool(const std::string&)>& keep) {
  std::map<std::string, Tensor> whole;
  if (!impl_->slices) return whole;
  const auto& sl = *impl_->slices;
  // Each gather is collective: every rank runs them all, in one order, and
  // drops what it does not keep before the next.
  auto one = [&](const std::string& key, const std::string& param, const Tensor& mine) -> Status {
    SHOAL_ASSIGN_OR_RETURN(Tensor t, sl.gather(param, mine));
    if (keep(key)) whole[key] = std::move(t);
    return ok_status();
  };
  for (const auto& p : sl.names) SHOAL_RETURN_IF_ERROR(one("param/" + p, p, params_.at(p)));
  for (const auto& [name, t] : state)
    if (sliced(state_param(name))) SHOAL_RETURN_IF_ERROR(one(name, state_param(name), t));
  return whole;
}

Status Trainer::sync_slices(bool resumed) {
  Impl& m = *impl_;
  if (!m.slices || !resumed) return ok_status();  // fresh: every rank cut the same whole values
  auto take = [&](const std::string& key, const std::string& param, Tensor& dst) -> Status {
    Tensor& whole = m.resumed_whole[key];
    if (!whole.defined()) whole = Tensor::zeros(whole_shape(param), DType::kF32);
    SHOAL_RETURN_IF_ERROR(o_.peers->broadcast(whole));
    copy_into(dst, m.slices->slice(param, whole));
    return ok_status();
  };
  for (const auto& p : m.slices->names) SHOAL_RETURN_IF_ERROR(take("param/" + p, p, params_.at(p)));
  // The sliced state, in one order on every rank. A sharded state (ZeRO over
  // the data-parallel groups) is cut into this rank's slice of the logical
  // tensors, which sync_from_lead then shards; a pipeline stage's empty
  // holders of the others' state stay in state_.
  std::map<std::string, Tensor*> dst;
  for (auto& [name, t] : state_)
    if (sliced(state_param(name))) dst[name] = &t;
  if (m.layout)
    for (const auto& [name, shape] : m.layout->logical)
      if (sliced(state_param(name)))
        dst[name] = &(m.resumed_state[name] = Tensor::zeros(shape, DType::kF32));
  for (auto& [name, t] : dst) SHOAL_RETURN_IF_ERROR(take(name, state_param(name), *t));
  m.resumed_whole.clear();
  return ok_status();
}

// A pipeline stage holds some parameters and none of the others' state: it
// keeps empty tensors under those names, so every rank lists the same
// state and gathers and scatters it in the same order. Every parameter has
// the same slots (one optimizer).
void Trainer::hold_empty_state(const OptimizerGraph& og) {
  if (!impl_->slices) return;
  std::set<std::string> slots;
  for (const auto& s : og.state) slots.insert(s.name.substr(s.name.rfind('/') + 1));
  for (const auto& [name, t] : params_)
    if (t.numel() == 0)
      for (const auto& slot : slots)
        state_.try_emplace(fmt::format("opt/{}/{}", name, slot), Tensor::empty({0}, DType::kF32));
}

// How many ranks score each batch: the mean over them is the job's.
Status Trainer::count_reporters() {
  Impl& m = *impl_;
  std::vector<double> v = {!m.slices || m.slices->reports ? 1.0 : 0.0};
  if (o_.peers) SHOAL_RETURN_IF_ERROR(o_.peers->sum(v).with_context("counting scoring ranks"));
  m.report_copies = v[0] / o_.data_shards();
  if (m.report_copies <= 0) return internal_error("no rank computes the model's logits");
  return ok_status();
}

}  // namespace shoal::train
