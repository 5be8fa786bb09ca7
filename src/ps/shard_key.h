// Shard::Key, shared by the shard's files. Private to ps.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "shoal/ps/shard.h"
#include "shoal/runtime/backend.h"

namespace shoal::ps {

// One key: its value, the optimizer's update compiled for its shape (the
// training kernels), its state, and the sync round being collected.
struct Shard::Key {
  std::string name;
  Tensor value;
  std::map<std::string, Tensor> state;   // "opt/<key>/<slot>"
  std::vector<std::string> state_order;  // the update's outputs 1.. in this order
  std::unique_ptr<runtime::Executable> update;
  std::vector<bool> copy_out;  // per update output: copied (not written in place)
  Tensor lr, opt_step;
  std::uint64_t version = 0;  // updates applied
  // The update's gradient input. Sync: the open round's (for step ==
  // version) sum of gradients, made the mean in place when it closes; who
  // pushed, and who it waits for (the workers live when it opened). Async
  // pushes are bound in its place for their update, without a copy.
  Tensor sum;
  double round_lr = 0;                             // the learning rate the round's pushes carried
  std::chrono::steady_clock::time_point opened{};  // the round's first push
  std::set<int> pushed, waits_for;
};

}  // namespace shoal::ps
