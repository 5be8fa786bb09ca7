// An elastic job's address, as `shoal run` leaves it for the commands that
// ask it for more processes (`shoal join`, `shoal ps join`): DIR/job.env
// holds the store's address, the job's token and id (mode 0600).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "shoal/core/status.h"
#include "shoal/net/store.h"

namespace shoal::cli {

// DIR/job.env's KEY=VALUE lines; `what` names the directory in the error
// when there is none ("the --ps-snapshots directory of a job run with
// --ps-elastic").
Result<std::map<std::string, std::string>> read_job_env(const std::string& dir,
                                                        const std::string& what);

// The job's store (SHOAL_STORE, SHOAL_JOB_TOKEN of `env`) and the value of
// `key` there. A store under a flood of connections refuses new ones until
// its handshake window drops them (10 s): a refusal is retried with backoff
// within 30 s, as workers do.
Result<std::pair<std::unique_ptr<net::TcpStore>, std::string>> reach_job(
    std::map<std::string, std::string>& env, const std::string& key);

// What asking a job for more processes found.
struct Asked {
  std::string job;     // its id (else its store's address)
  std::string limit;   // the launcher's MIN:MAX or MAX
  std::int64_t total;  // asked for in all, this request included
};
// Asks the job whose job.env is in `dir` (`what` names such a directory)
// for `k` more: `limit_key` must be set (an elastic launcher sets it; else
// `not_elastic` says why), and `k` is added to the counter `grow_key`.
Result<Asked> ask_job(const std::string& dir, const std::string& what, const std::string& limit_key,
                      const std::string& grow_key, int k, const std::string& not_elastic);

}  // namespace shoal::cli
