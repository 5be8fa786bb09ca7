// Loading (the ONNX library's parser, checker and shape inference) and
// emission (each node through its converter, in the file's order, which
// ONNX requires to be topological).
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>

#include "onnx/context.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/graph/passes.h"

namespace shoal::onnx {

using graph::Value;

struct Model::Proto {
  ::onnx::ModelProto m;
};

// Torch 1.13 writes opsets 7-17; the suite of libonnx 1.12 goes to 17 (a
// few of its tests are opset 1).
constexpr int kMinOpset = 1, kMaxOpset = 17;

std::map<std::string, Converter>& converters() {
  static std::map<std::string, Converter> t = [] {
    std::map<std::string, Converter> m;
    add_math_ops(m);
    add_nn_ops(m);
    add_shape_ops(m);
    add_rnn_ops(m);
    return m;
  }();
  return t;
}

std::map<std::string, Converter>& fused_converters() {
  static std::map<std::string, Converter> t = {{"Gelu", [](Ctx& c) -> Status {
                                                  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
                                                  c.out(0, c.b().gelu(x));
                                                  return ok_status();
                                                }}};
  return t;
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> out;
  for (const auto& [k, v] : converters()) out.push_back(k);
  return out;
}

namespace {

ValueInfo info_of(const ::onnx::ValueInfoProto& v) {
  ValueInfo i;
  i.name = v.name();
  const auto& tt = v.type().tensor_type();
  auto dt = dtype_of(tt.elem_type());
  i.dtype = dt.ok() ? *dt : DType::kF32;
  for (const auto& d : tt.shape().dim()) i.shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
  return i;
}

Status check_ops(const ::onnx::GraphProto& g, int opset, const std::string& where) {
  std::vector<std::string> bad;
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    bool default_domain = n.domain().empty() || n.domain() == "ai.onnx";
    if (!default_domain || !converters().count(n.op_type()))
      bad.push_back(fmt::format("node {} '{}' ({}{}, opset {})", i, n.name(),
                                default_domain ? "" : n.domain() + ".", n.op_type(), opset));
  }
  if (bad.empty()) return ok_status();
  return unimplemented("{}: {} node(s) use operators Shoal does not import: {}. Supported: {}",
                       where, bad.size(), fmt::join(bad, "; "), fmt::join(supported_ops(), " "));
}

// Float initializers of rank >= 1 read by several nodes (an Identity passes
// its input's name on; Shape reads no values).
std::vector<SharedInitializer> find_shared(const ::onnx::GraphProto& g) {
  std::map<std::string, std::string> root;  // a value -> the initializer it names
  for (const auto& t : g.initializer()) {
    auto dt = dtype_of(t.data_type());
    if (dt.ok() && is_floating(*dt) && t.dims_size() > 0) root[t.name()] = t.name();
  }
  std::map<std::string, std::vector<std::string>> readers;
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    if (n.op_type() == "Shape") continue;
    for (const auto& in : n.input()) {
      auto r = root.find(in);
      if (r == root.end()) continue;
      if (n.op_type() == "Identity") {
        root[n.output(0)] = r->second;
        continue;
      }
      auto& v = readers[r->second];
      // Slices of one tensor (the exporter cutting an RNN's weight into its
      // gates) read it as one: Ctx::in binds them to one parameter.
      std::string who = is_view(n) ? "its slices" : node_name(n, i);
      if (std::find(v.begin(), v.end(), who) == v.end()) v.push_back(who);
    }
  }
  std::vector<SharedInitializer> out;
  for (const auto& t : g.initializer())
    if (auto r = readers.find(t.name()); r != readers.end() && r->second.size() > 1)
      out.push_back({t.name(), r->second});
  return out;
}

}  // namespace

bool is_view(const ::onnx::NodeProto& n) {
  return n.op_type() == "Slice" || n.op_type() == "Split";
}

std::string node_name(const ::onnx::NodeProto& n, int index) {
  return n.name().empty() ? fmt::format("node {}", index) : n.name();
}

