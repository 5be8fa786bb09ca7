// `shoal run --bind cores`: each local rank's share of the CPUs the
// launcher may use, as mpirun --bind-to core and srun --cpu-bind=cores give
// theirs. With ranks <= CPUs, rank r gets a block of CPUs [r*C/n, (r+1)*C/n)
// (its threads stay on them); with more ranks than CPUs, rank r gets CPU
// r mod C, as mpirun maps by core: neighbouring ranks (a pipeline's
// consecutive stages) on different CPUs. Measured on 2 cores (docs/launch.md):
// a 4-stage pipeline 21.0-21.9k tok/s unbound, 22.6-22.8k round the CPUs;
// data parallelism the same; 2 data-parallel pipelines of 2 stages 16%
// slower (both first stages on one core). Which ranks should share a core
// depends on the layout, so binding is opt-in. Private to launch.
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
