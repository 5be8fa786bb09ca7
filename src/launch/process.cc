#include "launch/process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "shoal/core/cpus.h"
#include "shoal/core/file.h"

namespace shoal::launch {

namespace {
int g_sig_pipe[2] = {-1, -1};
void on_signal(int sig) {
  unsigned char b = static_cast<unsigned char>(sig);
  (void)!write(g_sig_pipe[1], &b, 1);
}
}  // namespace

int signal_fd() { return g_sig_pipe[0]; }

bool catch_signals() {
  if (pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return true;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return "stopped";
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> b(bytes);
  randombytes_buf(b.data(), b.size());
  std::string s;
  for (unsigned char c : b) s += fmt::format("{:02x}", c);
  return s;
}

int poll_procs(std::vector<Proc>& procs, Output& out) {
  std::vector<pollfd> fds{{signal_fd(), POLLIN, 0}};
  std::vector<int> who{-1};
  for (std::size_t i = 0; i < procs.size(); ++i)
    if (procs[i].out >= 0) {
      fds.push_back({procs[i].out, POLLIN, 0});
      who.push_back(static_cast<int>(i));
    }
  poll(fds.data(), fds.size(), 100);
  for (std::size_t k = 1; k < fds.size(); ++k)
    if (fds[k].revents) drain(who[k], procs[static_cast<std::size_t>(who[k])], out, false);
  if (!(fds[0].revents & POLLIN)) return 0;
  unsigned char sig = 0;
  while (read(signal_fd(), &sig, 1) == 1) {
  }
  return sig;
}

void drain(int unit, Proc& p, Output& out, bool final) {
  char buf[65536];
  while (p.out >= 0) {
    ssize_t n = read(p.out, buf, sizeof buf);
    if (n > 0) {
      p.partial.append(buf, static_cast<std::size_t>(n));
      std::size_t pos;
      while ((pos = p.partial.find('\n')) != std::string::npos) {
        out.line(unit, p.partial.substr(0, pos));
        p.partial.erase(0, pos + 1);
      }
      continue;
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      close(p.out);
      p.out = -1;
    }
    break;
  }
  if ((final || p.out < 0) && !p.partial.empty()) {
    out.line(unit, p.partial);
    p.partial.clear();
  }
  std::fflush(stdout);
}

// Forks `argv` in a new process group with `env` added; its stdout and
// stderr go to one pipe. exec failures come back through a CLOEXEC pipe.
Result<Proc> spawn(const std::vector<std::string>& argv,
                   const std::vector<std::pair<std::string, std::string>>& env,
                   const std::vector<int>& cpus) {
  // Built before the fork: the child calls only async-signal-safe functions.
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  const std::string unbound = fmt::format(
      "shoal run: could not bind this rank to CPUs {}; it runs unbound\n", cpu_list(cpus));
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return unavailable("pipe: {}", std::strerror(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return unavailable("pipe: {}", std::strerror(errno));
  }
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  const pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid < 0) return unavailable("fork: {}", std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    // A rank leads its own process group, so a SIGKILL to the launcher
    // reaches no rank: have the kernel kill it when the launcher dies (and
    // check the launcher did not die before this line).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(128 + SIGKILL);
    dup2(out[1], 1);
    dup2(out[1], 2);
    if (!cpus.empty() && sched_setaffinity(0, sizeof set, &set) != 0)
      (void)!write(2, unbound.data(), unbound.size());
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execvp(av[0], av.data());
    int e = errno;
    (void)!write(err[1], &e, sizeof e);
    _exit(127);
  }
  setpgid(pid, pid);
  close(out[1]);
  close(err[1]);
  int e = 0;
  ssize_t got = read(err[0], &e, sizeof e);  // EOF on a successful exec
  close(err[0]);
  if (got == static_cast<ssize_t>(sizeof e)) {
    waitpid(pid, nullptr, 0);
    close(out[0]);
    return not_found("cannot start '{}': {}", argv[0], std::strerror(e));
  }
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  Proc p;
  p.pid = pid;
  p.out = out[0];
  return p;
}

// Whether a process is stopped (SIGSTOP, SIGTSTP, a debugger): alive, its
// sockets open, and answering nothing. /proc/<pid>/stat's third field.
char proc_state(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(f, line)) return 0;
  std::size_t close = line.rfind(')');  // the command name may hold spaces
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : 0;
}

bool is_stopped(pid_t pid) {
  const char c = proc_state(pid);
  return c == 'T' || c == 't';
}

Status write_job_env(const std::string& dir,
                     const std::vector<std::pair<std::string, std::string>>& env) {
  std::string text;
  for (const auto& [k, v] : env)
    if (k == "SHOAL_STORE" || k == "SHOAL_JOB_TOKEN" || k == "SHOAL_JOB_ID")
      text += fmt::format("{}={}\n", k, v);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return write_file_atomic(dir + "/job.env", text, 0600);
}

std::string self_exe() {
  char self[4096] = {0};
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  return len > 0 ? std::string(self, static_cast<std::size_t>(len)) : std::string();
}

}  // namespace shoal::launch
