// `shoal run -n N [--timeout S] -- CMD ...`: the local engine of the
// launcher. Starts a TCP store and N ranks of CMD with SHOAL_RANK,
// SHOAL_WORLD_SIZE, SHOAL_LOCAL_RANK, SHOAL_STORE and a fresh random
// SHOAL_JOB_TOKEN; prefixes each output line with its rank; forwards
// SIGINT/SIGTERM. Gang semantics: when one rank exits non-zero or dies,
// the others are stopped (SIGTERM, then SIGKILL after a grace period) and
// the launcher exits non-zero with a report naming the rank, its exit code
// or signal and its last lines. Each rank runs in its own process group,
// which is what gets signalled, so no grandchild is left behind.
// (First step of the launcher issue: mpirun/srun engines and restarts are
// not here yet.)
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "shoal/net/store.h"

extern char** environ;

namespace shoal::cli {
namespace {

int g_sig_pipe[2] = {-1, -1};
void on_signal(int sig) {
  unsigned char b = static_cast<unsigned char>(sig);
  (void)!write(g_sig_pipe[1], &b, 1);
}

struct Rank {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout+stderr
  std::string partial;
  std::deque<std::string> tail;  // last lines
  bool exited = false;
  int status = 0;
};

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return "stopped";
}

void emit(int rank, Rank& r, const std::string& line) {
  fmt::print("[rank {}] {}\n", rank, line);
  r.tail.push_back(line);
  if (r.tail.size() > 10) r.tail.pop_front();
}

void drain(int rank, Rank& r, bool final) {
  char buf[65536];
  while (r.out >= 0) {
    ssize_t n = read(r.out, buf, sizeof buf);
    if (n > 0) {
      r.partial.append(buf, static_cast<std::size_t>(n));
      std::size_t pos;
      while ((pos = r.partial.find('\n')) != std::string::npos) {
        emit(rank, r, r.partial.substr(0, pos));
        r.partial.erase(0, pos + 1);
      }
      continue;
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      close(r.out);
      r.out = -1;
    }
    break;
  }
  if ((final || r.out < 0) && !r.partial.empty()) {
    emit(rank, r, r.partial);
    r.partial.clear();
  }
  std::fflush(stdout);
}

}  // namespace

