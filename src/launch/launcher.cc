#include "shoal/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "launch/elastic_coordinator.h"
#include "launch/output.h"
#include "launch/process.h"
#include "shoal/core/cpus.h"
#include "shoal/core/file.h"
#include "shoal/core/launch_env.h"
#include "shoal/net/store.h"

extern char** environ;

namespace shoal::launch {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Status validate(const LaunchOptions& o) {
  if (o.ranks < 1) return invalid_argument("-n {}: a job needs at least one rank", o.ranks);
  if (o.engine != "local" && o.engine != "mpirun" && o.engine != "srun")
    return invalid_argument("--engine '{}' is not one of local, mpirun, srun", o.engine);
  if (o.max_restarts < 0) return invalid_argument("--max-restarts {} must be >= 0", o.max_restarts);
  if (o.timeout_s < 0) return invalid_argument("--timeout {} must be >= 0", o.timeout_s);
  if (o.store_port < 0 || o.store_port > 65535)
    return invalid_argument("--store-port {} is not a port number", o.store_port);
  if (o.cmd.empty()) return invalid_argument("no command given (usage: shoal run -n N -- CMD ...)");
  if (o.ps_servers < 0 || o.ps_workers < 0 || (o.ps_servers > 0) != (o.ps_workers > 0))
    return invalid_argument(
        "--ps {},{}: a parameter-server job needs at least one server and one "
        "worker",
        o.ps_servers, o.ps_workers);
  if (o.bind != "none" && o.bind != "cores" && o.bind != "layout")
    return invalid_argument("--bind '{}' is not one of none, cores, layout", o.bind);
  if (o.bind != "none" && (o.engine != "local" || o.ps_servers > 0))
    return invalid_argument(
        "--bind {} binds local ranks (--engine local, no --ps); {} binds its own: {}", o.bind,
        o.ps_servers > 0 ? "a parameter-server job" : "--engine " + o.engine,
        o.engine == "srun" ? "--engine-arg=--cpu-bind=cores"
                           : "--engine-arg=--bind-to --engine-arg=core");
  if (o.ps_servers > 0 && o.max_restarts > 0)
    return invalid_argument(
        "--ps does not take --max-restarts (a dead server restarts from its snapshot: "
        "--ps-snapshot-every; async workers come and go: --ps-elastic)");
  if (o.elastic_min != 0) {
    if (o.elastic_min < 1 || o.elastic_min > o.ranks)
      return invalid_argument("--elastic {}: MIN must be in [1, {}] (-n)", o.elastic_min, o.ranks);
    if (o.elastic_max != 0 && o.elastic_max < o.ranks)
      return invalid_argument("--elastic {}:{}: MAX must be at least -n {}", o.elastic_min,
                              o.elastic_max, o.ranks);
    if (o.engine != "local" || o.ps_servers > 0)
      return invalid_argument(
          "--elastic keeps a job of local ranks (--engine local) going without restarts: it "
          "takes no --engine {} or --ps",
          o.engine);
  }
  return ok_status();
}

namespace {

struct Outcome {
  int code = 0;
  bool restartable = false;  // a rank failed (not a signal to us, not the timeout)
};

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

// Waits `seconds`; false when SIGINT or SIGTERM came first.
bool wait_unless_signalled(double seconds) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(seconds));
  while (Clock::now() < until) {
    pollfd fd{signal_fd(), POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (poll(&fd, 1, static_cast<int>(std::max<long>(1, left.count()))) > 0) return false;
  }
  return true;
}

// An elastic job's address for `shoal join` (write_job_env), said aloud.
Status publish_job_env(const std::string& dir,
                       const std::vector<std::pair<std::string, std::string>>& env) {
  SHOAL_RETURN_IF_ERROR(write_job_env(dir, env).with_context("writing the elastic job's job.env"));
  fmt::print(stderr, "shoal run: --elastic: more ranks join with `shoal join --job {}`\n", dir);
  return ok_status();
}

Outcome run_attempt(const LaunchOptions& o, int attempt, const std::string& job_id,
                    const std::string& trace_prefix) {
  Outcome oc;
  const std::string token = random_hex(16);
  auto store = net::TcpStoreServer::start(o.store_host, o.store_port, token);
  if (!store.ok()) {
    fmt::print(stderr, "shoal run: cannot start the rendezvous store on {}:{}: {}{}\n",
               o.store_host, o.store_port, store.status().message(),
               o.store_port != 0 ? " (choose another --store-port, or 0 for any free port)" : "");
    oc.code = 2;
    return oc;
  }
  std::string host =
      o.store_host.find(':') != std::string::npos ? "[" + o.store_host + "]" : o.store_host;
  std::vector<std::pair<std::string, std::string>> env = {
      {"SHOAL_STORE", fmt::format("{}:{}", host, (*store)->port())},
      {"SHOAL_JOB_TOKEN", token},
      {"SHOAL_JOB_ID", job_id},
      {"SHOAL_RESTART_COUNT", std::to_string(attempt)},
      {"SHOAL_PLAIN_OUTPUT", "1"},
  };
  if (!trace_prefix.empty()) env.emplace_back("SHOAL_TRACE", trace_prefix);
  // --bind layout: each `shoal train` rank binds itself once it knows its
  // place in the layout (dist/layout_binding.h).
  if (o.bind == "layout") env.emplace_back("SHOAL_BIND", "layout");
  std::unique_ptr<ElasticCoordinator> elastic;
  if (o.elastic_min > 0) {
    env.emplace_back("SHOAL_ELASTIC", std::to_string(o.elastic_min));
    const int max = std::max(o.elastic_max, o.ranks);
    env.emplace_back("SHOAL_ELASTIC_MAX", std::to_string(max));
    auto c = ElasticCoordinator::for_launcher((*store)->host(), (*store)->port(), token, o.ranks,
                                              o.elastic_min, max, o.max_restarts);
    if (c.ok()) {
      Status st = publish_job_env(o.job_dir.empty() ? "runs/job-" + job_id : o.job_dir, env);
      if (!st.ok()) c = st;
    }
    if (!c.ok()) {
      fmt::print(stderr, "shoal run: --elastic: {}\n", c.status().message());
      oc.code = 2;
      return oc;
    }
    elastic = std::move(c).value();
  }

  std::vector<Proc> procs;
  Output output(o.ranks, o.engine);
  auto start = [&](const std::vector<std::string>& argv,
                   std::vector<std::pair<std::string, std::string>> e,
                   const std::vector<int>& cpus = {}) -> bool {
    auto p = spawn(argv, e, cpus);
    if (!p.ok()) {
      fmt::print(stderr, "shoal run: {}\n", p.status().message());
      for (auto& q : procs) {
        kill(-q.pid, SIGKILL);
        waitpid(q.pid, nullptr, 0);
      }
      oc.code = 127;
      return false;
    }
    procs.push_back(*p);
    return true;
  };
  if (o.engine == "local") {
    std::vector<std::vector<int>> cpus(static_cast<std::size_t>(o.ranks));
    if (o.bind == "cores") {
      cpus = rank_cpus(o.ranks, attempt == 0);
      if (cpus.empty()) {
        oc.code = 2;
        return oc;
      }
    }
    for (int r = 0; r < o.ranks; ++r) {
      auto e = env;
      if (elastic) e.emplace_back("SHOAL_ELASTIC_ID", std::to_string(r));
      e.insert(e.end(), {{"SHOAL_RANK", std::to_string(r)},
                         {"SHOAL_WORLD_SIZE", std::to_string(o.ranks)},
                         {"SHOAL_LOCAL_RANK", std::to_string(r)},
                         {"SHOAL_LOCAL_WORLD_SIZE", std::to_string(o.ranks)}});
      if (!start(o.cmd, e, cpus[static_cast<std::size_t>(r)])) return oc;
    }
  } else if (o.engine == "mpirun") {
    std::vector<std::string> argv = {
        "mpirun",    "-n",  std::to_string(o.ranks), "--tag-output", "--oversubscribe",
        "--bind-to", "none"};
    if (geteuid() == 0) argv.push_back("--allow-run-as-root");
    for (const auto& [k, v] : env) argv.insert(argv.end(), {"-x", k});
    argv.insert(argv.end(), o.engine_args.begin(), o.engine_args.end());
    // Each rank runs under `shoal run-rank`, which names it when it fails.
    char self[4096] = {0};
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0)
      argv.insert(argv.end(), {std::string(self, static_cast<std::size_t>(len)), "run-rank", "--"});
    argv.insert(argv.end(), o.cmd.begin(), o.cmd.end());
    if (!start(argv, env)) return oc;
  } else {
    std::vector<std::string> argv = {
        "srun", "-n", std::to_string(o.ranks), "--label", "--kill-on-bad-exit=1", "--export=ALL"};
    argv.insert(argv.end(), o.engine_args.begin(), o.engine_args.end());
    argv.insert(argv.end(), o.cmd.begin(), o.cmd.end());
    if (!start(argv, env)) return oc;
  }

