// CPU affinity: the CPUs this process may use, how ranks share them, and
// binding to them. `shoal run --bind cores` (launch) binds each local rank
// to cpu_blocks' share before it starts; `--bind layout` leaves it to the
// trainer (dp), which knows which ranks run at once and which take turns.
// With ranks <= CPUs, rank r gets a block [r*C/n, (r+1)*C/n) (its threads
// stay on them); with more ranks than CPUs, rank r gets CPU r mod C, as
// mpirun maps by core. Measured on 2 cores (docs/launch.md): a 4-stage
// pipeline 21.0-21.9k tok/s unbound, 22.6-22.8k round the CPUs; data
// parallelism the same; 2 data-parallel pipelines of 2 stages 16% slower
// round the CPUs (both first stages on one core), not with --bind layout.
#pragma once

#include <string>
#include <vector>

#include "shoal/core/status.h"

namespace shoal {

// The CPUs this process may run on, in order (sched_getaffinity).
Result<std::vector<int>> allowed_cpus();

// Each of `ranks` ranks' CPUs, from `cpus` (non-empty).
std::vector<std::vector<int>> cpu_blocks(const std::vector<int>& cpus, int ranks);

// "0-3,6" for a set of CPUs, as Linux lists them.
std::string cpu_list(const std::vector<int>& cpus);

// Binds every thread of this process to `cpus`; an error names them.
Status bind_process(const std::vector<int>& cpus);

}  // namespace shoal
