#include "ps/residuals.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "shoal/core/logging.h"
#include "shoal/train/checkpoint.h"

namespace shoal::ps {

namespace fs = std::filesystem;

std::string residuals_path(const std::string& dir, int worker, std::int64_t step) {
  return fmt::format("{}/ps-residuals-w{}-{:010d}.safetensors", dir, worker, step);
}

Status save_residuals(const ErrorFeedback& ef, const std::string& dir, int worker,
                      std::int64_t step, int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return unavailable("creating {}: {}", dir, ec.message());
  train::CheckpointState s;
  for (const auto& [k, t] : ef.residuals()) s.tensors[k] = t;
  s.meta["step"] = std::to_string(step);
  s.meta["worker"] = std::to_string(worker);
  s.meta["threshold"] = fmt::format("{}", ef.threshold());
  SHOAL_RETURN_IF_ERROR(train::save_checkpoint(residuals_path(dir, worker, step), s));
  // The newest `keep` of this worker's files stay (names sort by step).
  const std::string prefix = fmt::format("ps-residuals-w{}-", worker);
  std::vector<std::string> mine;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && n.ends_with(".safetensors")) mine.push_back(n);
  }
  std::sort(mine.begin(), mine.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(std::max(keep, 1)) < mine.size(); ++i)
    fs::remove(fs::path(dir) / mine[i], ec);
  return ok_status();
}

Status load_residuals(ErrorFeedback& ef, const std::string& dir, int worker, std::int64_t step,
                      bool required) {
  const std::string path = residuals_path(dir, worker, step);
  if (!fs::exists(path)) {
    if (required)
      return not_found("resume: worker {} has no 2-bit residuals for step {} ({})", worker, step,
                       path);
    SHOAL_LOG_WARN("resume: worker {} has no 2-bit residuals for step {} ({}): starting from zero",
                   worker, step, path);
    return ok_status();
  }
  SHOAL_ASSIGN_OR_RETURN(train::CheckpointState s, train::load_checkpoint(path));
  const std::string t = s.meta.count("threshold") ? s.meta.at("threshold") : "";
  if (t != fmt::format("{}", ef.threshold()))
    return failed_precondition("resume: {} holds residuals for threshold {}, this run has {}", path,
                               t, ef.threshold());
  SHOAL_RETURN_IF_ERROR(ef.restore(s.tensors).with_context(path));
  SHOAL_LOG_INFO("resume: worker {} restored 2-bit residuals of {} keys from {}", worker,
                 s.tensors.size(), path);
  return ok_status();
}

}  // namespace shoal::ps