  const auto t0 = Clock::now();
  const bool per_rank = o.engine == "local";
  int failed = -1;  // first process that failed
  std::string why;
  bool stopping = false;
  int interrupted = 0;  // the signal that stopped the launcher, if one did
  Clock::time_point kill_at{};
  auto stop_all = [&](int sig) {
    for (auto& p : procs)
      if (!p.exited) kill(-p.pid, sig);
  };
  std::vector<bool> frozen(procs.size(), false);
  auto begin_stop = [&](std::string reason) {
    why = std::move(reason);
    for (std::size_t i = 0; i < procs.size(); ++i)
      frozen[i] = !procs[i].exited && is_stopped(procs[i].pid);
    stopping = true;
    stop_all(SIGTERM);
    // A stopped process (SIGSTOP, a debugger) holds SIGTERM pending until
    // continued, so waiting out its grace only delays the report: it dies now.
    for (std::size_t i = 0; i < procs.size(); ++i)
      if (frozen[i]) kill(-procs[i].pid, SIGKILL);
    kill_at = Clock::now() +
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_s));
  };
  while (true) {
    std::vector<pollfd> fds{{signal_fd(), POLLIN, 0}};
    std::vector<int> who{-1};
    for (std::size_t i = 0; i < procs.size(); ++i)
      if (procs[i].out >= 0) {
        fds.push_back({procs[i].out, POLLIN, 0});
        who.push_back(static_cast<int>(i));
      }
    poll(fds.data(), fds.size(), 100);
    for (std::size_t k = 1; k < fds.size(); ++k)
      if (fds[k].revents) drain(who[k], procs[static_cast<std::size_t>(who[k])], output, false);
    if (fds[0].revents & POLLIN) {
      unsigned char sig = 0;
      while (read(signal_fd(), &sig, 1) == 1) {
      }
      interrupted = sig;
      if (!stopping)
        begin_stop(fmt::format("launcher received signal {}", strsignal(sig)));
      else
        stop_all(SIGKILL);
    }
    int alive = 0;
    for (std::size_t i = 0; i < procs.size(); ++i) {
      Proc& p = procs[i];
      if (p.exited) continue;
      int st = 0;
      if (waitpid(p.pid, &st, WNOHANG) == p.pid) {
        p.exited = true;
        p.status = st;
        kill(-p.pid, SIGKILL);  // anything it left in its group
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!ok && failed < 0 && !stopping && !elastic) {
          failed = static_cast<int>(i);
          begin_stop(per_rank ? fmt::format("rank {} {}", i, describe(st))
                              : fmt::format("{} {}", o.engine, describe(st)));
        }
      } else {
        ++alive;
      }
    }
    if (elastic && !stopping) {
      std::string stop = elastic->supervise(procs, frozen, output, env, o.cmd, o.ranks);
      if (!stop.empty()) {
        if (!elastic->lost().empty()) failed = elastic->lost().begin()->first;
        begin_stop(stop);
      }
    }
    if (!stopping && o.timeout_s > 0 &&
        Clock::now() - t0 > std::chrono::duration<double>(o.timeout_s))
      begin_stop(fmt::format("--timeout {} s passed", o.timeout_s));
    if (stopping && alive > 0 && Clock::now() > kill_at) stop_all(SIGKILL);
    if (alive == 0) break;
  }
  for (std::size_t i = 0; i < procs.size(); ++i) drain(static_cast<int>(i), procs[i], output, true);
  if (elastic && why.empty()) {
    oc.code = elastic->finish(procs, o.ranks);
    return oc;
  }
  if (why.empty()) return oc;

  // The report.
  int failed_rank = per_rank ? failed : -1;
  int rank_code = 0;       // the failed rank's code, when the engine names it
  bool cancelled = false;  // stopped from outside: not a failure a restart would cure
  if (!per_rank && failed >= 0) {
    if (auto f = engine_failure(output); !f && !output.cancel_line().empty()) {
      cancelled = true;
      why = fmt::format(
          "the job was stopped by {} from outside (\"{}\"): no rank failed, so it is not "
          "restarted",
          o.engine, output.cancel_line());
    } else if (f) {
      failed_rank = f->first;
      why = fmt::format("rank {} {} (under {})", f->first, f->second, o.engine);
      if (auto c = f->second.find("xit code "); c != std::string::npos)
        rank_code = std::atoi(f->second.c_str() + c + 9);
      if (auto c = f->second.find("signal "); c != std::string::npos)
        rank_code = 128 + std::atoi(f->second.c_str() + c + 7);
    }
  }
  fmt::print(stderr, "shoal run: {}; stopped all {} ranks.\n", why, o.ranks);
  if (failed_rank >= 0 && failed_rank < o.ranks) {
    fmt::print(stderr, "shoal run: last lines of rank {}:\n", failed_rank);
    for (const auto& l : output.tail(failed_rank)) fmt::print(stderr, "  | {}\n", l);
  } else if (failed >= 0) {
    fmt::print(stderr, "shoal run: last lines of {}:\n", o.engine);
    for (const auto& l : output.engine_tail()) fmt::print(stderr, "  | {}\n", l);
  }
  if (per_rank)
    for (int r = 0; r < o.ranks; ++r)
      if (r != failed)
        fmt::print(stderr, "shoal run:   rank {} {}{}\n", r,
                   frozen[static_cast<std::size_t>(r)]
                       ? "was unresponsive (stopped: state T) when the job failed, and "
                       : "",
                   describe(procs[static_cast<std::size_t>(r)].status));
  oc.code = failed >= 0 ? exit_code_of(procs[static_cast<std::size_t>(failed)].status) : 1;
  if (rank_code > 0) oc.code = rank_code;
  if (oc.code == 0) oc.code = 1;
  // Stopped by a signal: exit as a shell reports it (143 for SIGTERM, 130
  // for Ctrl-C), as srun, mpirun and torchrun do.
  if (interrupted) oc.code = 128 + interrupted;
  oc.restartable = failed >= 0 && !interrupted && !cancelled;
  // Exit code 2 is a usage or input error (shoal's flags and files, as
  // argparse's and getopt's): every attempt would end the same way.
  if (oc.restartable && o.max_restarts > 0 && oc.code == 2) {
    fmt::print(stderr,
               "shoal run: exit code 2 is a usage or input error, which a restart would repeat: "
               "not restarted\n");
    oc.restartable = false;
  }
  return oc;
}

}  // namespace

