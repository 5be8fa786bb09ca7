// How a job's ranks split one model, and the one place that composes the
// strategies' passes for it: --dp x --tp x --pp with --zero and
// --micro-batches. Rank r = (data group g, stage s, tensor rank t):
// r = g·P·T + s·T + t. Tensor parallelism (mp/tensor_parallel.h) runs over
// each group of T consecutive ranks, pipeline stages (mp/pipeline.h) over
// the ranks with the same g and t, data parallelism (dp/data_parallel.h,
// ZeRO included) over the ranks holding the same slice of the same stage;
// gradient accumulation (mp/accumulate.h) wraps what the others did to the
// forward. No strategy names another: each is attached here in order.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/dp/allreduce.h"
#include "shoal/train/trainer.h"

namespace shoal::dist {

struct Layout {
  int tp = 1;                      // > 1: tensor-parallel ranks per group
  bool sequence_parallel = false;  // with tp: mp::shard_sequence
  int dp = 0;                      // data-parallel groups (0: the job's ranks / (tp * pp))
  // > 1: pipeline stages, each batch in micro_batches under pp_schedule
  // ("1f1b", "gpipe"); pp_cuts: indices of the model's cut places (empty:
  // balanced by estimated cost); pp_virtual: model chunks per rank
  // (interleaved stages, mp::PipelineOptions::chunks). With pp 1,
  // micro_batches > 1 accumulates gradients.
  int pp = 1;
  int pp_virtual = 1;
  int micro_batches = 0;  // 0: the default, 4 with --pp > 1, else 1
  std::string pp_schedule = "1f1b";
  std::vector<std::size_t> pp_cuts;
};

// micro_batches with its default applied.
int micro_batches(const Layout& l);

// The flags by themselves, and with data parallelism's (ZeRO-3 does not
// compose with micro-batches).
Status validate(const Layout& l, const dp::DpOptions& d);
// Whether the layout fits a job of `ranks` ranks.
Status check_layout(const Layout& l, const dp::DpOptions& d, int ranks);

// Attaches the passes of `l` and `d` to `o` over `c`'s ranks (one process:
// only gradient accumulation). `c` must outlive the trainer built from `o`.
Status attach(train::TrainOptions& o, comm::Communicator& c, const Layout& l,
              const dp::DpOptions& d);

}  // namespace shoal::dist
