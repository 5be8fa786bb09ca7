// Normalization ops: batch norm and layer norm with their gradients, the
// residual add fused into layer norm, and dropout.
#include "graph/ops_internal.h"

namespace shoal::graph::ops_detail {

namespace {

// Batch norm's and its gradient's inputs: one float type, the one they
// compute in; or, under --precision bf16, x (input 0) in bf16 (a
// convolution wrote it so) beside f32 others: f32.
Result<DType> bn_type(const Types& in) {
  if (in[0].dtype != DType::kBF16) {
    SHOAL_RETURN_IF_ERROR(need_same_float(in));
    return in[0].dtype;
  }
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != DType::kF32)
      return invalid_argument("a bf16 x goes with f32 operands: input {} is {}", i, in[i].str());
  return DType::kF32;
}

}  // namespace

void register_norm_ops(OpRegistry& r) {
  {
    OpDef d;
    d.name = "batch_norm";  // running mean/var (inputs 3, 4) are buffers: no gradient
    d.min_inputs = d.max_inputs = 5;
    // activation "relu": the output is ReLU'd as stored (fuse_activations).
    // dst: bf16, a ReLU's --precision bf16 let write bf16, fused (fuse_activations).
    d.attrs = {"training", "eps", "activation", "dst"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(DType t, bn_type(in));
      if (in[0].shape.size() < 2) return invalid_argument("input must be [N, C, ...]");
      Shape c = {in[0].shape[1]};
      for (int i = 1; i < 5; ++i)
        if (in[i].shape != c) return invalid_argument("input {} must be [{}]", i, c[0]);
      auto act = n.attrs.get_string_or("activation", "");
      if (!act.empty() && act != "relu") return invalid_argument("unknown activation '{}'", act);
      SHOAL_ASSIGN_OR_RETURN(TensorType y, with_dst(n, {t, in[0].shape}));
      return Types{y, {t, c}, {t, c}};
    };
    d.grad = GRAD {
      Attrs a;
      for (const char* k : {"training", "eps"})
        if (g.node.attrs.has(k)) a.set(k, g.node.attrs.all().at(k));
      Value dy = post_act_grad(g.b, g.node, Y(0), DY);
      auto outs = g.b.op_multi("batch_norm_grad", {X(0), X(1), Y(1), Y(2), dy}, a);
      if (outs.size() != 3) return {Value{}, Value{}, Value{}, Value{}, Value{}};
      return {outs[0], outs[1], outs[2], Value{}, Value{}};
    };
    r.add(d);
    OpDef gd;
    gd.name = "batch_norm_grad";  // (x, gamma, mean, var, dy) -> dx, dgamma, dbeta
    gd.min_inputs = gd.max_inputs = 5;
    gd.attrs = {"training", "eps", "dst"};  // dst: dx's (--precision bf16, with_dst)
    gd.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(DType t, bn_type(in));
      if (in[4].shape != in[0].shape) return invalid_argument("dy must match x");
      SHOAL_ASSIGN_OR_RETURN(TensorType dx, with_dst(n, {t, in[0].shape}));
      return Types{dx, in[1], in[1]};
    };
    r.add(gd);
  }
  {
    OpDef d;
    d.name = "layer_norm";
    d.min_inputs = d.max_inputs = 3;
    d.attrs = {"eps", "dst"};  // dst: --precision bf16 (with_dst)
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_same_float(in));
      if (in[0].shape.empty()) return invalid_argument("input must have rank >= 1");
      Shape c = {in[0].shape.back()};
      if (in[1].shape != c || in[2].shape != c)
        return invalid_argument("gamma and beta must be [{}]", c[0]);
      SHOAL_ASSIGN_OR_RETURN(TensorType y, with_dst(n, in[0]));
      return Types{y};
    };
    d.grad = GRAD {
      const Attrs a = {{"eps", g.node.attrs.get_float_or("eps", 1e-5)}};
      auto outs = g.b.op_multi("layer_norm_grad", {X(0), X(1), DY}, a);
      if (outs.size() != 3) return {Value{}, Value{}, Value{}};
      return outs;
    };
    r.add(d);
    OpDef gd;
    // (x, gamma, dy[, r]) -> dx (+ r), dgamma, dbeta: r, where given, is the
    // residual stream's gradient from x's other readers, added as dx is
    // stored (runtime::fuse_residual_norms).
    gd.name = "layer_norm_grad";
    gd.min_inputs = 3;
    gd.max_inputs = 4;
    gd.attrs = {"eps"};
    gd.infer = [](const Node&, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_same_float(in));
      if (in[2].shape != in[0].shape || (in.size() == 4 && in[3].shape != in[0].shape))
        return invalid_argument("dy and r must match x");
      return Types{in[0], in[1], in[1]};
    };
    r.add(gd);
  }
  {
    // (a, b, gamma, beta) -> (layer_norm(a + b), a + b): a pre-norm
    // transformer's residual add and the layer norm that reads it in one
    // pass over the rows (runtime::fuse_residual_norms writes it).
    OpDef d;
    d.name = "add_layer_norm";
    d.min_inputs = d.max_inputs = 4;
    d.attrs = {"eps", "dst"};  // dst: the normalized output's (with_dst)
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_same_float(in));
      if (in[0].shape.empty() || in[1].shape != in[0].shape)
        return invalid_argument("a and b must have one shape of rank >= 1");
      Shape c = {in[0].shape.back()};
      if (in[2].shape != c || in[3].shape != c)
        return invalid_argument("gamma and beta must be [{}]", c[0]);
      SHOAL_ASSIGN_OR_RETURN(TensorType y, with_dst(n, in[0]));
      return Types{y, in[0]};
    };
    // The sum's gradient is its readers' (Y(1), where any) plus layer
    // norm's; a and b each receive it.
    d.grad = GRAD {
      const Attrs a = {{"eps", g.node.attrs.get_float_or("eps", 1e-5)}};
      std::vector<Value> in = {Y(1), X(2), DY};
      if (g.output_grads.size() > 1 && g.output_grads[1].valid()) in.push_back(g.output_grads[1]);
      auto outs = g.b.op_multi("layer_norm_grad", in, a);
      if (outs.size() != 3) return {Value{}, Value{}, Value{}, Value{}};
      return {outs[0], outs[0], outs[1], outs[2]};
    };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "dropout";
    d.attrs = {"p", "seed", "stream"};
    d.random = true;
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
      double p = n.attrs.get_float_or("p", 0.5);
      if (!(p >= 0.0 && p < 1.0)) return invalid_argument("p must be in [0, 1), got {}", p);
      return Types{in[0]};
    };
    // Same (seed, stream, step) gives the same mask, so the gradient is the
    // same dropout applied to dy.
    d.grad = GRAD { return {g.b.op("dropout", {DY}, g.node.attrs)}; };
    r.add(d);
  }
}

}  // namespace shoal::graph::ops_detail