int exec_rank(const std::vector<std::string>& cmd) {
  if (cmd.empty()) {
    fmt::print(stderr, "shoal run-rank: no command given\n");
    return 2;
  }
  // The rank as the ranks themselves find it (mpirun's variables, etc.).
  auto env = launch_env();
  const std::string rank = env.ok() && env->source != "none (single process)"
                               ? std::to_string(env->rank)
                               : std::string("?");
  std::vector<char*> av;
  for (const auto& a : cmd) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  if (!catch_signals()) return 2;
  // The engine (mpirun's daemon) killed outright takes this wrapper, and so
  // its rank, with it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive this wrapper
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execvp(av[0], av.data());
    fmt::print(stderr, "shoal-rank-exit: rank {} cannot start '{}': {}\n", rank, cmd[0],
               std::strerror(errno));
    _exit(127);
  }
  int st = 0;
  while (true) {
    pollfd pf{signal_fd(), POLLIN, 0};
    poll(&pf, 1, 100);
    unsigned char sig = 0;
    while (read(signal_fd(), &sig, 1) == 1) kill(pid, sig);
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) return 2;
  }
  int code = exit_code_of(st);
  if (code != 0) {
    fmt::print(stderr, "shoal-rank-exit: rank {} {}\n", rank, describe(st));
    std::fflush(stderr);
  }
  return code;
}

