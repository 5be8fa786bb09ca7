#include "launch/attempt.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "launch/elastic_coordinator.h"
#include "launch/members.h"
#include "launch/output.h"
#include "launch/process.h"
#include "shoal/core/cpus.h"
#include "shoal/core/env.h"
#include "shoal/net/store.h"

namespace shoal::launch {
namespace {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

// --bind cores: each rank's CPUs (said once per job); empty when the
// launcher cannot read its own (said too).
std::vector<std::vector<int>> rank_cpus(int ranks, bool say) {
  auto cpus = allowed_cpus();
  if (!cpus.ok()) {
    fmt::print(stderr, "shoal run: --bind cores: {}\n", cpus.status().message());
    return {};
  }
  std::vector<std::vector<int>> blocks = cpu_blocks(*cpus, ranks);
  if (say) {
    std::string each;
    for (int r = 0; r < ranks; ++r)
      each += fmt::format("{}rank {}: {}", r ? ", " : "", r,
                          cpu_list(blocks[static_cast<std::size_t>(r)]));
    fmt::print(stderr, "shoal run: {} ranks bound to {} CPUs ({}): {}\n", ranks, cpus->size(),
               cpu_list(*cpus), each);
  }
  return blocks;
}

// An elastic job's address for `shoal join` (write_job_env), said aloud.
Status publish_job_env(const std::string& dir, const Env& env) {
  SHOAL_RETURN_IF_ERROR(write_job_env(dir, env).with_context("writing the elastic job's job.env"));
  fmt::print(stderr, "shoal run: --elastic: more ranks join with `shoal join --job {}`\n", dir);
  return ok_status();
}

class Attempt {
 public:
  Attempt(const LaunchOptions& o, int attempt)
      : o_(o), attempt_(attempt), output_(o.ranks, o.engine) {}

  Outcome run(const std::string& job_id, const std::string& trace_prefix) {
    if (!prepare(job_id, trace_prefix) || !spawn_ranks()) return oc_;
    supervise();
    for (std::size_t i = 0; i < procs_.size(); ++i)
      drain(static_cast<int>(i), procs_[i], output_, true);
    if (elastic_ && why_.empty()) {
      oc_.code = elastic_->finish(*members_, o_.ranks);
      return oc_;
    }
    if (why_.empty()) return oc_;
    report();
    return oc_;
  }

 private:
  // The rendezvous store, the ranks' environment and, under --elastic, the
  // coordinator of the job's generations. False (oc_ set) if one failed.
  bool prepare(const std::string& job_id, const std::string& trace_prefix);
  // Starts the ranks under the engine; false (oc_ set) if one could not be.
  bool spawn_ranks();
  bool start(const std::vector<std::string>& argv, const Env& e, const std::vector<int>& cpus = {});
  // Under --elastic: what the coordinator sees of the ranks (launch/members.h).
  bool watch_members(const std::vector<std::string>& srun);
  // Watches the processes until all have ended, stopping them all when one
  // fails, the launcher is signalled or --timeout passes.
  void supervise();
  void reap(int* alive);
  void stop_all(int sig) {
    for (auto& p : procs_)
      if (!p.exited) kill(-p.pid, sig);
  }
  void begin_stop(std::string reason);
  // Says which rank failed and how the others ended; sets oc_.
  void report();
  std::string engine_why(int* failed_rank, int* rank_code, bool* cancelled);

