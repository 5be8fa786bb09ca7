#include "shoal/graph/graph.h"

#include <algorithm>
#include <set>

#include "shoal/graph/op_registry.h"

namespace shoal::graph {

std::string TensorType::str() const {
  return fmt::format("{}{}", dtype_name(dtype), shape_str(shape));
}

namespace {
template <typename T>
const char* kind_name() {
  if constexpr (std::is_same_v<T, std::int64_t>)
    return "int";
  else if constexpr (std::is_same_v<T, double>)
    return "float";
  else if constexpr (std::is_same_v<T, std::string>)
    return "string";
  else
    return "int list";
}
template <typename T>
Result<T> get_as(const std::map<std::string, AttrValue>& m, const std::string& k) {
  auto it = m.find(k);
  if (it == m.end()) return not_found("missing attribute '{}'", k);
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  if constexpr (std::is_same_v<T, double>) {
    if (const auto* i = std::get_if<std::int64_t>(&it->second)) return static_cast<double>(*i);
  }
  return invalid_argument("attribute '{}' is not of kind {}", k, kind_name<T>());
}
}  // namespace

Result<std::int64_t> Attrs::get_int(const std::string& k) const {
  return get_as<std::int64_t>(m_, k);
}
std::int64_t Attrs::get_int_or(const std::string& k, std::int64_t d) const {
  auto r = get_int(k);
  return r.ok() ? *r : d;
}
Result<double> Attrs::get_float(const std::string& k) const { return get_as<double>(m_, k); }
double Attrs::get_float_or(const std::string& k, double d) const {
  auto r = get_float(k);
  return r.ok() ? *r : d;
}
Result<std::vector<std::int64_t>> Attrs::get_ints(const std::string& k) const {
  return get_as<std::vector<std::int64_t>>(m_, k);
}
std::vector<std::int64_t> Attrs::get_ints_or(const std::string& k,
                                             std::vector<std::int64_t> d) const {
  auto r = get_ints(k);
  return r.ok() ? *r : d;
}
Result<std::string> Attrs::get_string(const std::string& k) const {
  return get_as<std::string>(m_, k);
}
std::string Attrs::get_string_or(const std::string& k, std::string d) const {
  auto r = get_string(k);
  return r.ok() ? *r : d;
}

std::string Node::label() const {
  if (name.empty()) return fmt::format("node {} ({})", id, op);
  return fmt::format("node {} '{}' ({})", id, name, op);
}

const TensorType& Graph::type(Value v) const {
  SHOAL_CHECK(v.node >= 0 && v.node < num_nodes(), "value of node {} not in graph", v.node);
  const Node& n = nodes_[static_cast<std::size_t>(v.node)];
  SHOAL_CHECK(v.index >= 0 && v.index < static_cast<int>(n.outputs.size()), "{} has no output {}",
              n.label(), v.index);
  return n.outputs[static_cast<std::size_t>(v.index)];
}

Result<std::vector<TensorType>> Graph::infer_types(const Node& n) const {
  const Graph& g = *this;
  const OpDef* def = OpRegistry::global().find(n.op);
  if (def == nullptr) return invalid_argument("{}: unknown op '{}'", n.label(), n.op);
  int ni = static_cast<int>(n.inputs.size());
  if (ni < def->min_inputs || (def->max_inputs >= 0 && ni > def->max_inputs))
    return invalid_argument(
        "{}: takes {}..{} inputs, got {}", n.label(), def->min_inputs,
        def->max_inputs < 0 ? std::string("n") : std::to_string(def->max_inputs), ni);
  // Names starting with '_' are annotations a backend pass adds for its own
  // kernels (e.g. "_blocked_in"); they are not part of the op's contract.
  for (const auto& [k, v] : n.attrs.all())
    if (!k.starts_with('_') &&
        std::find(def->attrs.begin(), def->attrs.end(), k) == def->attrs.end())
      return invalid_argument("{}: unknown attribute '{}'", n.label(), k);
  std::vector<TensorType> in;
  for (std::size_t i = 0; i < n.inputs.size(); ++i) {
    Value v = n.inputs[i];
    if (v.node < 0 || v.node >= g.num_nodes() || (n.id >= 0 && v.node == n.id))
      return invalid_argument("{}: input {} refers to missing node {}", n.label(), i, v.node);
    const Node& src = g.node(v.node);
    if (!src.alive)
      return invalid_argument("{}: input {} comes from dead {}", n.label(), i, src.label());
    if (v.index < 0 || v.index >= static_cast<int>(src.outputs.size()))
      return invalid_argument("{}: input {} refers to output {} of {}, which has {}", n.label(), i,
                              v.index, src.label(), src.outputs.size());
    in.push_back(src.outputs[static_cast<std::size_t>(v.index)]);
  }
  auto r = def->infer(n, in);
  if (!r.ok()) {
    std::string shapes;
    for (std::size_t i = 0; i < in.size(); ++i)
      shapes += fmt::format("{}{}", i ? ", " : "", in[i].str());
    return Status(r.status().code(),
                  fmt::format("{}: {} (inputs: {})", n.label(), r.status().message(), shapes));
  }
  return r;
}

Result<std::vector<Value>> Graph::add_node(const std::string& op, std::vector<Value> inputs,
                                           Attrs attrs, std::string name) {
  Node n;
  n.id = num_nodes();
  n.op = op;
  n.name = std::move(name);
  n.attrs = std::move(attrs);
  n.inputs = std::move(inputs);
  SHOAL_ASSIGN_OR_RETURN(n.outputs, infer_types(n));
  nodes_.push_back(std::move(n));
  std::vector<Value> outs;
  for (std::size_t i = 0; i < nodes_.back().outputs.size(); ++i)
    outs.push_back(Value{nodes_.back().id, static_cast<int>(i)});
  return outs;
}

Result<Value> Graph::add(const std::string& op, std::vector<Value> inputs, Attrs attrs,
                         std::string name) {
  SHOAL_ASSIGN_OR_RETURN(auto outs,
                         add_node(op, std::move(inputs), std::move(attrs), std::move(name)));
  if (outs.empty()) return internal_error("op {} has no outputs", op);
  return outs[0];
}

Value Graph::input(const std::string& name, TensorType type) {
  Node n;
  n.id = num_nodes();
  n.op = "input";
  n.name = name;
  n.outputs = {std::move(type)};
  nodes_.push_back(std::move(n));
  return Value{nodes_.back().id, 0};
}

Value Graph::constant(Tensor t, std::string name) {
  Node n;
  n.id = num_nodes();
  n.op = "constant";
  n.name = std::move(name);
  n.outputs = {TensorType{t.dtype(), t.shape()}};
  n.constant = t.contiguous();
  nodes_.push_back(std::move(n));
  return Value{nodes_.back().id, 0};
}

std::vector<int> Graph::input_nodes() const {
  std::vector<int> out;
  for (const Node& n : nodes_)
    if (n.alive && n.op == "input") out.push_back(n.id);
  return out;
}

Result<Value> Graph::find_input(const std::string& name) const {
  for (const Node& n : nodes_)
    if (n.alive && n.op == "input" && n.name == name) return Value{n.id, 0};
  return not_found("graph has no input named '{}'", name);
}

void Graph::replace_all_uses(Value from, Value to) {
  for (Node& n : nodes_)
    for (Value& v : n.inputs)
      if (v == from) v = to;
  for (Value& v : outputs_)
    if (v == from) v = to;
}

Status Graph::reinfer(int id) {
  Node& n = mutable_node(id);
  if (n.op == "input" || n.op == "constant") return ok_status();
  SHOAL_ASSIGN_OR_RETURN(auto outs, infer_types(n));
  n.outputs = std::move(outs);
  return ok_status();
}

Result<std::vector<int>> Graph::topo_order(const std::set<int>& urgent,
                                           const std::set<int>& deferred) const {
  // Kahn's algorithm over alive nodes, stable by id so orders are reproducible.
  std::vector<int> indeg(nodes_.size(), 0);
  std::vector<std::vector<int>> users(nodes_.size());
  for (const Node& n : nodes_) {
    if (!n.alive) continue;
    for (const Value& v : n.inputs) {
      if (v.node < 0 || v.node >= num_nodes() || !nodes_[v.node].alive)
        return invalid_argument("{}: input from missing or dead node {}", n.label(), v.node);
      ++indeg[n.id];
      users[v.node].push_back(n.id);
    }
  }
  // Ready sets ordered by (slot, id): a schedule's slots first, then ids.
  using Key = std::pair<std::int64_t, int>;
  std::set<Key> ready, ready_urgent, ready_deferred;
  auto make_ready = [&](int id) {
    const Key k{nodes_[id].slot, id};
    (urgent.count(id) ? ready_urgent : deferred.count(id) ? ready_deferred : ready).insert(k);
  };
  for (const Node& n : nodes_)
    if (n.alive && indeg[n.id] == 0) make_ready(n.id);
  std::vector<int> order;
  while (!ready.empty() || !ready_urgent.empty() || !ready_deferred.empty()) {
    std::set<Key>& from = !ready_urgent.empty() ? ready_urgent
                          : !ready.empty()      ? ready
                                                : ready_deferred;
    const int id = from.begin()->second;
    from.erase(from.begin());
    order.push_back(id);
    for (int u : users[id])
      if (--indeg[u] == 0) make_ready(u);
  }
  std::size_t alive = 0;
  for (const Node& n : nodes_) alive += n.alive ? 1 : 0;
  if (order.size() != alive) {
    for (const Node& n : nodes_)
      if (n.alive && indeg[n.id] > 0)
        return invalid_argument("graph has a cycle through {}", n.label());
  }
  return order;
}

std::map<Value, int> Graph::use_counts() const {
  std::map<Value, int> uses;
  for (const Node& n : nodes_)
    if (n.alive)
      for (const Value& v : n.inputs) ++uses[v];
  for (const Value& v : outputs_) ++uses[v];
  return uses;
}

}  // namespace shoal::graph
