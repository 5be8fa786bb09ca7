// `shoal run --bind cores`: each local rank's share of the CPUs the
// launcher may use, as mpirun --bind-to core and srun --cpu-bind=cores give
// theirs. With ranks <= CPUs, rank r gets a block of CPUs [r*C/n, (r+1)*C/n)
// (its threads stay on them); with more ranks than CPUs, neighbouring ranks
// share one CPU, every CPU carrying ranks as evenly as they go. Measured
// (docs/BENCHMARKS.md): 4 tensor-parallel ranks on 2 cores left to the
// scheduler's migrations ran 19.5-22.3k tok/s, bound 2 to a core
// 21.9-22.4k. Private to launch.
#pragma once

#include <string>
#include <vector>

#include "shoal/core/status.h"

namespace shoal::launch {

// The CPUs this process may run on, in order (sched_getaffinity).
Result<std::vector<int>> allowed_cpus();

// Each of `ranks` ranks' CPUs, from `cpus` (non-empty).
std::vector<std::vector<int>> cpu_blocks(const std::vector<int>& cpus, int ranks);

// "0-3,6" for a set of CPUs, as Linux lists them.
std::string cpu_list(const std::vector<int>& cpus);

// Binds the calling process to `cpus`; an error names them.
Status bind_to(const std::vector<int>& cpus);

}  // namespace shoal::launch
