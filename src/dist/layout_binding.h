// `shoal run --bind layout` (SHOAL_BIND=layout): a rank binds itself by its
// place in the training layout. With more local ranks than CPUs, ranks that
// run at once should sit on different CPUs and ranks that take turns share
// one: data group g, pipeline stage s and tensor rank t go to CPU
// (g + s + t) mod C. On 2 CPUs that puts a pipeline's neighbouring stages,
// a tensor group's peers and data-parallel replicas apart, and the first
// stages of 2 data-parallel pipelines apart (mpirun's round-robin puts both
// on one core: 16% slower, docs/launch.md). With at most one rank per CPU,
// each gets its block, as --bind cores. Private to dist.
#pragma once

#include "shoal/core/status.h"

namespace shoal::dist {

// A rank's place in --dp x --pp x --tp: rank = group·P·T + stage·T + tensor
// (P or T may be 1). The one convention the pipeline composition (compose.cc) and the binding use.
struct LayoutPlace {
  int group, stage, tensor;
};
inline LayoutPlace place_in_layout(int rank, int tp, int pp) {
  return {rank / (pp * tp), rank / tp % pp, rank % tp};
}

// Does nothing unless SHOAL_BIND=layout. Local ranks are counted from
// SHOAL_LOCAL_RANK / SHOAL_LOCAL_WORLD_SIZE.
Status bind_to_layout(int rank, int world, int tp, int pp);

}  // namespace shoal::dist