int run_launcher(int n, double timeout_s, const std::vector<std::string>& cmd) {
  if (cmd.empty()) {
    fmt::print(stderr, "shoal run: no command given (usage: shoal run -n N -- CMD ...)\n");
    return 2;
  }
  if (sodium_init() < 0) return 2;
  auto store = net::TcpStoreServer::start("127.0.0.1", 0);
  if (!store.ok()) {
    fmt::print(stderr, "shoal run: starting the store: {}\n", store.status().to_string());
    return 2;
  }
  unsigned char tok[16];
  randombytes_buf(tok, sizeof tok);
  std::string token;
  for (unsigned char c : tok) token += fmt::format("{:02x}", c);
  std::string store_addr = fmt::format("127.0.0.1:{}", (*store)->port());

  if (pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 2;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<Rank> ranks(static_cast<std::size_t>(n));
  std::vector<char*> argv;
  for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (int r = 0; r < n; ++r) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return 2;
    pid_t pid = fork();
    if (pid < 0) {
      fmt::print(stderr, "shoal run: fork: {}\n", std::strerror(errno));
      return 2;
    }
    if (pid == 0) {
      setpgid(0, 0);
      dup2(out[1], 1);
      dup2(out[1], 2);
      setenv("SHOAL_RANK", std::to_string(r).c_str(), 1);
      setenv("SHOAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("SHOAL_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("SHOAL_LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("SHOAL_STORE", store_addr.c_str(), 1);
      setenv("SHOAL_JOB_TOKEN", token.c_str(), 1);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      execvp(argv[0], argv.data());
      int e = errno;
      (void)!write(err[1], &e, sizeof e);
      _exit(127);
    }
    setpgid(pid, pid);
    close(out[1]);
    close(err[1]);
    int e = 0;
    ssize_t got = read(err[0], &e, sizeof e);  // EOF on successful exec (CLOEXEC)
    close(err[0]);
    if (got == static_cast<ssize_t>(sizeof e)) {
      fmt::print(stderr, "shoal run: cannot start '{}': {}\n", cmd[0], std::strerror(e));
      for (int q = 0; q <= r; ++q) {
        kill(-ranks[static_cast<std::size_t>(q)].pid, SIGKILL);
        waitpid(ranks[static_cast<std::size_t>(q)].pid, nullptr, 0);
      }
      waitpid(pid, nullptr, 0);
      return 127;
    }
    fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
    ranks[static_cast<std::size_t>(r)].pid = pid;
    ranks[static_cast<std::size_t>(r)].out = out[0];
  }

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  int failed = -1;  // first rank that failed
  std::string why;  // for the report
  bool stopping = false;
  Clock::time_point kill_at{};
  auto stop_all = [&](int sig) {
    for (auto& r : ranks)
      if (!r.exited) kill(-r.pid, sig);
  };
  while (true) {
    std::vector<pollfd> fds{{g_sig_pipe[0], POLLIN, 0}};
    std::vector<int> who{-1};
    for (int r = 0; r < n; ++r)
      if (ranks[static_cast<std::size_t>(r)].out >= 0) {
        fds.push_back({ranks[static_cast<std::size_t>(r)].out, POLLIN, 0});
        who.push_back(r);
      }
    poll(fds.data(), fds.size(), 100);
    for (std::size_t k = 1; k < fds.size(); ++k)
      if (fds[k].revents) drain(who[k], ranks[static_cast<std::size_t>(who[k])], false);
    if (fds[0].revents & POLLIN) {
      unsigned char sig = 0;
      while (read(g_sig_pipe[0], &sig, 1) == 1) {
      }
      if (!stopping) {
        why = fmt::format("launcher received signal {}", strsignal(sig));
        stopping = true;
        stop_all(SIGTERM);
        kill_at = Clock::now() + std::chrono::seconds(5);
      } else {
        stop_all(SIGKILL);
      }
    }
    int alive = 0;
    for (int r = 0; r < n; ++r) {
      Rank& rk = ranks[static_cast<std::size_t>(r)];
      if (rk.exited) continue;
      int st = 0;
      if (waitpid(rk.pid, &st, WNOHANG) == rk.pid) {
        rk.exited = true;
        rk.status = st;
        kill(-rk.pid, SIGKILL);  // anything the rank left in its group
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!ok && failed < 0 && !stopping) {
          failed = r;
          why = fmt::format("rank {} {}", r, describe(st));
          stopping = true;
          stop_all(SIGTERM);
          kill_at = Clock::now() + std::chrono::seconds(5);
        }
      } else {
        ++alive;
      }
    }
    if (!stopping && timeout_s > 0 &&
        Clock::now() - t0 > std::chrono::duration<double>(timeout_s)) {
      why = fmt::format("--timeout {} s passed", timeout_s);
      stopping = true;
      stop_all(SIGTERM);
      kill_at = Clock::now() + std::chrono::seconds(5);
    }
    if (stopping && alive > 0 && Clock::now() > kill_at) stop_all(SIGKILL);
    if (alive == 0) break;
  }
  for (int r = 0; r < n; ++r) drain(r, ranks[static_cast<std::size_t>(r)], true);
  if (why.empty()) return 0;
  fmt::print(stderr, "shoal run: {}; stopped all {} ranks.\n", why, n);
  if (failed >= 0) {
    const Rank& f = ranks[static_cast<std::size_t>(failed)];
    fmt::print(stderr, "shoal run: last lines of rank {}:\n", failed);
    for (const auto& l : f.tail) fmt::print(stderr, "  | {}\n", l);
  }
  for (int r = 0; r < n; ++r)
    if (r != failed)
      fmt::print(stderr, "shoal run:   rank {} {}\n", r,
                 describe(ranks[static_cast<std::size_t>(r)].status));
  if (failed >= 0) {
    int st = ranks[static_cast<std::size_t>(failed)].status;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
  }
  return 1;
}

}  // namespace shoal::cli