std::string describe_shared(const Model& m, bool tie_shared) {
  const auto& s = m.shared_initializers();
  if (s.empty()) return "";
  std::vector<std::string> items;
  for (const auto& x : s) items.push_back(fmt::format("'{}' ({} nodes)", x.name, x.nodes.size()));
  if (tie_shared)
    return fmt::format(
        "{}: {} initializer(s) are read by several nodes and, as asked (tied), each trains as one "
        "parameter: {}",
        m.path(), s.size(), fmt::join(items, ", "));
  return fmt::format(
      "{}: {} initializer(s) are read by several nodes; each node trains its own copy, since "
      "torch.onnx.export merges initializers of equal value (deep-copied layers, zero biases, "
      "unit scales): {}. Weights tied on purpose (an embedding used as the output head) stay one "
      "parameter with onnx_tied=True (shoal train --onnx-tied)",
      m.path(), s.size(), fmt::join(items, ", "));
}

Result<Model> Model::load(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  return parse(bytes, path);
}

Result<Model> Model::parse(const std::string& bytes, const std::string& where) {
  auto p = std::make_shared<Proto>();
  if (!p->m.ParseFromString(bytes))
    return data_loss("{}: not an ONNX model (protobuf parse failed, {} bytes)", where,
                     bytes.size());
  try {
    ::onnx::checker::check_model(p->m);
    ::onnx::shape_inference::InferShapes(p->m);
  } catch (const std::exception& e) {
    return invalid_argument("{}: the ONNX checker refuses the model: {}", where, e.what());
  }
  Model m;
  m.path_ = where;
  for (const auto& o : p->m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") m.opset_ = static_cast<int>(o.version());
  if (m.opset_ < kMinOpset || m.opset_ > kMaxOpset)
    return unimplemented("{}: opset {} is outside the {}-{} Shoal imports", where, m.opset_,
                         kMinOpset, kMaxOpset);
  SHOAL_RETURN_IF_ERROR(check_ops(p->m.graph(), m.opset_, where));
  // SHOAL_ONNX_FUSE=0 imports node by node (what the fusion buys, measured).
  const char* fuse = std::getenv("SHOAL_ONNX_FUSE");
  if (!fuse || std::string(fuse) != "0") m.fused_ = fuse_decompositions(*p->m.mutable_graph());
  const auto& g = p->m.graph();
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  for (const auto& v : g.input())
    if (!inits.count(v.name())) m.inputs_.push_back(info_of(v));
  for (const auto& v : g.output()) m.outputs_.push_back(info_of(v));
  m.shared_ = find_shared(g);
  m.proto_ = std::move(p);
  return m;
}

std::size_t Model::num_nodes() const {
  return static_cast<std::size_t>(proto_->m.graph().node_size());
}

Result<std::vector<Value>> Model::emit(graph::Builder& b, const std::map<std::string, Value>& feeds,
                                       const std::map<std::string, Tensor>& known,
                                       Bindings& bind) const {
  const auto& g = proto_->m.graph();
  Env env{b, bind, feeds, known, {}, {}, {}, {}, {}, {}, {}};
  for (const auto& t : g.initializer())
    if (!feeds.count(t.name()) && !known.count(t.name()))
      env.initializers[t.name()] = env.protos[t.name()] = &t;
  for (const auto& v : inputs_)
    if (!feeds.count(v.name) && !known.count(v.name))
      return invalid_argument("{}: input '{}' was not fed", path_, v.name);
  const int first = b.graph().num_nodes();
  for (int i = 0; i < g.node_size(); ++i) {
    Ctx c(env, g.node(i), i, opset_);
    const auto& table = g.node(i).domain() == kFusedDomain ? fused_converters() : converters();
    Status s = table.at(g.node(i).op_type())(c);
    if (s.ok() && !b.ok()) s = b.status();
    if (!s.ok()) return s.with_context(fmt::format("{}: importing {}", path_, c.label()));
  }
  // A value read through a transpose and its inverse (3-D convolutions in a
  // row) or a reshape and its inverse (a 1-D net's activations between its
  // 4-D ops) is read directly; the values below keep their meaning either way.
  SHOAL_RETURN_IF_ERROR(graph::cancel_shape_pairs(b.graph(), first).status());
  std::vector<Value> outs;
  for (const auto& o : g.output()) {
    auto v = env.values.find(o.name());
    if (v != env.values.end()) {
      outs.push_back(v->second);
    } else if (auto k = env.known.find(o.name()); k != env.known.end()) {
      outs.push_back(b.constant(k->second));
    } else {
      return invalid_argument("{}: graph output '{}' is produced by no node", path_, o.name());
    }
  }
  return outs;
}

// --- Ctx ---

std::string Ctx::label() const {
  return fmt::format("node '{}' ({}, opset {})", n_.name(), n_.op_type(), opset_);
}

int Ctx::num_inputs() const {
  int n = n_.input_size();
  while (n > 0 && n_.input(n - 1).empty()) --n;
  return n;
}

bool Ctx::has_input(int i) const { return i < n_.input_size() && !n_.input(i).empty(); }

const std::string& Ctx::input_name(int i) const {
  const std::string* name = &n_.input(i);
  for (auto a = env_.alias.find(*name); a != env_.alias.end(); a = env_.alias.find(*name))
    name = &a->second;
  return *name;
}

void Ctx::alias_output(int i) { env_.alias[n_.output(i)] = input_name(i); }

bool Ctx::unbound_initializer(int i) const {
  return has_input(i) && env_.initializers.count(input_name(i)) &&
         !env_.values.count(input_name(i));
}

const Tensor* Ctx::known(int i) {
  if (!has_input(i)) return nullptr;
  const std::string& name = input_name(i);
  if (auto k = env_.known.find(name); k != env_.known.end()) return &k->second;
  auto it = env_.initializers.find(name);
  if (it == env_.initializers.end()) return nullptr;
  // Float initializers of rank >= 1 are trained; everything else is fixed.
  // Decided from the proto's header, so a weight is decoded once, by in().
  const ::onnx::TensorProto& p = *it->second;
  auto dt = dtype_of(p.data_type());
  if (dt.ok() && is_floating(*dt) && p.dims_size() > 0) return nullptr;
  auto t = from_proto(p);
  if (!t.ok()) return nullptr;  // in() reports the error
  env_.initializers.erase(it);
  return &(env_.known[name] = *t);
}

// A separate tensor for input i, bound under the name its node reads it
// by (or "<initializer>@<node>"), from the initializer's proto.
Result<Value> Ctx::own_copy(int i, bool buffer, std::string* bound) {
  const std::string& name = input_name(i);
  // A statistic read through an Identity is bound under the Identity's output
  // name; any other copy under "<initializer>@<node>".
  const bool statistic = buffer || env_.buffers.count(name);
  const std::string own = statistic && n_.input(i) != name
                              ? n_.input(i)
                              : fmt::format("{}@{}", name, node_name(n_, index_));
  if (bound) *bound = own;
  if (auto v = env_.values.find(own); v != env_.values.end()) return v->second;
  SHOAL_ASSIGN_OR_RETURN(Tensor t, from_proto(*env_.protos.at(name)));
  // (Parameters read by several nodes are reported once, by describe_shared.)
  if (statistic)
    SHOAL_LOG_INFO(
        "onnx: {}: '{}' feeds a {} here and a {} elsewhere (the exporter merged equal "
        "initializers): bound apart as '{}'",
        label(), name, buffer ? "running statistic" : "parameter",
        buffer ? "parameter or statistic" : "running statistic", own);
  if (buffer) env_.buffers.insert(own);
  return env_.values[own] = buffer ? env_.bind.buffer(own, t) : env_.bind.param(own, t);
}

Result<Value> Ctx::in(int i) {
  if (!has_input(i)) return fail("input {} is required", i);
  const std::string& name = input_name(i);
  if (env_.buffers.count(name) && env_.protos.count(name)) return own_copy(i, false, nullptr);
  if (auto v = env_.values.find(name); v != env_.values.end()) {
    // A weight another node bound: the exporter may have merged two equal ones.
    if (is_view(n_) && env_.views.count(name)) return v->second;
    auto owner = env_.param_node.find(name);
    if (!env_.bind.tie_shared && owner != env_.param_node.end() && owner->second != index_)
      return own_copy(i, false, nullptr);
    return v->second;
  }
  if (const Tensor* k = known(i)) return env_.values[name] = env_.b.constant(*k);
  if (auto m = env_.missing.find(name); m != env_.missing.end())
    return fail("input '{}' is {}, which Shoal does not compute", name, m->second);
  auto it = env_.initializers.find(name);
  if (it == env_.initializers.end()) return fail("input '{}' is produced by no earlier node", name);
  SHOAL_ASSIGN_OR_RETURN(Tensor t, from_proto(*it->second));
  env_.initializers.erase(it);
  env_.param_node[name] = index_;
  if (is_view(n_)) env_.views.insert(name);
  return env_.values[name] = env_.bind.param(name, t);
}

Result<Value> Ctx::in_buffer(int i, std::string* bound) {
  if (!has_input(i)) return fail("input {} is required", i);
  const std::string& name = input_name(i);
  *bound = name;
  auto it = env_.initializers.find(name);
  if (it != env_.initializers.end() && !env_.values.count(name)) {
    SHOAL_ASSIGN_OR_RETURN(Tensor t, from_proto(*it->second));
    env_.initializers.erase(it);
    env_.buffers.insert(name);
    return env_.values[name] = env_.bind.buffer(name, t);
  }
  // Bound already (a parameter, or another batch norm's statistic): a
  // statistic is never tied to another tensor.
  if (env_.protos.count(name) && !known(i)) return own_copy(i, true, bound);
  return in(i);
}

Result<std::vector<std::int64_t>> Ctx::ints(int i) {
  const Tensor* k = known(i);
  if (!k)
    return fail(
        "input {} ('{}') must be known when the model is imported (Shoal's shapes are "
        "static), but it is computed from data",
        i, has_input(i) ? n_.input(i) : "");
  if (is_floating(k->dtype())) return fail("input {} must hold integers", i);
  return k->to_vector<std::int64_t>();
}

Result<graph::TensorType> Ctx::type(int i) {
  if (const Tensor* k = known(i)) return graph::TensorType{k->dtype(), k->shape()};
  SHOAL_ASSIGN_OR_RETURN(Value v, in(i));
  return env_.b.type(v);
}

void Ctx::out(int i, Value v) {
  if (wants_output(i)) env_.values[n_.output(i)] = v;
}

void Ctx::out_missing(int i, std::string what) {
  if (wants_output(i)) env_.missing[n_.output(i)] = std::move(what);
}

void Ctx::out_known(int i, Tensor t) {
  if (wants_output(i)) env_.known[n_.output(i)] = std::move(t);
}

const ::onnx::AttributeProto* Ctx::attr(const std::string& name) const {
  for (const auto& a : n_.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

std::int64_t Ctx::attr_i(const std::string& name, std::int64_t d) const {
  const auto* a = attr(name);
  return a ? a->i() : d;
}

double Ctx::attr_f(const std::string& name, double d) const {
  const auto* a = attr(name);
  return a ? a->f() : d;
}

std::vector<std::int64_t> Ctx::attr_ints(const std::string& name,
                                         std::vector<std::int64_t> d) const {
  const auto* a = attr(name);
  if (!a) return d;
  return {a->ints().begin(), a->ints().end()};
}

std::string Ctx::attr_s(const std::string& name, std::string d) const {
  const auto* a = attr(name);
  return a ? a->s() : d;
}

Result<std::int64_t> norm_axis(const Ctx& c, std::int64_t axis, std::size_t rank) {
  auto r = static_cast<std::int64_t>(rank);
  if (axis < -r || axis >= std::max<std::int64_t>(r, 1))
    return c.fail("axis {} is out of range for rank {}", axis, rank);
  return axis < 0 ? axis + r : axis;
}

}  // namespace shoal::onnx