  const LaunchOptions& o_;
  const int attempt_;
  Outcome oc_;
  std::unique_ptr<net::TcpStoreServer> store_;
  std::string token_;  // the job's, which every store client proves
  Env env_;
  std::unique_ptr<ElasticCoordinator> elastic_;
  std::unique_ptr<Members> members_;
  bool released_ = false;  // what remained of an elastic job that finished was ended
  std::vector<Proc> procs_;
  Output output_;
  std::vector<bool> frozen_;
  int failed_ = -1;  // first process that failed
  std::string why_;
  bool stopping_ = false;
  int interrupted_ = 0;  // the signal that stopped the launcher, if one did
  Clock::time_point kill_at_{};
};

bool Attempt::prepare(const std::string& job_id, const std::string& trace_prefix) {
  // Ranks started elsewhere (--engine external) may hold the job's token
  // already (a Kubernetes Secret): the launcher takes it from its own
  // environment then.
  const char* given = o_.engine == "external" ? std::getenv("SHOAL_JOB_TOKEN") : nullptr;
  const std::string token = token_ = given && *given ? given : random_hex(16);
  auto store = net::TcpStoreServer::start(o_.store_host, o_.store_port, token);
  if (!store.ok()) {
    fmt::print(stderr, "shoal run: cannot start the rendezvous store on {}:{}: {}{}\n",
               o_.store_host, o_.store_port, store.status().message(),
               o_.store_port != 0 ? " (choose another --store-port, or 0 for any free port)" : "");
    oc_.code = 2;
    return false;
  }
  store_ = std::move(store).value();
  std::string host =
      o_.store_host.find(':') != std::string::npos ? "[" + o_.store_host + "]" : o_.store_host;
  env_ = {
      {"SHOAL_STORE", fmt::format("{}:{}", host, store_->port())},
      {"SHOAL_JOB_TOKEN", token},
      {"SHOAL_JOB_ID", job_id},
      {"SHOAL_RESTART_COUNT", std::to_string(attempt_)},
      {"SHOAL_PLAIN_OUTPUT", "1"},
  };
  if (!trace_prefix.empty()) env_.emplace_back("SHOAL_TRACE", trace_prefix);
  // --bind layout: each `shoal train` rank binds itself once it knows its
  // place in the layout (dist/layout_binding.h).
  if (o_.bind == "layout") env_.emplace_back("SHOAL_BIND", "layout");
  if (o_.elastic_min <= 0) return true;
  env_.emplace_back("SHOAL_ELASTIC", std::to_string(o_.elastic_min));
  const int max = std::max(o_.elastic_max, o_.ranks);
  env_.emplace_back("SHOAL_ELASTIC_MAX", std::to_string(max));
  auto c = ElasticCoordinator::for_launcher(store_->host(), store_->port(), token, o_.ranks,
                                            o_.elastic_min, max, o_.max_restarts,
                                            o_.engine == "external");
  if (c.ok()) {
    Status st = publish_job_env(o_.job_dir.empty() ? "runs/job-" + job_id : o_.job_dir, env_);
    if (!st.ok()) c = st;
  }
  if (!c.ok()) {
    fmt::print(stderr, "shoal run: --elastic: {}\n", c.status().message());
    oc_.code = 2;
    return false;
  }
  elastic_ = std::move(c).value();
  return true;
}

bool Attempt::start(const std::vector<std::string>& argv, const Env& e,
                    const std::vector<int>& cpus) {
  auto p = spawn(argv, e, cpus);
  if (!p.ok()) {
    fmt::print(stderr, "shoal run: {}\n", p.status().message());
    for (auto& q : procs_) {
      kill(-q.pid, SIGKILL);
      waitpid(q.pid, nullptr, 0);
    }
    oc_.code = 127;
    return false;
  }
  procs_.push_back(*p);
  return true;
}

bool Attempt::spawn_ranks() {
  if (o_.engine == "external") {
    fmt::print(stderr,
               "shoal run: --engine external: waiting for {} ranks, each started elsewhere with "
               "`shoal join --job DIR -- CMD` (or job.env's variables and SHOAL_ELASTIC=join)\n",
               o_.ranks);
    return watch_members({});
  }
  if (o_.engine == "local") {
    std::vector<std::vector<int>> cpus(static_cast<std::size_t>(o_.ranks));
    if (o_.bind == "cores") {
      cpus = rank_cpus(o_.ranks, attempt_ == 0);
      if (cpus.empty()) {
        oc_.code = 2;
        return false;
      }
    }
    for (int r = 0; r < o_.ranks; ++r) {
      auto e = env_;
      if (elastic_) e.emplace_back("SHOAL_ELASTIC_ID", std::to_string(r));
      e.insert(e.end(), {{"SHOAL_RANK", std::to_string(r)},
                         {"SHOAL_WORLD_SIZE", std::to_string(o_.ranks)},
                         {"SHOAL_LOCAL_RANK", std::to_string(r)},
                         {"SHOAL_LOCAL_WORLD_SIZE", std::to_string(o_.ranks)}});
      if (!start(o_.cmd, e, cpus[static_cast<std::size_t>(r)])) return false;
    }
    return !elastic_ || watch_members({});
  }
  std::vector<std::string> argv;
  if (o_.engine == "mpirun") {
    argv = {"mpirun",    "-n",  std::to_string(o_.ranks), "--tag-output", "--oversubscribe",
            "--bind-to", "none"};
    if (geteuid() == 0) argv.push_back("--allow-run-as-root");
    for (const auto& [k, v] : env_) argv.insert(argv.end(), {"-x", k});
    argv.insert(argv.end(), o_.engine_args.begin(), o_.engine_args.end());
    // Each rank runs under `shoal run-rank`, which names it when it fails.
    char self[4096] = {0};
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0)
      argv.insert(argv.end(), {std::string(self, static_cast<std::size_t>(len)), "run-rank", "--"});
  } else {
    // An elastic job's tasks outlive a peer's death: the coordinator, not
    // srun, decides what follows it.
    argv = {"srun", "--label", elastic_ ? "--kill-on-bad-exit=0" : "--kill-on-bad-exit=1",
            "--export=ALL"};
    argv.insert(argv.end(), o_.engine_args.begin(), o_.engine_args.end());
    const std::vector<std::string> base = argv;  // a newcomer's step: the same, one task
    argv.insert(argv.begin() + 1, {"-n", std::to_string(o_.ranks)});
    argv.insert(argv.end(), o_.cmd.begin(), o_.cmd.end());
    if (!start(argv, env_)) return false;
    return !elastic_ || watch_members(base);
  }
  argv.insert(argv.end(), o_.cmd.begin(), o_.cmd.end());
  return start(argv, env_);
}

bool Attempt::watch_members(const std::vector<std::string>& srun) {
  if (o_.engine == "local") {
    members_ = std::make_unique<LocalMembers>(procs_, frozen_, output_, env_, o_.cmd);
    return true;
  }
  // A rank's lease that stands still as long as a peer's heartbeat may
  // before the peers name it (SHOAL_HEARTBEAT) makes it silent.
  auto hb = env::get_double("SHOAL_HEARTBEAT", 15);
  auto client =
      net::TcpStore::connect(store_->host(), store_->port(), Deadline::after_seconds(10), token_);
  if (!hb.ok() || !client.ok()) {
    fmt::print(stderr, "shoal run: --elastic: {}\n",
               hb.ok() ? client.status().message() : hb.status().message());
    stop_all(SIGKILL);
    oc_.code = 2;
    return false;
  }
  members_ = std::make_unique<RemoteMembers>(procs_, frozen_, output_, env_, srun, o_.cmd, o_.ranks,
                                             std::move(client).value(), *hb > 0 ? *hb : 15);
  return true;
}

void Attempt::begin_stop(std::string reason) {
  why_ = std::move(reason);
  for (std::size_t i = 0; i < procs_.size(); ++i)
    frozen_[i] = !procs_[i].exited && is_stopped(procs_[i].pid);
  stopping_ = true;
  stop_all(SIGTERM);
  // A stopped process (SIGSTOP, a debugger) holds SIGTERM pending until
  // continued, so waiting out its grace only delays the report: it dies now.
  for (std::size_t i = 0; i < procs_.size(); ++i)
    if (frozen_[i]) kill(-procs_[i].pid, SIGKILL);
  kill_at_ = Clock::now() +
             std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_s));
}

