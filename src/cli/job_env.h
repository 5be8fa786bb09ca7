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

}  // namespace shoal::cli
