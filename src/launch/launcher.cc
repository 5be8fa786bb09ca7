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

#include "launch/attempt.h"
#include "launch/output.h"
#include "launch/process.h"
#include "shoal/core/file.h"
#include "shoal/core/launch_env.h"

extern char** environ;

namespace shoal::launch {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Status validate(const LaunchOptions& o) {
  if (o.ranks < 1) return invalid_argument("-n {}: a job needs at least one rank", o.ranks);
  if (o.engine != "local" && o.engine != "mpirun" && o.engine != "srun" && o.engine != "external")
    return invalid_argument("--engine '{}' is not one of local, mpirun, srun, external", o.engine);
  if (o.engine == "external") {
    if (o.elastic_min == 0)
      return invalid_argument(
          "--engine external starts no rank: it serves an elastic job's store and generations "
          "(--elastic MIN[:MAX]) for ranks started elsewhere");
    if (!o.cmd.empty())
      return invalid_argument(
          "--engine external starts no rank, so it takes no command ('{}'): start each with "
          "`shoal join --job DIR -- CMD` (or the job.env variables and SHOAL_ELASTIC=join)",
          o.cmd[0]);
    if (o.max_restarts > 0)
      return invalid_argument(
          "--engine external starts no replacement (--max-restarts {}): whatever starts the "
          "ranks restarts them, and each joins",
          o.max_restarts);
  }
  if (o.max_restarts < 0) return invalid_argument("--max-restarts {} must be >= 0", o.max_restarts);
  if (o.timeout_s < 0) return invalid_argument("--timeout {} must be >= 0", o.timeout_s);
  if (o.store_port < 0 || o.store_port > 65535)
    return invalid_argument("--store-port {} is not a port number", o.store_port);
  if (o.cmd.empty() && o.engine != "external")
    return invalid_argument("no command given (usage: shoal run -n N -- CMD ...)");
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
    if (o.engine == "mpirun" || o.ps_servers > 0)
      return invalid_argument(
          "--elastic keeps a job of local ranks or srun's tasks (--engine local or srun) going "
          "without restarts: it takes no {}",
          o.ps_servers > 0 ? "--ps" : "--engine mpirun (mpirun ends every rank when one dies)");
  }
  return ok_status();
}

namespace {

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
