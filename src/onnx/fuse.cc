// Decompositions exporters write, put back together. torch.onnx.export below
// opset 17 writes nn.LayerNorm as nine nodes (ReduceMean, Sub, Pow, ReduceMean,
// Add, Sqrt, Div, Mul, Add) and the exact GELU as five (Div by sqrt 2, Erf,
// Add 1, Mul by x, Mul by 0.5). Imported node by node they run as a dozen
// memory-bound passes forward and more backward (an MLP-Mixer spent a third of
// its step in them, Pow's gradient alone 10%); Shoal's layer_norm and gelu ops
// are one pass each way. Only exact matches are fused: every intermediate value
// read by the pattern alone, the constants the ones the decomposition needs.
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "onnx/context.h"

namespace shoal::onnx {

namespace {

using ::onnx::GraphProto;
using ::onnx::NodeProto;

class Matcher {
 public:
  explicit Matcher(const GraphProto& g) : g_(g) {
    for (int i = 0; i < g.node_size(); ++i) {
      for (const auto& in : g.node(i).input()) readers_[in].push_back(i);
      for (const auto& out : g.node(i).output()) producer_[out] = i;
    }
    for (const auto& o : g.output()) readers_[o.name()].push_back(-1);
    for (const auto& t : g.initializer()) inits_[t.name()] = &t;
  }

  // The one default-domain node of type `op` that reads `value`, and
  // nothing else reads it; -1 otherwise.
  int only_reader(const std::string& value, const std::string& op) const {
    auto r = readers_.find(value);
    if (r == readers_.end() || r->second.size() != 1 || r->second[0] < 0) return -1;
    const NodeProto& n = g_.node(r->second[0]);
    return n.op_type() == op && n.domain().empty() ? r->second[0] : -1;
  }

  // The readers of `value`, or empty when a graph output is among them.
  std::vector<int> readers(const std::string& value) const {
    auto r = readers_.find(value);
    if (r == readers_.end()) return {};
    for (int i : r->second)
      if (i < 0) return {};
    return r->second;
  }

  // A one-element float constant (a Constant node's value or an initializer).
  std::optional<double> scalar(const std::string& value) const {
    const ::onnx::TensorProto* p = nullptr;
    if (auto it = inits_.find(value); it != inits_.end()) p = it->second;
    if (auto it = producer_.find(value); !p && it != producer_.end()) {
      const NodeProto& n = g_.node(it->second);
      if (n.op_type() != "Constant") return std::nullopt;
      for (const auto& a : n.attribute())
        if (a.name() == "value") p = &a.t();
    }
    if (!p) return std::nullopt;
    auto t = from_proto(*p);
    if (!t.ok() || t->numel() != 1 || !is_floating(t->dtype())) return std::nullopt;
    return t->get(0);
  }

  bool is_vector_initializer(const std::string& value) const {
    auto it = inits_.find(value);
    return it != inits_.end() && it->second->dims_size() == 1;
  }

  // The input of binary node n other than `value`, or "" when neither is.
  std::string other_input(int n, const std::string& value) const {
    const NodeProto& node = g_.node(n);
    if (node.input_size() != 2) return "";
    if (node.input(0) == value) return node.input(1);
    if (node.input(1) == value) return node.input(0);
    return "";
  }

  const NodeProto& node(int i) const { return g_.node(i); }

