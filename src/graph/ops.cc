// The op registry: the registration of every built-in op, one family per
// file (ops_elementwise.cc, ops_nn.cc, ops_shape.cc; helpers in
// ops_internal.h), and lookups.
#include <mutex>

#include "graph/ops_internal.h"

namespace shoal::graph {
namespace {

using namespace ops_detail;  // NOLINT(google-build-using-namespace): this file's registrations

void register_all(OpRegistry& r) {
  OpDef in;
  in.name = "input";
  in.min_inputs = in.max_inputs = 0;
  in.infer = [](const Node& n, const Types&) -> InferResult { return n.outputs; };
  r.add(in);
  in.name = "constant";
  r.add(in);

  register_unary_ops(r);
  register_binary_ops(r);
  register_linear_ops(r);
  register_conv_ops(r);
  register_norm_ops(r);
  register_loss_ops(r);
  register_reduce_ops(r);
  register_layout_ops(r);
  register_embedding_ops(r);
}

}  // namespace

OpRegistry& OpRegistry::global() {
  static OpRegistry* reg = [] {
    auto* r = new OpRegistry();  // NOLINT(cppcoreguidelines-owning-memory): lives for the process
    register_all(*r);
    return r;
  }();
  return *reg;
}

void OpRegistry::add(OpDef def) {
  std::string n = def.name;
  // A second op of one name would silently replace the first: the
  // gradient rules that build the first would build the second.
  SHOAL_CHECK(!ops_.count(n), "graph op '{}' is registered twice", n);
  ops_[n] = std::move(def);
}

const OpDef* OpRegistry::find(const std::string& name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<std::string> OpRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : ops_) out.push_back(k);
  return out;
}

}  // namespace shoal::graph
