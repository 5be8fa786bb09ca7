// `shoal run --ps S,W -- CMD`: a parameter-server job on this host. The
// launcher is the scheduler (it serves the job's store, where servers
// publish their addresses and workers take ids), starts S `shoal ps
// server` processes and W copies of CMD as workers, with the ps-lite/MXNet
// variables set (DMLC_ROLE, DMLC_PS_ROOT_URI/PORT, DMLC_NUM_SERVER/WORKER)
// and a fresh job token. Unlike a gang, the job is over when every worker
// has finished: then the servers are stopped (they print their counts).
// A worker that finishes early is fine; one that fails stops the job in
// sync mode (named), and in async or bounded mode the others go on (the
// servers drop it from the quorum). A server that dies stops the job.
// With --engine srun each of those processes is a one-task Slurm job step,
// with --engine mpirun a one-process mpirun launch (the scheduler's store
// stays in the launcher: --store-host must be an address the nodes reach).
// With --ps-elastic MIN:MAX (async or bounded jobs) the launcher replaces a
// failed worker while fewer than MIN train, and starts more on request
// (`shoal ps join`: the store counter ps/grow) up to MAX; a new worker takes
// the next launcher index as its id and starts from the servers' weights.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "launch/output.h"
#include "launch/process.h"
#include "shoal/core/ps_keys.h"
#include "shoal/launch/launcher.h"
#include "shoal/net/interfaces.h"
#include "shoal/net/store.h"

namespace shoal::launch {
namespace {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

class PsJob {
 public:
  PsJob(const LaunchOptions& o, std::string job_id)
      : o_(o), job_id_(std::move(job_id)), output_(labels(o)) {}
  ~PsJob() {
    std::error_code ec;
    if (!ompi_tmp_.empty()) std::filesystem::remove_all(ompi_tmp_, ec);
  }

  // Starts the store and every process; false (with the code set) on failure.
  bool start() {
    token_ = random_hex(16);
    auto store = net::TcpStoreServer::start(o_.store_host, o_.store_port, token_);
    if (!store.ok()) return fail_start("cannot start the scheduler's store", store.status());
    store_ = std::move(store).value();
    auto c =
        net::TcpStore::connect(o_.store_host, store_->port(), Deadline::after_seconds(10), token_);
    if (!c.ok()) return fail_start("cannot reach the scheduler's store", c.status());
    client_ = std::move(c).value();
    const Env env = {
        {"SHOAL_STORE", fmt::format("{}:{}", o_.store_host, store_->port())},
        {"SHOAL_JOB_TOKEN", token_},
        {"SHOAL_JOB_ID", job_id_},
        {"SHOAL_PLAIN_OUTPUT", "1"},
        {"DMLC_PS_ROOT_URI", o_.store_host},
        {"DMLC_PS_ROOT_PORT", std::to_string(store_->port())},
        {"DMLC_NUM_SERVER", std::to_string(o_.ps_servers)},
        {"DMLC_NUM_WORKER", std::to_string(o_.ps_workers)},
    };
    // Each server snapshots after every update, before it answers: a
    // server restarted from its snapshot has every update a worker heard of.
    snapshots_ = o_.ps_snapshots.empty() ? fmt::format("runs/ps-{}", job_id_) : o_.ps_snapshots;
    std::error_code ec;
    std::filesystem::create_directories(snapshots_, ec);
    for (int i = 0; i < o_.ps_servers; ++i) {
      Env e = env;
      e.insert(e.end(), {{"DMLC_ROLE", "server"}, {"SHOAL_PS_SERVER_INDEX", std::to_string(i)}});
      // On other nodes (srun or mpirun with a routable store host) a server listens
      // on every interface and publishes the address that routes to the scheduler.
      const std::string host =
          o_.engine != "local" && !net::is_loopback_host(o_.store_host) ? "0.0.0.0" : o_.store_host;
      std::vector<std::string> argv = {self_exe(),
                                       "ps",
                                       "server",
                                       "--host",
                                       host,
                                       "--metrics",
                                       fmt::format("{}/server{}.metrics.jsonl", snapshots_, i)};
      if (o_.ps_snapshot_every > 0)
        argv.insert(argv.end(),
                    {"--snapshot", fmt::format("{}/server{}.safetensors", snapshots_, i),
                     "--snapshot-every", std::to_string(o_.ps_snapshot_every)});
      if (!spawn_unit(argv, e)) return false;
    }
    worker_env_ = env;
    worker_env_.push_back({"DMLC_ROLE", "worker"});
    if (!o_.trace.empty()) {
      auto d = make_trace_dir(o_.trace);
      if (!d.ok()) return fail_start("cannot make a directory for traces", d.status());
      trace_dir_ = *d;
      worker_env_.push_back({"SHOAL_TRACE", trace_dir_ + "/trace.json"});
    }
    // Published before any worker starts: a worker's own `shoal ps join`
    // found no job.env when it ran first (seen under load in the tests).
    if (o_.ps_elastic_max > 0 && !publish_elastic(env)) return false;
    for (int i = 0; i < o_.ps_workers; ++i) {
      Env e = worker_env_;
      e.push_back({"SHOAL_PS_WORKER_ID", std::to_string(i)});
      if (!spawn_unit(o_.cmd, e)) return false;
    }
    t0_ = Clock::now();
    return true;
  }