 private:
  const GraphProto& g_;
  std::map<std::string, std::vector<int>> readers_;
  std::map<std::string, int> producer_;
  std::map<std::string, const ::onnx::TensorProto*> inits_;
};

bool close(std::optional<double> v, double want) {
  return v && std::abs(*v - want) <= 1e-6 * std::max(1.0, std::abs(want));
}

bool last_axis_mean(const NodeProto& n) {
  if (n.op_type() != "ReduceMean" || !n.domain().empty() || n.input_size() != 1) return false;
  bool axes_ok = false;
  for (const auto& a : n.attribute()) {
    if (a.name() == "keepdims" && a.i() != 1) return false;
    if (a.name() == "axes") axes_ok = a.ints_size() == 1 && a.ints(0) == -1;
  }
  return axes_ok;
}

struct Fusion {
  std::vector<int> nodes;  // replaced; the fused node takes the last one's place
  NodeProto fused;
};

// mean -> x - mean -> (.)^2 -> mean -> + eps -> sqrt -> (x - mean) / sqrt
// -> * gamma -> + beta, over the last axis.
std::optional<Fusion> layer_norm_at(const Matcher& m, int r1) {
  if (!last_axis_mean(m.node(r1))) return std::nullopt;
  const std::string& x = m.node(r1).input(0);
  int sub = m.only_reader(m.node(r1).output(0), "Sub");
  if (sub < 0 || m.node(sub).input(0) != x) return std::nullopt;
  const std::string& centred = m.node(sub).output(0);
  auto rd = m.readers(centred);
  if (rd.size() != 2) return std::nullopt;
  int pow = m.node(rd[0]).op_type() == "Pow" ? rd[0] : rd[1];
  int div = pow == rd[0] ? rd[1] : rd[0];
  if (m.node(pow).op_type() != "Pow" || m.node(div).op_type() != "Div") return std::nullopt;
  if (m.node(pow).input(0) != centred || !close(m.scalar(m.node(pow).input(1)), 2.0))
    return std::nullopt;
  int r2 = m.only_reader(m.node(pow).output(0), "ReduceMean");
  if (r2 < 0 || !last_axis_mean(m.node(r2))) return std::nullopt;
  int add = m.only_reader(m.node(r2).output(0), "Add");
  if (add < 0) return std::nullopt;
  auto eps = m.scalar(m.other_input(add, m.node(r2).output(0)));
  if (!eps || *eps < 0) return std::nullopt;
  int sqrt = m.only_reader(m.node(add).output(0), "Sqrt");
  if (sqrt < 0 || m.only_reader(m.node(sqrt).output(0), "Div") != div ||
      m.node(div).input(0) != centred)
    return std::nullopt;
  int mul = m.only_reader(m.node(div).output(0), "Mul");
  if (mul < 0) return std::nullopt;
  std::string gamma = m.other_input(mul, m.node(div).output(0));
  int bias = m.only_reader(m.node(mul).output(0), "Add");
  if (bias < 0 || !m.is_vector_initializer(gamma)) return std::nullopt;
  std::string beta = m.other_input(bias, m.node(mul).output(0));
  if (!m.is_vector_initializer(beta)) return std::nullopt;
  Fusion f;
  f.nodes = {r1, sub, pow, r2, add, sqrt, div, mul, bias};
  f.fused.set_op_type("LayerNormalization");
  f.fused.set_name(m.node(bias).name() + "/fused_layer_norm");
  for (const std::string& in : {x, gamma, beta}) f.fused.add_input(in);
  f.fused.add_output(m.node(bias).output(0));
  auto* a = f.fused.add_attribute();
  a->set_name("epsilon"), a->set_type(::onnx::AttributeProto::FLOAT), a->set_f(*eps);
  a = f.fused.add_attribute();
  a->set_name("axis"), a->set_type(::onnx::AttributeProto::INT), a->set_i(-1);
  return f;
}

// x / sqrt(2) -> erf -> + 1 -> * x -> * 0.5
std::optional<Fusion> gelu_at(const Matcher& m, int div) {
  const NodeProto& d = m.node(div);
  if (d.op_type() != "Div" || !d.domain().empty() || d.input_size() != 2 ||
      !close(m.scalar(d.input(1)), std::sqrt(2.0)))
    return std::nullopt;
  const std::string& x = d.input(0);
  int erf = m.only_reader(d.output(0), "Erf");
  if (erf < 0) return std::nullopt;
  int add = m.only_reader(m.node(erf).output(0), "Add");
  if (add < 0 || !close(m.scalar(m.other_input(add, m.node(erf).output(0))), 1.0))
    return std::nullopt;
  int mul = m.only_reader(m.node(add).output(0), "Mul");
  if (mul < 0 || m.other_input(mul, m.node(add).output(0)) != x) return std::nullopt;
  int half = m.only_reader(m.node(mul).output(0), "Mul");
  if (half < 0 || !close(m.scalar(m.other_input(half, m.node(mul).output(0))), 0.5))
    return std::nullopt;
  Fusion f;
  f.nodes = {div, erf, add, mul, half};
  f.fused.set_op_type("Gelu");
  f.fused.set_domain(kFusedDomain);
  f.fused.set_name(m.node(half).name() + "/fused_gelu");
  f.fused.add_input(x);
  f.fused.add_output(m.node(half).output(0));
  return f;
}

}  // namespace

int fuse_decompositions(GraphProto& g) {
  std::vector<Fusion> found;
  {
    Matcher m(g);
    std::set<int> taken;
    for (int i = 0; i < g.node_size(); ++i) {
      auto f = layer_norm_at(m, i);
      if (!f) f = gelu_at(m, i);
      if (!f) continue;
      bool free = true;
      for (int n : f->nodes) free = free && !taken.count(n);
      if (!free) continue;
      taken.insert(f->nodes.begin(), f->nodes.end());
      found.push_back(std::move(*f));
    }
  }
  if (found.empty()) return 0;
  std::map<int, const NodeProto*> replace;  // the pattern's last node -> fused node
  std::set<int> drop;
  for (const auto& f : found) {
    int last = *std::max_element(f.nodes.begin(), f.nodes.end());
    replace[last] = &f.fused;
    drop.insert(f.nodes.begin(), f.nodes.end());
  }
  google::protobuf::RepeatedPtrField<NodeProto> nodes;
  for (int i = 0; i < g.node_size(); ++i) {
    if (auto r = replace.find(i); r != replace.end())
      *nodes.Add() = *r->second;
    else if (!drop.count(i))
      *nodes.Add() = g.node(i);
  }
  g.mutable_node()->Swap(&nodes);
  return static_cast<int>(found.size());
}

}  // namespace shoal::onnx
