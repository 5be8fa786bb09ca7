// The launcher's processes: spawning a command in its own process group
// (killed with the launcher), reading its output line by line, and
// describing how it ended. Signals to the launcher arrive as bytes on
// signal_fd(). Private to launch.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "launch/output.h"
#include "shoal/core/status.h"

namespace shoal::launch {

// SIGINT/SIGTERM become bytes on signal_fd(), which the poll loops read.
bool catch_signals();
int signal_fd();

std::string describe(int status);  // "exited with code 3", "was killed by signal 9 (Killed)"
int exit_code_of(int status);      // the code, or 128 + signal
std::string random_hex(std::size_t bytes);

// One process the launcher started: a rank (local engine) or the engine's
// own launcher (mpirun, srun), each leading its own process group.
struct Proc {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout+stderr
  std::string partial;
  bool exited = false;
  int status = 0;
};

// Reads what `p` wrote and hands whole lines to out.line(unit, ...); with
// `final` (or at EOF) a last partial line too.
void drain(int unit, Proc& p, Output& out, bool final);

// Waits up to 100 ms for output of `procs` (each line handed to `out`)
// or a signal to the launcher; returns that signal, or 0.
int poll_procs(std::vector<Proc>& procs, Output& out);

// Forks `argv` in a new process group with `env` added, bound to `cpus`
// unless empty; its stdout and stderr go to one pipe. It dies with the launcher (PR_SET_PDEATHSIG).
Result<Proc> spawn(const std::vector<std::string>& argv,
                   const std::vector<std::pair<std::string, std::string>>& env,
                   const std::vector<int>& cpus = {});

// Whether a process is stopped (SIGSTOP, SIGTSTP, a debugger).
bool is_stopped(pid_t pid);
// Its state letter in /proc/<pid>/stat ('R', 'S', 'T' stopped by a signal,
// 't' stopped by a tracer...), 0 when unreadable.
char proc_state(pid_t pid);

// This executable's path (/proc/self/exe), "" if unreadable.
std::string self_exe();

// An elastic job's address for the commands that ask it for more processes
// (`shoal join`, `shoal ps join`; cli/job_env.h reads it): SHOAL_STORE,
// SHOAL_JOB_TOKEN and SHOAL_JOB_ID of `env` in dir/job.env, readable by this
// user only from the moment it exists. Makes `dir` if need be.
Status write_job_env(const std::string& dir,
                     const std::vector<std::pair<std::string, std::string>>& env);

}  // namespace shoal::launch
