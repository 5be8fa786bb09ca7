#include "launch/members.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <thread>

#include "shoal/core/elastic_keys.h"

namespace shoal::launch {

namespace keys = elastic_keys;

namespace {

// The variables of a newcomer: its id for good, and that it joins.
Env newcomer_env(Env env, int id, int ranks) {
  env.insert(env.end(), {{"SHOAL_ELASTIC_ID", std::to_string(id)},
                         {"SHOAL_ELASTIC_JOIN", "1"},
                         {"SHOAL_RANK", "0"},
                         {"SHOAL_WORLD_SIZE", std::to_string(ranks)}});
  return env;
}

Seen ended(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {Seen::State::kEndedWell, "", 0};
  return {Seen::State::kFailed, describe(status), exit_code_of(status)};
}

}  // namespace

Seen LocalMembers::seen(int id) {
  const Proc& p = procs_.at(static_cast<std::size_t>(id));
  if (p.exited) return ended(p.status);
  if (is_stopped(p.pid)) return {Seen::State::kSilent, "was stopped (state T)", 0};
  return {};
}

bool LocalMembers::drop(int id) {
  kill(-procs_.at(static_cast<std::size_t>(id)).pid, SIGKILL);
  return true;
}

Status LocalMembers::start(int id, int ranks) {
  if (id != static_cast<int>(procs_.size()))
    return internal_error("rank id {} is not the next process ({})", id, procs_.size());
  auto e = newcomer_env(env_, id, ranks);
  e.insert(e.end(), {{"SHOAL_LOCAL_RANK", "0"}, {"SHOAL_LOCAL_WORLD_SIZE", std::to_string(ranks)}});
  SHOAL_ASSIGN_OR_RETURN(Proc p, spawn(cmd_, e, {}));
  procs_.push_back(p);
  frozen_.push_back(false);
  output_.add_rank();
  return ok_status();
}

RemoteMembers::RemoteMembers(std::vector<Proc>& procs, std::vector<bool>& frozen, Output& output,
                             Env env, std::vector<std::string> srun, std::vector<std::string> cmd,
                             int ranks, std::unique_ptr<net::Store> store, double lease_s)
    : procs_(procs),
      frozen_(frozen),
      output_(output),
      env_(std::move(env)),
      srun_(std::move(srun)),
      cmd_(std::move(cmd)),
      ranks_(ranks),
      store_(std::move(store)),
      lease_s_(lease_s) {}

Seen RemoteMembers::seen(int id) {
  Lease& l = leases_[id];
  const auto now = Clock::now();
  const bool ended =
      l.last.state == Seen::State::kEndedWell || l.last.state == Seen::State::kFailed;
  if (ended || (l.read != Clock::time_point{} && now - l.read < std::chrono::milliseconds(250)))
    return l.last;
  l.read = now;
  l.last = look(id, l);
  return l.last;
}

// What the rank recorded, what srun said, else its lease.
Seen RemoteMembers::look(int id, Lease& l) {
  if (auto rec = store_->peek(keys::exit(id)); rec.ok() && !rec->empty()) {
    const int code = std::atoi(rec->c_str());
    if (code == 0) return {Seen::State::kEndedWell, "", 0};
    return {Seen::State::kFailed, fmt::format("exited with code {}", code), code};
  }
  if (id < ranks_ && !procs_.empty()) {
    if (auto t = output_.task_ends().find(id); t != output_.task_ends().end()) {
      const auto at = t->second.find("exit code ");
      const int code = at != std::string::npos ? std::atoi(t->second.c_str() + at + 10) : 137;
      return {Seen::State::kFailed, t->second + " (said srun)", code};
    }
    if (procs_.at(0).exited)
      return {Seen::State::kFailed,
              fmt::format("ended with its srun step, which {}", describe(procs_.at(0).status)),
              exit_code_of(procs_.at(0).status)};
  } else if (auto u = unit_of_.find(id); u != unit_of_.end()) {
    const Proc& p = procs_.at(static_cast<std::size_t>(u->second));
    if (p.exited) {
      Seen s = ended(p.status);
      if (s.state == Seen::State::kFailed) s.why = "its srun step " + s.why;
      return s;
    }
  }
  const auto now = Clock::now();
  auto count = store_->peek(keys::alive(id));
  if (l.moved == Clock::time_point{} || (count.ok() && *count != l.count)) {
    if (count.ok()) l.count = *count;
    l.moved = now;
  }
  const double still = std::chrono::duration<double>(now - l.moved).count();
  if (still > lease_s_)
    return {Seen::State::kSilent,
            fmt::format("renewed no lease for {:.1f} s (stopped, hung or cut off)", still), 0,
            still};
  return {Seen::State::kRunning, "", 0, still};
}

bool RemoteMembers::drop(int id) {
  auto u = unit_of_.find(id);
  if (u == unit_of_.end()) return false;  // a task of the first step: out of reach
  kill(-procs_.at(static_cast<std::size_t>(u->second)).pid, SIGKILL);
  return true;
}

void RemoteMembers::release() {
  for (int round = 0; round < 2; ++round) {
    for (const Proc& p : procs_)
      if (!p.exited) kill(p.pid, SIGINT);
    if (round == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Status RemoteMembers::start(int id, int ranks) {
  if (srun_.empty())
    return failed_precondition(
        "rank id {} would replace a lost rank, but under --engine external whatever started "
        "the ranks starts replacements",
        id);
  std::vector<std::string> argv = srun_;
  // A step of one task. Inside an allocation it shares the first step's
  // cores (--overlap); it waits at most 30 s for them (--immediate).
  argv.insert(argv.begin() + 1, {"-n", "1", "--immediate=30"});
  if (std::getenv("SLURM_JOB_ID") != nullptr) argv.insert(argv.begin() + 1, "--overlap");
  argv.insert(argv.end(), cmd_.begin(), cmd_.end());
  SHOAL_ASSIGN_OR_RETURN(Proc p, spawn(argv, newcomer_env(env_, id, ranks), {}));
  const int unit = static_cast<int>(procs_.size());
  procs_.push_back(p);
  frozen_.push_back(false);
  output_.add_step(unit, id);
  unit_of_[id] = unit;
  return ok_status();
}

}  // namespace shoal::launch