// Collects the processes that ended; the first failure stops the others.
void Attempt::reap(int* alive) {
  const bool per_rank = o_.engine == "local";
  for (std::size_t i = 0; i < procs_.size(); ++i) {
    Proc& p = procs_[i];
    if (p.exited) continue;
    int st = 0;
    if (waitpid(p.pid, &st, WNOHANG) != p.pid) {
      ++*alive;
      continue;
    }
    p.exited = true;
    p.status = st;
    kill(-p.pid, SIGKILL);  // anything it left in its group
    bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!ok && failed_ < 0 && !stopping_ && !elastic_) {
      failed_ = static_cast<int>(i);
      begin_stop(per_rank ? fmt::format("rank {} {}", i, describe(st))
                          : fmt::format("{} {}", o_.engine, describe(st)));
    }
  }
}

void Attempt::supervise() {
  const auto t0 = Clock::now();
  frozen_.assign(procs_.size(), false);
  while (true) {
    if (const int sig = poll_procs(procs_, output_); sig != 0) {
      interrupted_ = sig;
      if (!stopping_)
        begin_stop(fmt::format("launcher received signal {}", strsignal(sig)));
      else
        stop_all(SIGKILL);
    }
    int alive = 0;
    reap(&alive);
    if (elastic_ && !stopping_) {
      std::string stop = elastic_->supervise(*members_, o_.ranks);
      if (elastic_->finished() && !released_) {
        members_->release();
        released_ = true;
        // srun waits for the nodes it must tell; one cut off never answers.
        kill_at_ = Clock::now() + std::chrono::seconds(30);
      }
      if (!stop.empty()) {
        // A lost rank is a process of its own only under the local engine.
        if (!elastic_->lost().empty() && o_.engine == "local")
          failed_ = elastic_->lost().begin()->first;
        begin_stop(stop);
      }
    }
    if (!stopping_ && o_.timeout_s > 0 &&
        Clock::now() - t0 > std::chrono::duration<double>(o_.timeout_s))
      begin_stop(fmt::format("--timeout {} s passed", o_.timeout_s));
    if ((stopping_ || released_) && alive > 0 && Clock::now() > kill_at_) stop_all(SIGKILL);
    // Under --engine external no process of the job is the launcher's: the
    // job lasts until its ranks finish or it is stopped.
    if (alive == 0 && (o_.engine != "external" || stopping_ || elastic_->finished())) break;
  }
}

