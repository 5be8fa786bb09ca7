// The op registry: each op's arity, attributes, shape/dtype inference and
// gradient rule. Gradient rules emit graph ops (so gradients are graphs and
// second order works where the ops allow). Registration happens at static
// init or before graphs are built; lookups are then thread-safe.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "shoal/graph/graph.h"

namespace shoal::graph {

class Builder;

struct GradInputs {
  Builder& b;
  const Node& node;                 // a copy: safe while the graph grows
  std::vector<Value> outputs;       // the node's outputs
  std::vector<Value> output_grads;  // invalid where no gradient flows
};

struct OpDef {
  std::string name;
  int min_inputs = 1;
  int max_inputs = 1;              // -1: variadic
  std::vector<std::string> attrs;  // allowed attribute names
  std::function<Result<std::vector<TensorType>>(const Node&, const std::vector<TensorType>&)> infer;
  // Returns one Value per input (invalid = no gradient); null if the op is
  // not differentiable.
  std::function<std::vector<Value>(GradInputs&)> grad;
  bool random = false;  // never constant-folded
};

class OpRegistry {
 public:
  static OpRegistry& global();
  void add(OpDef def);
  const OpDef* find(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, OpDef> ops_;
};

}  // namespace shoal::graph
