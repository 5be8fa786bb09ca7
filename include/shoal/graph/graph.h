// The IR: a Graph owns Nodes; a Node has an op name, attributes, input
// Values and typed outputs. A Value names output `index` of node `node`.
// Nodes are only appended (ids are stable); passes mark nodes dead and
// rewire uses. Shape and dtype inference run when a node is added, so a
// graph is always typed. Not thread-safe: one writer, or many readers.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/tensor/tensor.h"

namespace shoal::graph {

struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;
  bool operator==(const TensorType&) const = default;
  std::string str() const;  // "f32[2, 3]"
};

using AttrValue = std::variant<std::int64_t, double, std::vector<std::int64_t>, std::string>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> init) : m_(init) {}

  void set(const std::string& k, AttrValue v) { m_[k] = std::move(v); }
  bool has(const std::string& k) const { return m_.count(k) != 0; }
  const std::map<std::string, AttrValue>& all() const { return m_; }

  Result<std::int64_t> get_int(const std::string& k) const;
  std::int64_t get_int_or(const std::string& k, std::int64_t d) const;
  Result<double> get_float(const std::string& k) const;
  double get_float_or(const std::string& k, double d) const;
  Result<std::vector<std::int64_t>> get_ints(const std::string& k) const;
  std::vector<std::int64_t> get_ints_or(const std::string& k, std::vector<std::int64_t> d) const;
  Result<std::string> get_string(const std::string& k) const;
  std::string get_string_or(const std::string& k, std::string d) const;

 private:
  std::map<std::string, AttrValue> m_;
};

struct Value {
  int node = -1;
  int index = 0;
  bool valid() const { return node >= 0; }
  bool operator==(const Value&) const = default;
  auto operator<=>(const Value&) const = default;
};

struct Node {
  int id = -1;
  std::string op;
  std::string name;
  Attrs attrs;
  std::vector<Value> inputs;
  std::vector<TensorType> outputs;
  Tensor constant;  // payload of "constant" nodes
  bool alive = true;
  // Schedule slot (pipeline parallelism's micro-batch schedule): among ready
  // nodes, topo_order takes lower slots first. 0 everywhere else.
  std::int64_t slot = 0;
  std::string label() const;  // "node 12 'fc1' (linear)"
};

class Graph {
 public:
  // Adds a node after checking its op, attributes and input types; the
  // error names the node and the shapes involved.
  Result<std::vector<Value>> add_node(const std::string& op, std::vector<Value> inputs,
                                      Attrs attrs = {}, std::string name = "");
  Result<Value> add(const std::string& op, std::vector<Value> inputs, Attrs attrs = {},
                    std::string name = "");
  Value input(const std::string& name, TensorType type);  // fed at run time
  Value constant(Tensor t, std::string name = "");

  const Node& node(int id) const { return nodes_.at(static_cast<std::size_t>(id)); }
  Node& mutable_node(int id) { return nodes_.at(static_cast<std::size_t>(id)); }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  const std::vector<Node>& nodes() const { return nodes_; }
  const TensorType& type(Value v) const;

  void mark_output(Value v) { outputs_.push_back(v); }
  std::vector<Value>& outputs() { return outputs_; }
  const std::vector<Value>& outputs() const { return outputs_; }
  std::vector<int> input_nodes() const;  // alive "input" nodes
  Result<Value> find_input(const std::string& name) const;

  // Redirects every use of `from` (node inputs and graph outputs) to `to`.
  void replace_all_uses(Value from, Value to);
  // Checks a node's op, arity, attributes and inputs against this graph and
  // infers its output types; errors name the node and the input types.
  Result<std::vector<TensorType>> infer_types(const Node& n) const;
  // Re-runs type inference on one node (after a pass edits it).
  Status reinfer(int id);

  // Alive nodes in a valid execution order (inputs before users); an error
  // names a node on a cycle.
  // Kahn's order, smallest ready (slot, id) first; ready nodes in `urgent` go
  // before any other ready node (collectives start as early as possible),
  // ready nodes in `deferred` only when nothing else is ready (consumers of
  // a collective wait as late as possible).
  Result<std::vector<int>> topo_order(const std::set<int>& urgent = {},
                                      const std::set<int>& deferred = {}) const;
  // Per value: number of alive consumers (graph outputs count as one).
  std::map<Value, int> use_counts() const;

 private:
  std::vector<Node> nodes_;
  std::vector<Value> outputs_;
};

}  // namespace shoal::graph