  int code() const { return code_; }
  // Runs until every process has exited; returns the exit code.
  int supervise() {
    while (true) {
      poll_output();
      reap();
      check_dropped();
      check_frozen();
      check_elastic();
      if (!stopping_ && workers_done() == workers()) stop_all("every worker has finished", false);
      if (!stopping_ && o_.timeout_s > 0 &&
          Clock::now() - t0_ > std::chrono::duration<double>(o_.timeout_s))
        stop_all(fmt::format("--timeout {} s passed", o_.timeout_s), true);
      if (stopping_ && term_at_ && Clock::now() > *term_at_) {
        if (others_train()) {
          term_at_ = Clock::now() + std::chrono::seconds(1);
          kill_at_ = *term_at_ + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(o_.grace_s));
        } else {
          signal_all(SIGTERM);
          term_at_.reset();
        }
      }
      if (stopping_ && Clock::now() > kill_at_) signal_all(SIGKILL);
      bool alive = false;
      for (const auto& p : procs_) alive = alive || !p.exited;
      if (!alive) break;
    }
    for (std::size_t i = 0; i < procs_.size(); ++i)
      drain(static_cast<int>(i), procs_[i], output_, true);
    const int code = report();
    merge_trace();
    return code;
  }

 private:
  static std::vector<std::string> labels(const LaunchOptions& o) {
    std::vector<std::string> l;
    for (int i = 0; i < o.ps_servers; ++i) l.push_back(fmt::format("server {}", i));
    for (int i = 0; i < o.ps_workers; ++i) l.push_back(fmt::format("worker {}", i));
    return l;
  }
  bool is_server(std::size_t i) const { return static_cast<int>(i) < o_.ps_servers; }
  std::string label(std::size_t i) const {
    return is_server(i) ? fmt::format("server {}", i)
                        : fmt::format("worker {}", static_cast<int>(i) - o_.ps_servers);
  }
  int workers() const { return static_cast<int>(procs_.size()) - o_.ps_servers; }
  int workers_done() const {
    int n = 0;
    for (std::size_t i = 0; i < procs_.size(); ++i) n += !is_server(i) && procs_[i].exited;
    return n;
  }

