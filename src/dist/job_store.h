// The job's rendezvous store as a rank reaches it: the address the
// launcher gave (core/launch_env.h: SHOAL_STORE, or MASTER_ADDR and
// MASTER_PORT) and the job's token (SHOAL_JOB_TOKEN). Used by elastic
// training's generations and `--plan auto`. Private to dist.
#pragma once

#include <memory>

#include "shoal/core/status.h"
#include "shoal/net/store.h"

namespace shoal::dist {

// Connects within `seconds`; the error names the store when it is unset,
// malformed or unreachable.
Result<std::unique_ptr<net::Store>> connect_job_store(double seconds);

}  // namespace shoal::dist