// Under mpirun or srun: the rank the engine names as failed (and its
// code), or that the job was cancelled from outside. The reason to print.
std::string Attempt::engine_why(int* failed_rank, int* rank_code, bool* cancelled) {
  auto f = engine_failure(output_);
  if (!f && !output_.cancel_line().empty()) {
    *cancelled = true;
    return fmt::format(
        "the job was stopped by {} from outside (\"{}\"): no rank failed, so it is not "
        "restarted",
        o_.engine, output_.cancel_line());
  }
  if (!f) return why_;
  *failed_rank = f->first;
  if (auto c = f->second.find("xit code "); c != std::string::npos)
    *rank_code = std::atoi(f->second.c_str() + c + 9);
  if (auto c = f->second.find("signal "); c != std::string::npos)
    *rank_code = 128 + std::atoi(f->second.c_str() + c + 7);
  return fmt::format("rank {} {} (under {})", f->first, f->second, o_.engine);
}

void Attempt::report() {
  const bool per_rank = o_.engine == "local";
  int failed_rank = per_rank ? failed_ : -1;
  int rank_code = 0;       // the failed rank's code, when the engine names it
  bool cancelled = false;  // stopped from outside: not a failure a restart would cure
  if (!per_rank && failed_ >= 0) why_ = engine_why(&failed_rank, &rank_code, &cancelled);
  fmt::print(stderr, "shoal run: {}; stopped all {} ranks.\n", why_, o_.ranks);
  if (failed_rank >= 0 && failed_rank < o_.ranks) {
    fmt::print(stderr, "shoal run: last lines of rank {}:\n", failed_rank);
    for (const auto& l : output_.tail(failed_rank)) fmt::print(stderr, "  | {}\n", l);
  } else if (failed_ >= 0) {
    fmt::print(stderr, "shoal run: last lines of {}:\n", o_.engine);
    for (const auto& l : output_.engine_tail()) fmt::print(stderr, "  | {}\n", l);
  }
  if (per_rank)
    for (int r = 0; r < o_.ranks; ++r)
      if (r != failed_)
        fmt::print(stderr, "shoal run:   rank {} {}{}\n", r,
                   frozen_[static_cast<std::size_t>(r)]
                       ? "was unresponsive (stopped: state T) when the job failed, and "
                       : "",
                   describe(procs_[static_cast<std::size_t>(r)].status));
  oc_.code = failed_ >= 0 ? exit_code_of(procs_[static_cast<std::size_t>(failed_)].status) : 1;
  if (rank_code > 0) oc_.code = rank_code;
  if (oc_.code == 0) oc_.code = 1;
  // Stopped by a signal: exit as a shell reports it (143 for SIGTERM, 130
  // for Ctrl-C), as srun, mpirun and torchrun do.
  if (interrupted_) oc_.code = 128 + interrupted_;
  oc_.restartable = failed_ >= 0 && !interrupted_ && !cancelled;
  // Exit code 2 is a usage or input error (shoal's flags and files, as
  // argparse's and getopt's): every attempt would end the same way.
  if (oc_.restartable && o_.max_restarts > 0 && oc_.code == 2) {
    fmt::print(stderr,
               "shoal run: exit code 2 is a usage or input error, which a restart would repeat: "
               "not restarted\n");
    oc_.restartable = false;
  }
}

}  // namespace

Outcome run_attempt(const LaunchOptions& o, int attempt, const std::string& job_id,
                    const std::string& trace_prefix) {
  return Attempt(o, attempt).run(job_id, trace_prefix);
}

}  // namespace shoal::launch