  bool fail_start(const std::string& what, const Status& st) {
    fmt::print(stderr, "shoal run: {} on {}:{}: {}\n", what, o_.store_host, o_.store_port,
               st.message());
    code_ = 2;
    return false;
  }
  bool spawn_unit(const std::vector<std::string>& role_argv, const Env& env) {
    // Under srun every process of the job is its own one-task job step
    // (the by-hand recipe of docs/ps.md: one step per role), so Slurm
    // places, accounts for and cancels each; signals reach it through srun.
    std::vector<std::string> argv;
    Env e = env;
    if (o_.engine == "mpirun") {
      // Under mpirun every process is a one-process launch of its own (as
      // dmlc-tracker starts ps-lite roles under MPI), placed by the engine
      // arguments (--host, --hostfile); the launcher supervises each. The
      // same words for OpenMPI and MPICH: OpenMPI's settings go as its
      // environment variables (MPICH ignores them), and the job's variables
      // reach remote nodes through OpenMPI's env list (Hydra forwards every
      // variable) -- never on a command line, where the token would show.
      argv = {"mpirun", "-n", "1"};
      argv.insert(argv.end(), o_.engine_args.begin(), o_.engine_args.end());
      std::string names;
      for (const auto& [k, v] : env) names += (names.empty() ? "" : ";") + k;
      e.insert(e.end(), {{"OMPI_MCA_mca_base_env_list", names},
                         {"OMPI_MCA_hwloc_base_binding_policy", "none"},
                         {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                         {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}});
      // Each mpirun its own session directory: OpenMPI 4.1's mpiruns
      // started at once race to create the shared one ("mkdir
      // .../ompi.<host>.0: File exists", orte_init failed).
      if (std::getenv("OMPI_MCA_orte_tmpdir_base") == nullptr) {
        if (ompi_tmp_.empty())
          ompi_tmp_ = (std::filesystem::temp_directory_path() / ("shoal-ompi-" + job_id_)).string();
        const std::string dir = fmt::format("{}/{}", ompi_tmp_, specs_.size());
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        e.push_back({"OMPI_MCA_orte_tmpdir_base", dir});
      }
    } else if (o_.engine == "srun") {
      argv = {"srun",
              "-N",
              "1",
              "-n",
              "1",
              "--kill-on-bad-exit=1",
              "--export=ALL",
              "--job-name=shoal-ps-" + job_id_};
      argv.insert(argv.end(), o_.engine_args.begin(), o_.engine_args.end());
    }
    argv.insert(argv.end(), role_argv.begin(), role_argv.end());
    specs_.emplace_back(argv, e);
    auto p = spawn(argv, e);
    if (!p.ok()) {
      fmt::print(stderr, "shoal run: {}\n", p.status().message());
      signal_all(SIGKILL);
      for (auto& q : procs_) waitpid(q.pid, nullptr, 0);
      code_ = 127;
      return false;
    }
    procs_.push_back(*p);
    return true;
  }

  void poll_output() {
    if (const int sig = poll_procs(procs_, output_); sig != 0) {
      if (!stopping_)
        stop_all(fmt::format("the launcher received signal {}", strsignal(sig)), true);
      else
        signal_all(SIGKILL);
    }
  }

  // The mode the workers declared ("" before any did).
  std::string mode() {
    auto m = client_->peek(ps_keys::kMode);
    return m.ok() ? *m : "";
  }

  void reap() {
    for (std::size_t i = 0; i < procs_.size(); ++i) {
      Proc& p = procs_[i];
      int st = 0;
      if (p.exited || waitpid(p.pid, &st, WNOHANG) != p.pid) continue;
      p.exited = true;
      p.status = st;
      kill(-p.pid, SIGKILL);  // anything it left in its group
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (stopping_) continue;  // ended by the stop, or after it began
      if (is_server(i) && ok) {
        // A server ends by itself, with 0, only once every worker has left.
      } else if (is_server(i) && o_.ps_snapshot_every > 0 && restarts_ < o_.ps_server_restarts) {
        restart_server(i, st);
      } else if (is_server(i)) {
        fail(i, fmt::format("{} {} while workers were training", label(i), describe(st)));
      } else if (!ok) {
        // An elastic job is async or bounded (a sync one is refused once a
        // worker declares it), also before any worker has said so.
        std::string m = mode();
        if (m.empty() && o_.ps_elastic_max > 0) m = "elastic";
        if (m == "async" || m == "bounded" || m == "elastic") {
          fmt::print(stderr, "shoal run: {} {}; the job is {}: it goes on without it\n", label(i),
                     describe(st), m);
          ++lost_workers_;
          // Its duty of writing checkpoints passes to whoever joins next.
          (void)client_->compare_set(ps_keys::kWriter, std::to_string(worker_of(i)), "");
          replace_worker();
        } else {
          fail(i, fmt::format("{} {} (a sync job needs every worker)", label(i), describe(st)));
        }
      }
    }
  }

  // A server dropped a worker for silence (ps/dropped = "<worker> <line>"):
  // the end of a sync job, named; a note in an async one.
  void check_dropped() {
    if (stopping_ || ++ticks_ % 5 != 0) return;
    auto d = client_->peek(ps_keys::kDropped);
    if (!d.ok() || d->empty() || *d == last_drop_) return;
    last_drop_ = *d;
    const int w = std::atoi(d->c_str());
    const std::string line = d->substr(d->find(' ') + 1);
    const std::string m = mode();
    if (m == "async" || m == "bounded") {
      fmt::print(stderr, "shoal run: a server says {}; the job is {}: it goes on\n", line, m);
      return;
    }
    const auto unit = static_cast<std::size_t>(o_.ps_servers + w);
    fail(w >= 0 && w < o_.ps_workers ? unit : procs_.size(),
         fmt::format("a server says {} (a sync job needs every worker)", line));
  }

  // Every worker has finished or is stopped (state T): the stopped ones
  // will not finish. Named; an async job's result stands.
  // Stopped means by a signal (state 'T') for 2 s on end: a tracer's
  // brief stops ('t': LeakSanitizer stops a process at exit to scan it)
  // are not a frozen worker.
  // Whether process i has been stopped (state T) for 2 s, tracking since when.
  bool stopped_for_a_while(std::size_t i, Clock::time_point now) {
    if (procs_[i].exited || proc_state(procs_[i].pid) != 'T') {
      stopped_since_.erase(i);
      return false;
    }
    return now - stopped_since_.emplace(i, now).first->second >= std::chrono::seconds(2);
  }

  void check_frozen() {
    if (stopping_) return;
    const auto now = Clock::now();
    // A stopped server holds every worker's step: the job cannot go on, and
    // the workers would only time out blaming a key (after 311 s, seen).
    for (std::size_t i = 0; i < static_cast<std::size_t>(o_.ps_servers) && i < procs_.size(); ++i)
      if (stopped_for_a_while(i, now))
        return fail(i,
                    fmt::format("{} is unresponsive (stopped: state T); every worker waits on it",
                                label(i)));
    std::vector<std::size_t> frozen;
    for (std::size_t i = o_.ps_servers; i < procs_.size(); ++i)
      if (stopped_for_a_while(i, now)) frozen.push_back(i);
    for (std::size_t i = o_.ps_servers; i < procs_.size(); ++i)
      if (!procs_[i].exited && std::find(frozen.begin(), frozen.end(), i) == frozen.end()) return;
    if (frozen.empty()) return;
    const std::string m = mode();
    if (m == "async" || m == "bounded") {
      for (std::size_t i : frozen)
        fmt::print(stderr, "shoal run: {} is unresponsive (stopped: state T); stopping it\n",
                   label(i));
      lost_workers_ += static_cast<int>(frozen.size());
      stop_all("every other worker has finished", false);
    } else {
      fail(frozen[0], fmt::format("{} is unresponsive (stopped: state T)", label(frozen[0])));
    }
  }

  // --trace: every worker's trace (named by its id) and each server's
  // metrics as counter tracks, in one Chrome trace.
  void merge_trace() {
    if (trace_dir_.empty()) return;
    std::vector<std::string> traces, servers;
    for (int w = 0; w < workers(); ++w) {
      const std::string f = fmt::format("{}/trace.rank{}.json", trace_dir_, w);
      if (std::filesystem::exists(f)) traces.push_back(f);
    }
    for (int i = 0; i < o_.ps_servers; ++i)
      servers.push_back(fmt::format("{}/server{}.metrics.jsonl", snapshots_, i));
    if (traces.size() != static_cast<std::size_t>(workers())) {
      fmt::print(stderr,
                 "shoal run: --trace: {} of {} workers wrote a trace (is the command `shoal "
                 "train`?)\n",
                 traces.size(), workers());
    } else if (auto s = merge_traces(traces, o_.trace, servers, "worker"); !s.ok()) {
      fmt::print(stderr, "shoal run: merging traces: {}\n", s.status().to_string());
    } else {
      fmt::print("shoal run: merged trace of {} workers and {} servers -> {}\n", traces.size(),
                 servers.size(), o_.trace);
      for (const auto& t : *s)
        fmt::print(
            "shoal run:   worker {}: {} steps, {:.2f} ms/step, exposed push-pull {:.2f} "
            "ms/step ({:.0f}% of the step)\n",
            t.rank, t.steps, t.step_ms, t.exposed_comm_ms,
            t.step_ms > 0 ? 100 * t.exposed_comm_ms / t.step_ms : 0.0);
    }
    std::error_code ec;
    std::filesystem::remove_all(trace_dir_, ec);
  }

  // --ps-elastic: the job's store says MIN:MAX (what `shoal ps join`
  // checks), and <ps dir>/job.env holds the store's address and token for
  // it (readable by this user only).
  bool publish_elastic(const Env& env) {
    Status st =
        client_->set(ps_keys::kElastic, fmt::format("{}:{}", o_.ps_elastic_min, o_.ps_elastic_max));
    if (st.ok()) st = write_job_env(snapshots_, env);
    if (!st.ok()) return fail_start("cannot publish the elastic job's address", st);
    return true;
  }
  int live_workers() const { return workers() - workers_done(); }
  // Whether, this launcher's workers done, workers it did not start (by
  // hand, on other hosts) may still train: the job's count of workers is
  // above those that left. The servers end by themselves once every
  // worker left or its connection closed; until then (within --timeout)
  // no SIGTERM cuts them off.
  bool others_train() const {
    if (failure_ ||
        (o_.timeout_s > 0 && Clock::now() - t0_ > std::chrono::duration<double>(o_.timeout_s)))
      return false;
    // This launcher's workers that did not leave (failed, or stopped as
    // frozen) are not counted among those that left, nor still training.
    int own_gone = 0;
    for (std::size_t i = o_.ps_servers; i < procs_.size(); ++i)
      own_gone += !procs_[i].exited || procs_[i].status != 0;
    auto joined = client_->add(ps_keys::kWorkers, 0), left = client_->add(ps_keys::kLeft, 0);
    return joined.ok() && left.ok() && *joined > *left + own_gone;
  }
  // The worker id of unit i (servers come first, then workers in order).
  int worker_of(std::size_t i) const { return static_cast<int>(i) - o_.ps_servers; }
  // A new worker: the next launcher index as its id; it starts from the
  // servers' current weights.
  void add_worker(const std::string& why) {
    const int k = workers();
    output_.add_label(fmt::format("worker {}", k));
    fmt::print(stderr, "shoal run: starting worker {} ({})\n", k, why);
    Env e = worker_env_;
    e.push_back({"SHOAL_PS_WORKER_ID", std::to_string(k)});  // unique among this job's
    if (!spawn_unit(o_.cmd, e)) fail(procs_.size(), "could not start a worker");
  }
  void replace_worker() {
    if (o_.ps_elastic_max == 0 || stopping_) return;
    if (live_workers() >= o_.ps_elastic_min) return;
    if (++replacements_ > 10 * o_.ps_elastic_max) {
      fmt::print(stderr, "shoal run: {} workers replaced; no more replacements\n",
                 replacements_ - 1);
      return;
    }
    add_worker(fmt::format("a replacement: {} of at least {} training", live_workers(),
                           o_.ps_elastic_min));
  }
  // Requests from `shoal ps join` (ps/grow counts the workers asked for);
  // an elastic sync job is refused: its quorum is fixed.
  void check_elastic() {
    if (o_.ps_elastic_max == 0 || stopping_ || ticks_ % 5 != 2) return;
    if (mode() == "sync") {
      fail(procs_.size(),
           "--ps-elastic needs an async or bounded job (shoal train --ps-mode async|bounded); "
           "this one is sync, whose rounds need a fixed set of workers");
      return;
    }
    auto g = client_->peek(ps_keys::kGrow);
    const long asked = g.ok() && !g->empty() ? std::atol(g->c_str()) : 0;
    for (; granted_ < asked; ++granted_) {
      if (live_workers() >= o_.ps_elastic_max) {
        fmt::print(stderr,
                   "shoal run: {} more worker(s) asked for, but {} train (--ps-elastic "
                   "max {})\n",
                   asked - granted_, live_workers(), o_.ps_elastic_max);
        granted_ = asked;
        break;
      }
      add_worker("asked for by shoal ps join");
    }
  }

  // A dead server starts again on its snapshot, under its index; workers
  // wait for its new address, reconnect and resend what was unanswered.
  void restart_server(std::size_t i, int status) {
    ++restarts_;
    fmt::print(stderr, "shoal run: {} {}; restarting it from its snapshot (restart {} of {})\n",
               label(i), describe(status), restarts_, o_.ps_server_restarts);
    drain(static_cast<int>(i), procs_[i], output_, true);
    (void)client_->set(ps_keys::server(i), "");  // workers wait for the new one
    auto p = spawn(specs_[i].first, specs_[i].second);
    if (!p.ok()) {
      fail(i, fmt::format("{} could not restart: {}", label(i), p.status().message()));
      return;
    }
    procs_[i] = *p;
  }

  void fail(std::size_t i, std::string why) {
    if (failed_ >= 0) return;
    failed_ = i < procs_.size() ? static_cast<int>(i) : -1;
    stop_all(std::move(why), true);
  }
  void stop_all(std::string why, bool failure) {
    why_ = std::move(why);
    failure_ = failure;
    stopping_ = true;
    auto after = [](double s) {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    if (!failure) {
      // Every worker has left, and the servers see it within a second and
      // end by themselves, with their counts. A SIGTERM races that (and to
      // srun or mpirun it would cancel the step or job, and their last
      // words with it): only if they are still there in 10 s.
      term_at_ = Clock::now() + after(10);
      kill_at_ = *term_at_ + after(o_.grace_s);
      return;
    }
    signal_all(SIGTERM);
    kill_at_ = Clock::now() + after(o_.grace_s);
  }
  void signal_all(int sig) {
    for (auto& p : procs_)
      if (!p.exited) {
        kill(-p.pid, sig);
        if (sig == SIGTERM) kill(-p.pid, SIGCONT);  // a stopped process must run to end
      }
  }

  int report() {
    if (code_ != 0) return code_;
    if (!failure_) {
      fmt::print("shoal run: {}; the {} parameter server{} stopped{}\n", why_, o_.ps_servers,
                 o_.ps_servers == 1 ? "" : "s",
                 lost_workers_ ? fmt::format(" ({} of {} workers failed on the way)", lost_workers_,
                                             workers())
                               : "");
      return lost_workers_ == workers() ? 1 : 0;
    }
    fmt::print(stderr, "shoal run: {}; stopped the job.\n", why_);
    if (failed_ >= 0) {
      fmt::print(stderr, "shoal run: last lines of {}:\n",
                 label(static_cast<std::size_t>(failed_)));
      for (const auto& l : output_.tail(failed_)) fmt::print(stderr, "  | {}\n", l);
    }
    for (std::size_t i = 0; i < procs_.size(); ++i)
      if (static_cast<int>(i) != failed_)
        fmt::print(stderr, "shoal run:   {} {}\n", label(i), describe(procs_[i].status));
    const int c = failed_ >= 0 ? exit_code_of(procs_[static_cast<std::size_t>(failed_)].status) : 1;
    return c == 0 ? 1 : c;
  }

  const LaunchOptions& o_;
  std::string job_id_, token_;
  Output output_;
  std::unique_ptr<net::TcpStoreServer> store_;
  std::unique_ptr<net::TcpStore> client_;
  std::vector<Proc> procs_;  // servers, then workers
  Clock::time_point t0_{}, kill_at_{};
  std::optional<Clock::time_point> term_at_;  // srun: SIGTERM late, servers end by themselves
  bool stopping_ = false, failure_ = false;
  std::string why_;
  int failed_ = -1, lost_workers_ = 0, code_ = 0;
  long ticks_ = 0;
  int restarts_ = 0;
  std::map<std::size_t, Clock::time_point> stopped_since_;  // processes in state 'T'
  std::string snapshots_;
  std::vector<std::pair<std::vector<std::string>, Env>> specs_;  // per process, to restart
  std::string ompi_tmp_;  // the mpiruns' session directories (removed at the end)
  std::string last_drop_;
  Env worker_env_;         // a worker's, but for its id
  std::string trace_dir_;  // --trace: the workers' traces until merged
  long granted_ = 0;
  int replacements_ = 0;
};

}  // namespace

int launch_ps(const LaunchOptions& o, const std::string& job_id) {
  PsJob job(o, job_id);
  if (!job.start()) return job.code();
  return job.supervise();
}

}  // namespace shoal::launch
