// Trainer: checkpoints (rank 0 writes, every rank's batch-norm statistics
// averaged first) and resuming from the newest one that verifies.
#include <filesystem>

#include "shoal/core/logging.h"
#include "shoal/runtime/kernel.h"
#include "shoal/train/checkpoint.h"
#include "shoal/train/text.h"
#include "train/trainer_impl.h"

namespace shoal::train {
namespace fs = std::filesystem;

Result<std::map<std::string, Tensor>> Trainer::buffers() {
  SHOAL_RETURN_IF_ERROR(sync_buffers());
  return buffers_;
}

Status Trainer::load_weights(const WeightsFile& w) {
  auto n = apply_weights(w, params_, buffers_);
  if (!n.ok()) return n.status();
  buffers_synced_at_ = -1;
  return ok_status();
}

Status Trainer::set_epochs(int epochs) {
  const std::int64_t spe = steps_per_epoch();
  if (epochs < 1 || spe * epochs < step_)
    return invalid_argument("epochs {}: the run is already at step {} of {} per epoch", epochs,
                            step_, spe);
  o_.epochs = epochs;
  impl_->sched.total = spe * epochs;
  return ok_status();
}

CheckpointDir Trainer::checkpoint_dir() const {
  return CheckpointDir((fs::path(dir_) / "checkpoints").string(), o_.keep_checkpoints);
}

std::map<std::string, TensorMeta> Trainer::checkpoint_metas() const {
  std::map<std::string, TensorMeta> all;
  // A sliced tensor's whole shape is its parameter's in the model.
  auto meta = [&](const std::string& param, const Tensor& t) {
    return TensorMeta{t.dtype(), sliced(param) ? whole_shape(param) : t.shape()};
  };
  for (const auto& [n, t] : params_) all["param/" + n] = meta(n, t);
  for (const auto& [n, t] : buffers_) all["buf/" + n] = TensorMeta{t.dtype(), t.shape()};
  if (!impl_->layout) {
    for (const auto& [n, t] : state_) all[n] = meta(state_param(n), t);
    return all;
  }
  // A sharded state: its logical tensors, and a pipeline stage's empty
  // holders of the other stages' state.
  for (const auto& [n, shape] : impl_->layout->logical)
    all[n] = TensorMeta{DType::kF32, sliced(state_param(n)) ? whole_shape(state_param(n)) : shape};
  for (const auto& [n, t] : state_)
    if (sliced(state_param(n))) all.try_emplace(n, meta(state_param(n), t));
  return all;
}

Status Trainer::checkpoint() {
  if (!o_.checkpoints) return ok_status();
  SHOAL_RETURN_IF_ERROR(sync_buffers());
  if (o_.on_checkpoint) SHOAL_RETURN_IF_ERROR(o_.on_checkpoint(checkpoint_dir().dir(), step_));
  // Who writes what is known before anything is gathered (rank 0 all of
  // it, or each rank its shard): every rank takes part in every gather and
  // keeps only what it writes, so no rank holds the whole model and state.
  const std::map<std::string, TensorMeta> all = checkpoint_metas();
  const int shards = o_.peers ? o_.world : 1;
  std::set<std::string> mine;
  if (o_.sharded_checkpoints)
    mine = checkpoint_shard_tensors(all, o_.rank, shards);
  else if (o_.rank == 0)
    for (const auto& [n, m] : all) mine.insert(n);
  auto keep = [&mine](const std::string& n) { return mine.count(n) != 0; };
  // A sharded optimizer state is saved as the logical per-parameter
  // tensors, which any layout can load; a sliced one's slice is kept for
  // its group's gather below.
  std::map<std::string, Tensor> logical;
  if (impl_->layout) {
    SHOAL_RETURN_IF_ERROR(impl_->layout->gather(
        state_, [&](const std::string& n) { return keep(n) || sliced(state_param(n)); }, logical));
    // A pipeline stage's empty holders of the other stages' state, so every
    // rank gathers the same names below.
    for (const auto& [n, t] : state_)
      if (sliced(state_param(n))) logical.try_emplace(n, t);
  }
  // Sliced parameters (tensor parallelism) and their state, whole.
  SHOAL_ASSIGN_OR_RETURN(auto whole, gather_slices(impl_->layout ? logical : state_, keep));
  CheckpointState s;
  auto add = [&](const std::string& n, const Tensor& t) {
    if (keep(n)) s.tensors[n] = t;
  };
  for (auto& [n, t] : params_)
    if (!sliced(n)) add("param/" + n, t);
  for (auto& [n, t] : buffers_) add("buf/" + n, t);
  for (auto& [n, t] : impl_->layout ? logical : state_)
    if (!sliced(state_param(n))) add(n, t);
  for (auto& [n, t] : whole) s.tensors[n] = t;
  std::size_t held = 0, total = 0;
  for (const auto& [n, t] : s.tensors) held += t.nbytes();
  for (const auto& [n, m] : all) total += m.nbytes();
  SHOAL_LOG_DEBUG("checkpoint at step {}: rank {} holds {} of the {} tensors ({} of {} bytes)",
                  step_, o_.rank, s.tensors.size(), all.size(), held, total);
  if (o_.sharded_checkpoints) {
    describe_checkpoint(s);
    return save_sharded(all, s);
  }
  Status wrote = ok_status();
  if (o_.rank == 0) {
    describe_checkpoint(s);
    wrote = check_listed(all, s.tensors, true, "checkpoint");
    if (wrote.ok()) {
      auto path = checkpoint_dir().save(step_, s);
      wrote = path.status();
      if (path.ok()) SHOAL_LOG_DEBUG("checkpoint {} (step {})", *path, step_);
    }
  }
  // Every rank learns whether the writer succeeded (one small sum), so all
  // stop together and the others name the cause: before, they went on to
  // the next step and met rank 0's exit as "the ranks' call sequences differ".
  if (o_.peers && o_.peers->collective() && o_.world > 1) {
    std::vector<double> v = {wrote.ok() ? 0.0 : 1.0};
    SHOAL_RETURN_IF_ERROR(o_.peers->sum(v).with_context("agreeing the checkpoint was written"));
    if (v[0] > 0 && wrote.ok())
      return unavailable(
          "checkpoint at step {}: rank 0 could not write it into {} (rank 0's "
          "error says why)",
          step_, checkpoint_dir().dir());
  }
  return wrote;
}

void Trainer::describe_checkpoint(CheckpointState& s) const {
  const std::int64_t spe = steps_per_epoch();
  s.meta["step"] = std::to_string(step_);
  s.meta["epoch"] = std::to_string(step_ / spe);
  s.meta["batch_in_epoch"] = std::to_string(step_ % spe);
  s.meta["seed"] = std::to_string(o_.seed);
  s.meta["model"] = o_.model;
  s.meta["optimizer"] = o_.optimizer;
  s.meta["batch"] = std::to_string(o_.batch);
  // What one step trains on, whatever the layout: a checkpoint continues in
  // any layout with the same global batch.
  s.meta["global_batch"] = std::to_string(o_.global());
  s.meta["world"] = std::to_string(o_.world);
  s.meta["threads"] = std::to_string(runtime::num_threads());
  s.meta["executable_step"] = std::to_string(impl_->exe->steps());
  // What evaluation and another tool need to use the weights, and how they
  // were trained.
  s.meta["input_mean"] = fmt::format("{}", impl_->mean);
  s.meta["input_std"] = fmt::format("{}", impl_->stddev);
  s.meta["data"] = o_.data;
  // A language model's vocabulary and size: what `shoal sample` rebuilds it from.
  if (impl_->train.tokens()) s.meta["vocab"] = vocab_to_hex(impl_->train.vocab);
  if (o_.model == "gpt") s.meta["gpt"] = o_.gpt.str();
  if (is_onnx_path(o_.model)) s.meta["onnx_tied"] = o_.onnx_tied ? "1" : "0";
  s.meta["lr"] = fmt::format("{}", o_.lr);
  s.meta["schedule"] = o_.schedule;
  s.meta["warmup_epochs"] = fmt::format("{}", o_.warmup_epochs);
  s.meta["epochs"] = std::to_string(o_.epochs);
  s.meta["linear_scaling"] = o_.linear_scaling ? "1" : "0";
  s.meta["momentum"] = fmt::format("{}", o_.momentum);
  s.meta["weight_decay"] = fmt::format("{}", o_.weight_decay);
}

// Each rank writes its shard into the partial directory; once every rank
// has, rank 0 writes the index and renames the directory into place. Every
// rank returns the same verdict.
Status Trainer::save_sharded(const std::map<std::string, TensorMeta>& listing,
                             const CheckpointState& s) {
  CheckpointDir cd = checkpoint_dir();
  const int n = o_.peers ? o_.world : 1;
  if (n > 1 && !o_.peers->collective())
    return failed_precondition("--sharded-checkpoints needs collective ranks (not --dist ps)");
  auto all = [&](bool failed) -> Result<int> {  // how many ranks failed; a barrier
    std::vector<double> v = {failed ? 1.0 : 0.0};
    if (n > 1) SHOAL_RETURN_IF_ERROR(o_.peers->sum(v));
    return static_cast<int>(v[0]);
  };
  const std::string part = cd.partial(step_);
  if (n > 1)  // the same tensors, so the same assignment, on every rank
    SHOAL_RETURN_IF_ERROR(o_.peers->agree("checkpoint tensors (names, dtypes, shapes)",
                                          checkpoint_layout_hash(listing)));
  std::error_code ec;
  if (o_.rank == 0) fs::remove_all(part, ec);  // left by a run that died mid-checkpoint
  SHOAL_RETURN_IF_ERROR(all(false).status());
  Status mine = save_checkpoint_shard(part, o_.rank, n, listing, s);
  SHOAL_ASSIGN_OR_RETURN(int failed, all(!mine.ok()));
  SHOAL_RETURN_IF_ERROR(mine);
  if (failed > 0)
    return unavailable("checkpoint at step {}: {} of {} ranks could not write their shard into {}",
                       step_, failed, n, part);
  Result<std::string> path = std::string();
  if (o_.rank == 0) {
    // Every shard must be in one directory: ranks on other hosts need a shared file system.
    Status idx = ok_status();
    for (int i = 0; i < n && idx.ok(); ++i)
      if (!fs::exists(fs::path(part) / checkpoint_shard_name(i, n), ec))
        idx = unavailable(
            "checkpoint at step {}: rank {} wrote its shard, but {} is not in {} "
            "(is {} on a file system every host shares?)",
            step_, i, checkpoint_shard_name(i, n), part, cd.dir());
    if (idx.ok()) idx = write_checkpoint_index(part, n, listing, s.meta);
    path = idx.ok() ? cd.publish(step_) : Result<std::string>(idx);
  }
  SHOAL_ASSIGN_OR_RETURN(failed, all(!path.ok()));
  SHOAL_RETURN_IF_ERROR(path.status());
  if (failed > 0) return unavailable("checkpoint at step {}: rank 0 could not publish it", step_);
  if (o_.rank == 0) SHOAL_LOG_DEBUG("checkpoint {} ({} shards, step {})", *path, n, step_);
  return ok_status();
}

Status Trainer::resume_latest() {
  CheckpointDir cd = checkpoint_dir();
  std::vector<std::string> refused;
  auto got = cd.load_latest(&refused);
  for (const auto& r : refused) SHOAL_LOG_WARN("resume: refused checkpoint: {}", r);
  if (!got.ok()) {
    if (cd.list().empty()) {
      SHOAL_LOG_INFO("resume: no checkpoint in {}; starting from step 0", cd.dir());
      return ok_status();
    }
    return got.status();
  }
  return restore(got->first, got->second);
}

// Continues from `s`, a checkpoint read from `path` or a state kept in
// memory (an elastic job's commit, "path" then says so).
Status Trainer::restore(const std::string& path, const CheckpointState& s) {
  auto want = [&](const char* key, const std::string& mine) -> Status {
    auto it = s.meta.find(key);
    std::string theirs = it == s.meta.end() ? "" : it->second;
    if (theirs != mine)
      return failed_precondition("resume: {} was written with {} '{}', this run has '{}'", path,
                                 key, theirs, mine);
    return ok_status();
  };
  SHOAL_RETURN_IF_ERROR(want("model", o_.model));
  SHOAL_RETURN_IF_ERROR(want("optimizer", o_.optimizer));
  if (s.meta.count("global_batch")) {
    if (s.meta.at("global_batch") != std::to_string(o_.global()))
      return failed_precondition(
          "resume: {} was written with a global batch of {} (per step, over all data-parallel "
          "ranks), this run has {} ({}): keep the global batch (--global-batch {} does)",
          path, s.meta.at("global_batch"), o_.global(),
          o_.global_batch > 0 ? fmt::format("--global-batch {}", o_.global_batch)
                              : fmt::format("--batch {} x {} data-parallel group{}", o_.batch,
                                            o_.data_shards(), o_.data_shards() == 1 ? "" : "s"),
          s.meta.at("global_batch"));
  } else {
    SHOAL_RETURN_IF_ERROR(want("batch", std::to_string(o_.batch)));  // written before global_batch
  }
  SHOAL_RETURN_IF_ERROR(want("seed", std::to_string(o_.seed)));
  // The GPT's shape settings: --heads 2 over a heads=4 checkpoint has the
  // same tensors and would have trained on silently as another model.
  if (o_.model == "gpt") SHOAL_RETURN_IF_ERROR(want("gpt", o_.gpt.str()));
  if (s.meta.count("onnx_tied"))  // tied or not, the model has other parameters
    SHOAL_RETURN_IF_ERROR(want("onnx_tied", o_.onnx_tied ? "1" : "0"));
  if (o_.deterministic)
    SHOAL_RETURN_IF_ERROR(want("threads", std::to_string(runtime::num_threads())));
  auto take = [&](const std::string& key, Tensor& dst) -> Status {
    auto it = s.tensors.find(key);
    if (it == s.tensors.end()) return data_loss("resume: {} has no tensor '{}'", path, key);
    if (it->second.shape() != dst.shape() || it->second.dtype() != dst.dtype())
      return data_loss("resume: {} tensor '{}' is {} {}, the model needs {} {}", path, key,
                       dtype_name(it->second.dtype()), shape_str(it->second.shape()),
                       dtype_name(dst.dtype()), shape_str(dst.shape()));
    copy_into(dst, it->second);
    return ok_status();
  };
  // Sliced parameters and their state are read whole; sync_from_lead cuts the slices.
  auto restore_whole = [&](const std::string& key, const std::string& param) -> Status {
    Tensor& t = impl_->resumed_whole[key] = Tensor::zeros(whole_shape(param), DType::kF32);
    return take(key, t);
  };
  for (auto& [n, t] : params_)
    SHOAL_RETURN_IF_ERROR(sliced(n) ? restore_whole("param/" + n, n) : take("param/" + n, t));
  for (auto& [n, t] : buffers_) SHOAL_RETURN_IF_ERROR(take("buf/" + n, t));
  if (impl_->layout) {                 // sync_from_lead gives each rank its shard of these
    for (const auto& [n, t] : state_)  // other pipeline stages' state (sliced: empty here)
      if (sliced(state_param(n)) && !impl_->layout->logical.count(n))
        SHOAL_RETURN_IF_ERROR(restore_whole(n, state_param(n)));
    for (const auto& [n, shape] : impl_->layout->logical) {
      if (sliced(state_param(n))) {  // sync_slices cuts this rank's slice first
        SHOAL_RETURN_IF_ERROR(restore_whole(n, state_param(n)));
        continue;
      }
      Tensor& t = impl_->resumed_state[n] = Tensor::zeros(shape, DType::kF32);
      SHOAL_RETURN_IF_ERROR(take(n, t));
    }
  } else {
    for (auto& [n, t] : state_)
      SHOAL_RETURN_IF_ERROR(sliced(state_param(n)) ? restore_whole(n, state_param(n)) : take(n, t));
  }
  step_ = s.get_int("step", 0);
  const std::int64_t spe = steps_per_epoch();
  impl_->loader->seek(step_ / spe, step_ % spe);
  impl_->exe->set_step(static_cast<std::uint64_t>(s.get_int("executable_step", step_)));
  SHOAL_LOG_INFO("resumed from {} at step {} (epoch {}, batch {})", path, step_, step_ / spe,
                 step_ % spe);
  return ok_status();
}

}  // namespace shoal::train
