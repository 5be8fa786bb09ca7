// The job's output as the launcher sees it: each rank's lines printed
// with "[rank r] " and the last ones kept for the report, engine-tagged
// lines untagged, and what the engine says about a failed or cancelled
// job. Private to launch; used by the launcher's poll loop (one thread).
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace shoal::launch {

// Output of the job, per rank: lines are printed with "[rank r] " and the
// last ones kept for the report. Engines tag lines with their rank
// (mpirun --tag-output "[1,r]<stdout>:", srun --label "r: ").
class Output {
 public:
  Output(int ranks, std::string engine)
      : tails_(static_cast<std::size_t>(ranks)), engine_(std::move(engine)) {}
  // Local processes with names of their own ("server 0", "worker 1").
  explicit Output(std::vector<std::string> labels)
      : tails_(labels.size()), engine_("local"), labels_(std::move(labels)) {}
  // One more rank (a replacement in an elastic data-parallel job).
  void add_rank() { tails_.emplace_back(); }
  // Under srun: process `unit` is a step of one task, rank id `id` of an
  // elastic job (its lines, tagged "0: ", are that rank's).
  void add_step(int unit, int id) {
    unit_ids_[unit] = id;
    if (static_cast<std::size_t>(id) >= tails_.size())
      tails_.resize(static_cast<std::size_t>(id) + 1);
  }
  // One more local process (an elastic job's new worker).
  void add_label(std::string label) {
    labels_.push_back(std::move(label));
    tails_.emplace_back();
  }
  void line(int unit, const std::string& l) {
    int rank = unit;
    std::string text = l;
    if (engine_ != "local") std::tie(rank, text) = untag(l);
    if (auto u = unit_ids_.find(unit); u != unit_ids_.end() && rank >= 0) rank = u->second;
    // srun's word on each task of the first step that ended badly.
    if (engine_ == "srun" && rank < 0 && unit == 0)
      for (auto& [task, how] : srun_task_ends(text)) task_ends_.emplace(task, how);
    if (rank >= 0 && rank < static_cast<int>(tails_.size())) {
      if (labels_.empty())
        fmt::print("[rank {}] {}\n", rank, text);
      else
        fmt::print("[{}] {}\n", labels_[static_cast<std::size_t>(rank)], text);
      // The first rank `shoal run-rank` saw fail (the others follow it).
      if (auto t = text.find("shoal-rank-exit: rank "); t != std::string::npos && !first_exit_) {
        std::size_t sp = text.find(' ', t + 22);
        if (sp != std::string::npos)
          first_exit_ = std::pair{std::atoi(text.c_str() + t + 22), text.substr(sp + 1)};
      }
      keep(tails_[static_cast<std::size_t>(rank)], text);
    } else {
      fmt::print("[{}] {}\n", engine_, text);
      keep(engine_tail_, text);
    }
    // Slurm's words for a step stopped from outside (scancel, a time
    // limit, a preemption); they also follow a rank's failure under
    // --kill-on-bad-exit, where srun names that rank as well.
    if (text.find("CANCELLED AT") != std::string::npos ||
        text.find("Job step aborted") != std::string::npos ||
        text.find("DUE TO TIME LIMIT") != std::string::npos ||
        text.find("DUE TO PREEMPTION") != std::string::npos)
      if (cancel_line_.empty()) cancel_line_ = text;
  }
  // The engine's line saying the job was stopped from outside, "" if none.
  const std::string& cancel_line() const { return cancel_line_; }
  const std::deque<std::string>& tail(int rank) const {
    return tails_.at(static_cast<std::size_t>(rank));
  }
  const std::deque<std::string>& engine_tail() const { return engine_tail_; }
  const std::optional<std::pair<int, std::string>>& first_rank_exit() const { return first_exit_; }
  // Tasks of the first srun step that srun said ended badly: task -> how
  // ("killed", "exited with exit code 3").
  const std::map<int, std::string>& task_ends() const { return task_ends_; }
  // "srun: error: n1: tasks 0-1,3: Killed" -> {0,1,3} each "killed"; {} for other lines.
  static std::vector<std::pair<int, std::string>> srun_task_ends(const std::string& line);

 private:
  static void keep(std::deque<std::string>& t, const std::string& l) {
    t.push_back(l);
    if (t.size() > 10) t.pop_front();
  }
  std::pair<int, std::string> untag(const std::string& l) const {
    if (engine_ == "mpirun" && l.rfind("[1,", 0) == 0) {
      std::size_t close = l.find(']');
      std::size_t colon = l.find(">:", close);
      if (close != std::string::npos && colon != std::string::npos)
        return {std::atoi(l.c_str() + 3), l.substr(colon + 2)};
    }
    if (engine_ == "srun") {
      std::size_t i = l.find_first_not_of(' ');
      std::size_t colon = l.find(": ");
      if (i != std::string::npos && colon != std::string::npos && colon > i &&
          l.find_first_not_of("0123456789", i) == colon)
        return {std::atoi(l.c_str() + i), l.substr(colon + 2)};
    }
    return {-1, l};
  }
  std::vector<std::deque<std::string>> tails_;
  std::deque<std::string> engine_tail_;
  std::string engine_;
  std::vector<std::string> labels_;
  std::optional<std::pair<int, std::string>> first_exit_;
  std::string cancel_line_;
  std::map<int, int> unit_ids_;           // process -> rank id (srun steps of one task)
  std::map<int, std::string> task_ends_;  // task of the first step -> how it ended
};

// For single-process engines: which rank the engine says failed, if any.
std::optional<std::pair<int, std::string>> engine_failure(const Output& out);

}  // namespace shoal::launch