int launch(const LaunchOptions& o) {
  if (Status st = validate(o); !st.ok()) {
    fmt::print(stderr, "shoal run: {}\n", st.message());
    return 2;
  }
  if (sodium_init() < 0) return 2;
  if (!catch_signals()) return 2;

  // One id for the whole job (all attempts): `shoal train` names its
  // default run directory after it, so a restart finds its checkpoints.
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  const std::string job_id = fmt::format("{}-{}", stamp, random_hex(3));
  if (o.ps_servers > 0) return launch_ps(o, job_id);

  std::string trace_dir, trace_prefix;
  if (!o.trace.empty()) {
    auto d = make_trace_dir(o.trace);
    if (!d.ok()) {
      fmt::print(stderr, "shoal run: {}\n", d.status().message());
      return 2;
    }
    trace_dir = *d;
    trace_prefix = trace_dir + "/trace.json";
  }
  Outcome oc;
  // Under --elastic, --max-restarts counts replacement ranks, not attempts.
  const int attempts = o.elastic_min > 0 ? 0 : o.max_restarts;
  for (int attempt = 0; attempt <= attempts; ++attempt) {
    if (attempt > 0) {
      const double wait = std::min(30.0, o.restart_delay_s * std::ldexp(1.0, attempt - 1));
      fmt::print(stderr,
                 "shoal run: restarting all {} ranks from the latest checkpoint (restart {} of "
                 "{}) in {:g} s\n",
                 o.ranks, attempt, o.max_restarts, wait);
      if (!wait_unless_signalled(wait)) {
        fmt::print(stderr, "shoal run: stopped by a signal before restart {}\n", attempt);
        break;
      }
    }
    oc = run_attempt(o, attempt, job_id, trace_prefix);
    if (oc.code == 0 || !oc.restartable) break;
  }
  if (!trace_dir.empty()) {
    std::vector<std::string> files;
    for (int r = 0; r < o.ranks; ++r) {
      std::string f = fmt::format("{}/trace.rank{}.json", trace_dir, r);
      if (fs::exists(f)) files.push_back(f);
    }
    if (files.size() != static_cast<std::size_t>(o.ranks)) {
      fmt::print(
          stderr,
          "shoal run: --trace: {} of {} ranks wrote a trace (is the command `shoal train`?)\n",
          files.size(), o.ranks);
    } else if (auto s = merge_traces(files, o.trace); !s.ok()) {
      fmt::print(stderr, "shoal run: merging traces: {}\n", s.status().to_string());
    } else {
      fmt::print("shoal run: merged trace of {} ranks -> {}\n", o.ranks, o.trace);
      for (const auto& t : *s)
        fmt::print(
            "shoal run:   rank {}: {} steps, {:.2f} ms/step, communication {:.2f} ms/step, "
            "exposed (compute waiting for it) {:.2f} ms/step ({:.0f}% of the step)\n",
            t.rank, t.steps, t.step_ms, t.comm_ms, t.exposed_comm_ms,
            t.step_ms > 0 ? 100 * t.exposed_comm_ms / t.step_ms : 0.0);
    }
    std::error_code ec;
    fs::remove_all(trace_dir, ec);
  }
  return oc.code;
}

}  // namespace shoal::launch
