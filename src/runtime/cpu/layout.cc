// Blocked activation layouts kept between ops.
//
// oneDNN's convolutions run in a channel-blocked layout (nChw16c: 16
// channels innermost). A convolution that reads and writes plain NCHW pays
// a reorder on each side, and in a ResNet step those reorders were a fifth
// of all oneDNN time. This pass lets a blocked tensor flow on to the ops
// that do not care (elementwise maps over same-shaped tensors) or know the
// layout (convolutions, batch norm, max pooling), and inserts one explicit `layout`
// conversion where a blocked value meets any other op or leaves the graph.
//
// Only f32 4-D tensors whose channel count is a multiple of 16 are blocked
// (and their bf16 copies --precision bf16 makes for convolutions), so
// the blocked buffer has exactly the plain one's size and the memory
// planner needs no change. Kernels learn the layouts from the node
// annotations "_blocked_in" and "_blocked_out" (one 0/1 per input/output).
#include <mutex>
#include <set>

#include "runtime/cpu/kernels_internal.h"
#include "shoal/graph/op_registry.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"

namespace shoal::runtime {
namespace {

using cpu::kBlockChannels;
using graph::Graph;
using graph::Value;

bool blockable(const graph::TensorType& t) {
  return t.dtype == DType::kF32 && t.shape.size() == 4 && t.shape[1] > 0 &&
         t.shape[1] % kBlockChannels == 0 && num_elements(t.shape) > 0;
}
// What the `layout` op converts: f32, or --precision bf16's activations.
bool convertible(graph::TensorType t) {
  if (t.dtype == DType::kBF16) t.dtype = DType::kF32;
  return blockable(t);
}

enum class In { kPlain, kBlocked, kAny };

}  // namespace

void cpu::register_layout_op() {
  static std::once_flag once;
  std::call_once(once, [] {
    graph::OpDef d;
    d.name = "layout";
    d.attrs = {"blocked"};
    d.infer =
        [](const graph::Node& n,
           const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
      if (!convertible(in[0]))
        return invalid_argument(
            "{}: {} has no blocked layout (needs f32 or bf16 [N, C, H, W], C % {} == 0)", n.label(),
            in[0].str(), kBlockChannels);
      return in;
    };
    graph::OpRegistry::global().add(d);
  });
}

Result<int> assign_blocked_layouts(Graph& g) {
  cpu::register_layout_op();
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> order, g.topo_order());
  std::set<Value> blocked;  // values whose buffer holds the blocked layout
  std::map<std::pair<Value, bool>, Value> converted;  // (value, to blocked) -> conversion
  int conversions = 0;
  std::map<Value, std::vector<std::string>> readers;  // value -> ops that read it
  for (const graph::Node& n : g.nodes())
    if (n.alive)
      for (const Value& v : n.inputs) readers[v].push_back(n.op);
  for (const Value& v : g.outputs()) readers[v].push_back("");
  // A bf16 value of a blockable shape read only by convolutions, batch
  // norms and ReLU's gradient: --precision bf16's activations (casts, batch
  // norm's dx, a convolution's result its batch norm reads, a batch norm's
  // ReLU'd result) may stay blocked.
  auto bf16_stays_blocked = [&](Value v) {
    const graph::TensorType& t = g.type(v);
    if (t.dtype != DType::kBF16 || !convertible(t)) return false;
    for (const std::string& op : readers[v])
      if (!op.starts_with("conv2d") && !op.starts_with("batch_norm") && op != "relu_grad")
        return false;
    return true;
  };
  auto convert = [&](Value v, bool to_blocked) -> Result<Value> {
    auto key = std::make_pair(v, to_blocked);
    auto it = converted.find(key);
    if (it != converted.end()) return it->second;
    SHOAL_ASSIGN_OR_RETURN(
        Value c,
        g.add("layout", {v}, {{"blocked", std::int64_t{to_blocked ? 1 : 0}}},
              fmt::format("{}/{}",
                          g.node(v.node).name.empty() ? g.node(v.node).op : g.node(v.node).name,
                          to_blocked ? "to_blocked" : "to_plain")));
    if (to_blocked) blocked.insert(c);
    converted[key] = c;
    ++conversions;
    return c;
  };
  for (int id : order) {
    // Copies: g.add below may reallocate the node table.
    const graph::Node n = g.node(id);
    if (!n.alive || n.op == "input" || n.op == "constant") continue;
    const std::size_t ni = n.inputs.size();
    std::vector<In> want(ni, In::kPlain);
    std::vector<bool> out_blocked(n.outputs.size(), false);
    auto in_blocked = [&](std::size_t i) { return blocked.count(n.inputs[i]) != 0; };
    const bool relu = n.op == "relu" || n.op == "relu_grad";
    // Grouped and depthwise convolutions too: oneDNN's depthwise kernels
    // read nChw16c natively (a depthwise-separable net: 771 -> 1,294 img/s,
    // the conversions around each depthwise conv were 11% of its step).
    if (n.op == "conv2d" || n.op == "conv2d_grad_input") {
      want[0] = In::kAny;  // the kernel reorders a plain input itself
      out_blocked[0] = blockable(n.outputs[0]) || bf16_stays_blocked(Value{id, 0});
    } else if (n.op == "conv2d_grad_weight") {
      want[0] = want[1] = In::kAny;
    } else if (n.op == "batch_norm" && ni >= 3) {
      if (in_blocked(0)) {
        want[0] = In::kBlocked;
        out_blocked[0] = true;
      }
    } else if (n.op == "batch_norm_grad" && ni == 5) {
      if ((in_blocked(0) || in_blocked(4)) &&
          (blockable(n.outputs[0]) || bf16_stays_blocked(Value{id, 0}))) {
        want[0] = want[4] = In::kBlocked;
        out_blocked[0] = true;
      }
    } else if (n.op == "max_pool2d" && in_blocked(0) && blockable(n.outputs[0])) {
      want[0] = In::kBlocked;
      out_blocked[0] = true;
    } else if (n.op == "max_pool2d_grad" && (in_blocked(0) || in_blocked(1)) &&
               blockable(n.outputs[0])) {
      want[0] = want[1] = In::kBlocked;
      out_blocked[0] = true;
    } else if (n.op == "cast" && in_blocked(0) && bf16_stays_blocked(Value{id, 0})) {
      // --precision bf16's cast of a convolution's activation: a flat
      // conversion, so it keeps the layout, and the convolutions read the
      // blocked bf16 (their kernels know it from the annotation).
      want[0] = In::kBlocked;
      out_blocked[0] = true;
    } else if (graph::elementwise(n.op) && n.outputs.size() == 1 &&
               (blockable(n.outputs[0]) || (relu && convertible(n.outputs[0])))) {
      // Full-size operands share the output's layout; size-1 ones broadcast
      // the same value everywhere. Any other broadcast keeps it plain.
      // ReLU's bf16 writer and its gradient's bf16 reader are flat loops:
      // their bf16 operands (of the output's shape) may be blocked too.
      bool shape_ok = true, any_blocked = false;
      for (std::size_t i = 0; i < ni; ++i) {
        const graph::TensorType& t = g.type(n.inputs[i]);
        if (num_elements(t.shape) == 1) continue;
        shape_ok =
            shape_ok && t.shape == n.outputs[0].shape && (t.dtype == n.outputs[0].dtype || relu);
        any_blocked = any_blocked || in_blocked(i);
      }
      if (shape_ok && any_blocked) {
        for (std::size_t i = 0; i < ni; ++i)
          if (num_elements(g.type(n.inputs[i]).shape) != 1) want[i] = In::kBlocked;
        out_blocked[0] = true;
      }
    }
    std::vector<std::int64_t> bin(ni, 0), bout(n.outputs.size(), 0);
    bool annotate = false;
    for (std::size_t i = 0; i < ni; ++i) {
      const bool is_b = in_blocked(i);
      Value v = n.inputs[i];
      if (want[i] == In::kPlain && is_b) {
        SHOAL_ASSIGN_OR_RETURN(v, convert(v, false));
      } else if (want[i] == In::kBlocked && !is_b) {
        SHOAL_ASSIGN_OR_RETURN(v, convert(v, true));
      }
      g.mutable_node(id).inputs[i] = v;
      bin[i] = blocked.count(v) ? 1 : 0;
      annotate = annotate || bin[i] != 0;
    }
    for (std::size_t i = 0; i < n.outputs.size(); ++i) {
      if (!out_blocked[i]) continue;
      blocked.insert(Value{id, static_cast<int>(i)});
      bout[i] = 1;
      annotate = true;
    }
    if (annotate) {
      g.mutable_node(id).attrs.set("_blocked_in", bin);
      g.mutable_node(id).attrs.set("_blocked_out", bout);
    }
  }
  for (Value& v : g.outputs())
    if (blocked.count(v)) {
      SHOAL_ASSIGN_OR_RETURN(v, convert(v, false));
    }
  return conversions;
}

}  // namespace shoal::runtime
