// Counting a graph's products, and mixed precision as a pass over them
// (graph/passes.h): the step graph's matmuls read bf16 and accumulate f32.
#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "shoal/graph/passes.h"

namespace shoal::graph {
namespace {

bool is_product(const std::string& op) { return op == "matmul" || op == "linear"; }

// Whether oneDNN's bf16 matmul runs this node: one batch shape on both
// sides (no broadcasting) and no empty operand.
bool bf16_runs(const Graph& g, const Node& n) {
  const Shape& a = g.type(n.inputs[0]).shape;
  const Shape& b = g.type(n.inputs[1]).shape;
  if (num_elements(a) == 0 || num_elements(b) == 0 || num_elements(n.outputs[0].shape) == 0)
    return false;
  if (n.op == "linear") return true;
  return a.size() == b.size() && std::equal(a.begin(), a.end() - 2, b.begin());
}

// A convolution pass's x-, weight- and y-shaped operands, whichever of them
// it reads and which it writes: conv2d (x, w) -> y, conv2d_grad_input
// (dy, w) -> dx, conv2d_grad_weight (x, dy) -> dw.
struct ConvShapes {
  Shape x, w, y;
};
ConvShapes conv_shapes(const Graph& g, const Node& n) {
  const Shape& out = n.outputs[0].shape;
  if (n.op == "conv2d") return {g.type(n.inputs[0]).shape, g.type(n.inputs[1]).shape, out};
  if (n.op == "conv2d_grad_input")
    return {out, g.type(n.inputs[1]).shape, g.type(n.inputs[0]).shape};
  return {g.type(n.inputs[0]).shape, out, g.type(n.inputs[1]).shape};
}

}  // namespace

double node_flops(const Graph& g, const Node& n) {
  if (n.outputs.empty()) return 0;
  const auto out = static_cast<double>(num_elements(n.outputs[0].shape));
  if (n.op == "matmul" || n.op == "linear") {
    const Shape& a = g.type(n.inputs[0]).shape;
    const bool ta = n.attrs.get_int_or("transpose_a", 0) != 0;
    const std::int64_t k = a.size() < 2 ? 1 : ta ? a[a.size() - 2] : a.back();
    return 2.0 * out * static_cast<double>(k);
  }
  // Each convolution pass multiplies every output-gradient element of the
  // forward by Cin/groups·kH·kW weights: the same count three ways.
  if (n.op != "conv2d" && n.op != "conv2d_grad_input" && n.op != "conv2d_grad_weight") return 0;
  const ConvShapes s = conv_shapes(g, n);
  if (s.w.size() != 4 || s.w[0] <= 0) return 0;
  return 2.0 * static_cast<double>(num_elements(s.y)) *
         static_cast<double>(num_elements(s.w) / s.w[0]);
}

double graph_flops(const Graph& g) {
  double f = 0;
  for (const Node& n : g.nodes())
    if (n.alive) f += node_flops(g, n);
  return f;
}

namespace {

// Softmax and its gradient run in bf16 along the last axis only.
bool on_last_axis(const Graph& g, const Node& n) {
  const auto rank = static_cast<std::int64_t>(g.type(n.inputs[0]).shape.size());
  const std::int64_t axis = n.attrs.get_int_or("axis", -1);
  return axis == -1 || axis == rank - 1;
}

// Ops with a kernel that computes in f32 and stores bf16 (runtime/cpu's
// bf16 writers): GELU and its gradient, layer norm, softmax and its
// gradient along the last axis (attention's probabilities and scores),
// batch norm's input gradient (its dx, output 0, which the convolutions
// before it read in bf16), and ReLU (a batch norm's or a product's, fused
// into it by the backend: the ReLU'd result written in bf16).
bool writes_bf16(const Graph& g, const Node& n) {
  if (n.op == "gelu" || n.op == "gelu_grad" || n.op == "layer_norm" || n.op == "batch_norm_grad" ||
      n.op == "relu")
    return true;
  return (n.op == "softmax" || n.op == "softmax_grad") && on_last_axis(g, n);
}

// Ops with a kernel that reads bf16 inputs into f32 and computes there
// (runtime/cpu's bf16 readers), as autocast's GELU and softmax read the
// bf16 a product wrote: GELU and its gradient (x, dy), softmax and its
// gradient along the last axis (scores; probabilities and their gradient),
// and ReLU's gradient (dy, and y, whose sign bf16 keeps).
bool reads_bf16(const Graph& g, const Node& n) {
  if (n.op == "gelu" || n.op == "gelu_grad" || n.op == "relu_grad") return true;
  return (n.op == "softmax" || n.op == "softmax_grad") && on_last_axis(g, n);
}

// The nodes that read v, one entry per use, or nullopt where a use is not
// a node's (v is an output of the graph).
std::optional<std::vector<int>> readers(const Graph& g, Value v, const std::map<Value, int>& uses) {
  std::vector<int> ids;
  for (const Node& n : g.nodes()) {
    if (!n.alive) continue;
    for (const Value& in : n.inputs)
      if (in == v) ids.push_back(n.id);
  }
  auto it = uses.find(v);
  if (it == uses.end() || it->second != static_cast<int>(ids.size())) return std::nullopt;
  return ids;
}

// The readers of v other than cast `c` when each is a plain sum
// (reduce_sum of v alone, no dst), as ids; nullopt where another reads v.
std::optional<std::vector<int>> sums_beside(const Graph& g, Value v, int c,
                                            const std::map<Value, int>& uses) {
  const auto ids = readers(g, v, uses);
  if (!ids) return std::nullopt;
  std::vector<int> sums;
  for (int id : *ids) {
    const Node& n = g.node(id);
    if (id == c) continue;
    if (n.op != "reduce_sum" || n.attrs.has("dst") || n.inputs.size() != 1) return std::nullopt;
    sums.push_back(id);
  }
  return sums;
}

// A bf16 writer read by cast `c` and otherwise only by sums (the MLP's
// GELU gradient: the bias gradient sums it, the two products read its
// cast) or bf16 readers (attention's probabilities: the product reads
// them through the cast, their gradient reads them too): it writes bf16,
// the sums read that and add in f32 (dst f32), as autocast's bias
// gradient reads the bf16 gradient; the readers read it into f32. False
// where anything else reads it.
Result<bool> narrow_with_readers(Graph& g, int c, const std::map<Value, int>& uses) {
  const Value v = g.node(c).inputs[0];
  const Node& p = g.node(v.node);
  if (!writes_bf16(g, p) || p.attrs.has("dst") || v.index != 0 || g.type(v).dtype != DType::kF32)
    return false;
  const auto ids = readers(g, v, uses);
  if (!ids || ids->size() < 2) return false;
  std::vector<int> sums, others;
  for (int id : *ids) {
    const Node& n = g.node(id);
    if (id == c) continue;
    if (n.op == "reduce_sum" && !n.attrs.has("dst") && n.inputs.size() == 1)
      sums.push_back(id);
    else if (reads_bf16(g, n))
      others.push_back(id);
    else
      return false;
  }
  g.mutable_node(p.id).attrs.set("dst", std::string("bf16"));
  SHOAL_RETURN_IF_ERROR(g.reinfer(p.id));
  for (int s : sums) {
    g.mutable_node(s).attrs.set("dst", std::string("f32"));
    SHOAL_RETURN_IF_ERROR(g.reinfer(s));
  }
  for (int r : others) SHOAL_RETURN_IF_ERROR(g.reinfer(r));
  g.replace_all_uses(Value{c, 0}, v);
  g.mutable_node(c).alive = false;
  return true;
}

// Every node `wants` picks whose output 0 each of its readers `takes`
// (v, the reader) writes bf16 (dst bf16); the readers are re-typed.
// Returns how many.
template <typename Wants, typename Takes>
Result<int> narrow_where(Graph& g, Wants wants, Takes takes) {
  int narrowed = 0;
  const std::map<Value, int> uses = g.use_counts();
  for (int id = 0; id < g.num_nodes(); ++id) {
    const Node& p = g.node(id);
    if (!p.alive || !wants(p)) continue;
    const Value v{id, 0};
    const auto ids = readers(g, v, uses);
    if (!ids || ids->empty()) continue;
    if (!std::ranges::all_of(*ids, [&](int r) { return takes(v, g.node(r)); })) continue;
    g.mutable_node(id).attrs.set("dst", std::string("bf16"));
    SHOAL_RETURN_IF_ERROR(g.reinfer(id));
    for (int r : *ids) SHOAL_RETURN_IF_ERROR(g.reinfer(r));
    ++narrowed;
  }
  return narrowed;
}

// A product (dst f32) whose every reader is a bf16 reader writes bf16
// (dst bf16), as autocast's products do: the MLP's first linear (GELU and
// its gradient read it), the gradient product GELU's gradient reads, the
// attention scores (softmax reads them) and their gradient's product.
Result<int> narrow_for_readers(Graph& g) {
  return narrow_where(
      g,
      [](const Node& p) { return is_product(p.op) && p.attrs.get_string_or("dst", "") == "f32"; },
      [&](Value, const Node& r) { return reads_bf16(g, r); });
}

// A product or a bf16 writer whose output reaches one of the casts only
// through shape ops (reshape, transpose, flatten), each value read once,
// writes bf16 itself (dst bf16): the cast goes, and the shape ops move
// half the bytes. (The MLP's GELU output is read only by its cast: the
// gradient reads the GELU's input; so is a layer norm's, whose gradient
// reads x; and the attention scores' gradient, read only by the two
// products' casts.) Sums may read the cast's input too (sums_beside). A bf16
// writer also read by bf16 readers: narrow_with_readers.
Result<int> narrow_producers(Graph& g, const std::vector<int>& casts) {
  int narrowed = 0;
  for (int c : casts) {
    const std::map<Value, int> uses = g.use_counts();
    SHOAL_ASSIGN_OR_RETURN(const bool shared, narrow_with_readers(g, c, uses));
    if (shared) {
      ++narrowed;
      continue;
    }
    auto once = [&](Value v) {
      auto it = uses.find(v);
      return it != uses.end() && it->second == 1;
    };
    const Value v = g.node(c).inputs[0];
    // Beside the cast, sums may read v (the bias gradients of attention's
    // q, k and v projections sum the gradient its product wrote): they read
    // the bf16 and add in f32, as in narrow_with_readers.
    const auto sums = sums_beside(g, v, c, uses);
    if (!sums) continue;
    std::vector<int> chain;  // shape nodes, the cast's side first
    Value u = v;
    while (u == v || once(u)) {
      const Node& p = g.node(u.node);
      if (p.op == "reshape" || p.op == "transpose" || p.op == "flatten") {
        chain.push_back(p.id);
        u = p.inputs[0];
        continue;
      }
      const bool product = is_product(p.op) && p.attrs.get_string_or("dst", "") == "f32";
      const bool writer = writes_bf16(g, p) && !p.attrs.has("dst") && u.index == 0 &&
                          g.type(u).dtype == DType::kF32;
      if (product || writer) {
        g.mutable_node(p.id).attrs.set("dst", std::string("bf16"));
        SHOAL_RETURN_IF_ERROR(g.reinfer(p.id));
        for (auto it = chain.rbegin(); it != chain.rend(); ++it)
          SHOAL_RETURN_IF_ERROR(g.reinfer(*it));
        for (int sum : *sums) {
          g.mutable_node(sum).attrs.set("dst", std::string("f32"));
          SHOAL_RETURN_IF_ERROR(g.reinfer(sum));
        }
        g.replace_all_uses(Value{c, 0}, v);
        g.mutable_node(c).alive = false;
        ++narrowed;
      }
      break;
    }
  }
  return narrowed;
}

// A bf16 convolution (precision bf16, f32 result) whose result only
// batch norms read, as their x (the forward's and the gradient's), writes
// it in bf16 (dst bf16), as autocast's convolutions do; the norms read it
// into f32 and keep their statistics there.
Result<int> narrow_for_norms(Graph& g) {
  return narrow_where(
      g,
      [](const Node& p) {
        return p.op == "conv2d" && p.attrs.get_string_or("precision", "") == "bf16" &&
               !p.attrs.has("dst") && p.outputs[0].dtype == DType::kF32;
      },
      [](Value v, const Node& n) {
        if (n.op != "batch_norm" && n.op != "batch_norm_grad") return false;
        return std::find(n.inputs.begin() + 1, n.inputs.end(), v) == n.inputs.end();
      });
}

// Convolution passes that stay f32 under bf16, where oneDNN's bf16 kernels
// were slower than f32 ones (measured one thread, 64 images):
// - depthwise (one input channel a group): few FLOPs a byte to gain, and
//   the bf16 weight gradient on small maps ran 13 ms where Shoal's f32 loops
//   take 0.7 (mobilenet_v2 at 32x32: a bf16 step of 134 ms against 41);
// - fewer than 16 output channels: the bf16 kernels block 16 and pad the
//   rest (the 3-D pooling net's 3-to-8 layer: weight gradient 1.08 ms
//   against 0.33). Few input channels alone cost nothing (ResNet-20's first
//   layer, 1 to 16, is as fast in bf16);
// - 1x1 maps in and out: f32 runs them as one matmul of the tap that reads
//   the input (conv_point.cc); bf16 took 2-4x as long (mnasnet's 96-to-576
//   weight gradient 0.60 ms against 0.16).
// - a weight gradient of at most 4x4 output pixels an image: oneDNN's bf16
//   backward-weights kernel there does not use a second thread (resnet18's
//   256-channel 3x3 over 2x2 maps: 2.2 ms at one thread, 3.0 at two; f32
//   2.4 and 1.2), and at one thread is no faster than f32.
bool conv_stays_f32(const Graph& g, const Node& n) {
  const auto [x, w, y] = conv_shapes(g, n);
  if (x.size() != 4 || w.size() != 4 || y.size() != 4) return false;
  const bool depthwise = n.attrs.get_int_or("groups", 1) > 1 && w[1] == 1;
  const bool one_by_one = x[2] == 1 && x[3] == 1 && y[2] == 1 && y[3] == 1;
  const bool small_weight_gradient = n.op == "conv2d_grad_weight" && y[2] * y[3] <= 16;
  return depthwise || w[0] < 16 || one_by_one || small_weight_gradient;
}

}  // namespace

Result<PrecisionReport> autocast_bf16(Graph& g) {
  PrecisionReport r;
  std::map<Value, Value> bf16_of;  // one cast per value, shared by its users
  std::vector<int> casts;
  // v's bf16 cast, made for the first user (scheduled in the earliest
  // user's slot) and shared by the others.
  auto bf16_operand = [&](Value v, std::int64_t slot, const std::string& name) -> Result<Value> {
    auto it = bf16_of.find(v);
    if (it == bf16_of.end()) {
      const std::string cname = (name.empty() ? "" : name + "/") + "bf16";
      SHOAL_ASSIGN_OR_RETURN(Value c, g.add("cast", {v}, {{"dtype", std::string("bf16")}}, cname));
      g.mutable_node(c.node).slot = slot;
      it = bf16_of.emplace(v, c).first;
      casts.push_back(c.node);
      ++r.casts;
    } else if (slot < g.node(it->second.node).slot) {
      g.mutable_node(it->second.node).slot = slot;  // ready for its earliest user
    }
    return it->second;
  };
  const int count = g.num_nodes();  // the casts appended below are not visited
  for (int id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    if (n.alive && n.op.starts_with("conv2d") && !n.attrs.has("precision") &&
        g.type(n.inputs[0]).dtype == DType::kF32 && !conv_stays_f32(g, n)) {
      // The activations (the forward's x, the gradients' dy and x) are
      // cast once and the cast shared: the forward and the weight gradient
      // read one bf16 x, both gradients one bf16 dy. Weights stay f32 (the
      // kernel converts them while reordering them into its layout).
      const std::int64_t slot = n.slot;
      const std::string name = n.name;
      std::vector<Value> acts = {n.inputs[0]};
      if (n.op == "conv2d_grad_weight") acts.push_back(n.inputs[1]);
      g.mutable_node(id).attrs.set("precision", std::string("bf16"));
      for (std::size_t i = 0; i < acts.size(); ++i) {
        SHOAL_ASSIGN_OR_RETURN(Value c, bf16_operand(acts[i], slot, name));
        g.mutable_node(id).inputs[i] = c;
      }
      SHOAL_RETURN_IF_ERROR(g.reinfer(id));
      ++r.convolutions;
      continue;
    }
    if (!n.alive || !is_product(n.op) || n.attrs.has("dst")) continue;
    if (g.type(n.inputs[0]).dtype != DType::kF32 || g.type(n.inputs[1]).dtype != DType::kF32)
      continue;
    if (!bf16_runs(g, n)) {
      ++r.kept;
      continue;
    }
    const std::int64_t slot = n.slot;
    const std::string name = n.name;
    Value operands[2] = {n.inputs[0], n.inputs[1]};
    for (Value& v : operands) {
      SHOAL_ASSIGN_OR_RETURN(v, bf16_operand(v, slot, name));
    }
    Node& m = g.mutable_node(id);
    m.inputs[0] = operands[0];
    m.inputs[1] = operands[1];
    m.attrs.set("dst", std::string("f32"));
    SHOAL_RETURN_IF_ERROR(g.reinfer(id));
    ++r.products;
  }
  SHOAL_ASSIGN_OR_RETURN(r.read_bf16, narrow_for_readers(g));
  SHOAL_ASSIGN_OR_RETURN(r.norms_read_bf16, narrow_for_norms(g));
  SHOAL_ASSIGN_OR_RETURN(r.narrowed, narrow_producers(g, casts));
  r.casts -= r.narrowed;
  return r;
}

}  // namespace shoal::graph
