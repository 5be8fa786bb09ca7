// Optimizers as graph ops, the nGraph way: after autodiff, one fused update
// node per parameter reads (param, grad, lr, state...) and produces the new
// parameter and state as graph outputs, so a whole training step (forward,
// backward, [gradient all-reduce], update) is one graph the backend runs.
// Update ops: sgd_update (plain, momentum, Nesterov, weight decay),
// lars_update (layer-wise trust ratio, You et al. arXiv 1708.03888 /
// 1709.05011), adam_update (Adam, AdamW with decoupled decay, and LAMB's
// trust ratio, arXiv 1904.00962). The learning rate and the step count are
// scalar graph inputs, so a schedule never recompiles.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/graph/builder.h"

namespace shoal::train {

// Registers the update ops and their CPU kernels (idempotent, thread-safe).
void register_optimizer_ops();

struct OptimizerOptions {
  std::string name = "sgd";  // sgd, momentum, nesterov, adam, adamw, lars, lamb
  double momentum = 0.9;     // momentum, nesterov, lars
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw, lamb
  double trust = 0.001;                           // LARS eta
};
// Checks the name and ranges; the error names the field.
Status validate(const OptimizerOptions& o);
// Whether the optimizer scales each tensor's update by norms of the whole
// tensor (lars, lamb): it cannot update a shard or a slice of one alone.
bool is_layerwise(const std::string& name);

struct ParamRef {
  std::string name;
  graph::Value param, grad;
};

// What append_optimizer added: graph inputs to feed each step ("lr", and
// "opt_step" = 1, 2, ... for Adam-family bias correction), state inputs with
// their initial value (zeros), and outputs holding the next params/state.
struct OptimizerGraph {
  graph::Value lr, step;
  std::vector<graph::Value> new_params;  // one per ParamRef, same order
  struct State {
    std::string name;  // "opt/<param>/<slot>"
    graph::Value input, output;
  };
  std::vector<State> state;
  // Set by a pass that shards the state (dp/sharded.h): how this rank's
  // state tensors relate to the per-parameter ("logical") tensors one
  // process would hold, so checkpoints hold the logical ones and load into
  // any layout. Both functions are collective over the pass's ranks.
  struct Layout {
    std::map<std::string, Shape> logical;  // "opt/<param>/<slot>" -> the parameter's shape
    // The logical tensors from each rank's state (every rank takes part);
    // this rank keeps in `logical` those `keep` names.
    std::function<Status(const std::map<std::string, Tensor>& state,
                         const std::function<bool(const std::string&)>& keep,
                         std::map<std::string, Tensor>& logical)>
        gather;
    // This rank's state from the logical tensors (every rank holds them).
    std::function<Status(const std::map<std::string, Tensor>& logical,
                         std::map<std::string, Tensor>& state)>
        scatter;
  };
  std::shared_ptr<Layout> layout;  // null: the state is per parameter, the same on every rank
};

// Appends one update node per parameter. 1-D parameters (biases, norm
// scales) are excluded from the LARS/LAMB trust ratio and their weight
// decay, as in the papers' reference implementations.
Result<OptimizerGraph> append_optimizer(graph::Builder& b, const OptimizerOptions& o,
                                        const std::vector<ParamRef>& params);

// Learning-rate schedule over optimizer steps: linear warmup from 0 for
// `warmup` steps, then constant, step (x gamma every `step_size` steps) or
// cosine (to 0 at `total` steps).
struct LrSchedule {
  std::string kind = "constant";  // constant, step, cosine
  double base = 0.01;
  std::int64_t warmup = 0, total = 1, step_size = 1;
  double gamma = 0.1;
  double at(std::int64_t step) const;  // step counts from 0
};
Status validate(const LrSchedule& s);

}  // namespace shoal::train
