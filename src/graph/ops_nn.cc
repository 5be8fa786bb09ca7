// Network ops: matmul and linear, convolution and pooling, softmax and the
// losses (normalization and dropout: ops_norm.cc).
#include <cmath>

#include "graph/ops_internal.h"

namespace shoal::graph::ops_detail {

namespace {

// A softmax's `scale` (x is multiplied by it first) must be finite and
// positive; `causal` (position i of the last axis sees positions
// <= i + cols - rows only) needs the last axis of a matrix.
Status check_softmax_attrs(const Node& n, const Shape& s) {
  const double scale = n.attrs.get_float_or("scale", 1.0);
  if (!(scale > 0) || !std::isfinite(scale))
    return invalid_argument("scale must be finite and > 0, got {}", scale);
  if (n.attrs.get_int_or("causal", 0) == 0) return ok_status();
  const auto rank = static_cast<std::int64_t>(s.size());
  if (rank < 2 || *norm_axis(n.attrs.get_int_or("axis", -1), s.size()) != rank - 1)
    return invalid_argument("causal needs the last axis of a rank >= 2 tensor; got axis {} of {}",
                            n.attrs.get_int_or("axis", -1), shape_str(s));
  return ok_status();
}

// A softmax or its gradient that reads or writes bf16 runs along the last
// axis (the kernels' rows; attention's scores).
Status bf16_on_last_axis(const Node& n, const Types& in) {
  bool bf16 = n.attrs.has("dst");
  for (const TensorType& t : in) bf16 = bf16 || t.dtype == DType::kBF16;
  const auto rank = static_cast<std::int64_t>(in[0].shape.size());
  SHOAL_ASSIGN_OR_RETURN(const std::int64_t axis,
                         norm_axis(n.attrs.get_int_or("axis", -1), in[0].shape.size()));
  if (bf16 && axis != rank - 1)
    return invalid_argument("a {} in bf16 runs along the last axis, not axis {} of {}", n.op, axis,
                            shape_str(in[0].shape));
  return ok_status();
}

Result<Shape> conv_out_shape(const Node& n, const Shape& x, const Shape& w) {
  if (x.size() != 4) return invalid_argument("input must be NCHW (rank 4)");
  if (w.size() != 4) return invalid_argument("weight must be [O, I/groups, kH, kW] (rank 4)");
  auto st = n.attrs.get_ints_or("stride", {1, 1});
  auto pd = n.attrs.get_ints_or("padding", {0, 0});
  auto dl = n.attrs.get_ints_or("dilation", {1, 1});
  std::int64_t groups = n.attrs.get_int_or("groups", 1);
  if (st.size() != 2 || pd.size() != 2 || dl.size() != 2)
    return invalid_argument("stride, padding and dilation must have 2 entries");
  for (int i = 0; i < 2; ++i)
    if (st[i] < 1 || pd[i] < 0 || dl[i] < 1)
      return invalid_argument("stride and dilation must be >= 1 and padding >= 0");
  if (groups < 1 || x[1] % groups != 0 || w[0] % groups != 0)
    return invalid_argument("groups {} must divide input channels {} and output channels {}",
                            groups, x[1], w[0]);
  if (w[1] * groups != x[1])
    return invalid_argument("weight expects {} input channels per group, input has {} in {} groups",
                            w[1], x[1], groups);
  Shape out = {x[0], w[0], 0, 0};
  for (int i = 0; i < 2; ++i) {
    std::int64_t eff = dl[i] * (w[2 + i] - 1) + 1;
    std::int64_t span = x[2 + i] + 2 * pd[i] - eff;
    if (span < 0)
      return invalid_argument("kernel extent {} exceeds padded input {}", eff,
                              x[2 + i] + 2 * pd[i]);
    out[2 + i] = span / st[i] + 1;
  }
  return out;
}

Result<Shape> pool_out_shape(const Node& n, const Shape& x) {
  if (x.size() != 4) return invalid_argument("input must be NCHW (rank 4)");
  auto k = n.attrs.get_ints_or("kernel", {});
  auto st = n.attrs.get_ints_or("stride", k);
  auto pd = n.attrs.get_ints_or("padding", {0, 0});
  if (k.size() != 2 || st.size() != 2 || pd.size() != 2)
    return invalid_argument("kernel, stride and padding must have 2 entries");
  Shape out = {x[0], x[1], 0, 0};
  for (int i = 0; i < 2; ++i) {
    if (k[i] < 1 || st[i] < 1 || pd[i] < 0 || pd[i] * 2 > k[i])
      return invalid_argument("need kernel >= 1, stride >= 1, 0 <= padding <= kernel/2");
    std::int64_t span = x[2 + i] + 2 * pd[i] - k[i];
    if (span < 0)
      return invalid_argument("kernel {} exceeds padded input {}", k[i], x[2 + i] + 2 * pd[i]);
    out[2 + i] = span / st[i] + 1;
  }
  return out;
}

Result<Shape> matmul_shape(const Node& n, const TensorType& a, const TensorType& b) {
  if (a.shape.size() < 2 || b.shape.size() < 2)
    return invalid_argument("matmul needs rank >= 2 inputs");
  bool ta = n.attrs.get_int_or("transpose_a", 0) != 0,
       tb = n.attrs.get_int_or("transpose_b", 0) != 0;
  std::size_t ra = a.shape.size(), rb = b.shape.size();
  std::int64_t m = ta ? a.shape[ra - 1] : a.shape[ra - 2];
  std::int64_t ka = ta ? a.shape[ra - 2] : a.shape[ra - 1];
  std::int64_t kb = tb ? b.shape[rb - 1] : b.shape[rb - 2];
  std::int64_t nn = tb ? b.shape[rb - 2] : b.shape[rb - 1];
  if (ka != kb) return invalid_argument("inner dimensions differ: {} vs {}", ka, kb);
  Shape ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  SHOAL_ASSIGN_OR_RETURN(Shape batch, broadcast_shapes(ba, bb));
  batch.push_back(m);
  batch.push_back(nn);
  return batch;
}

// The element type a product (matmul, linear, the convolutions and their
// gradients) writes. Its two operands are f32 or f64, or both bf16 as
// --precision bf16 leaves them (graph/precision.cc); the "dst" attribute
// names the output type (bf16 operands accumulate into f32). A bias is of
// the output's type.
Result<DType> product_type(const Node& n, const Types& in) {
  const DType t = in[0].dtype;
  if (t == DType::kBF16) {
    if (in[1].dtype != t)
      return invalid_argument("dtype mismatch: input 0 is {}, input 1 is {}", in[0].str(),
                              in[1].str());
  } else {
    SHOAL_RETURN_IF_ERROR(need_same_float({in[0], in[1]}));
  }
  DType out = t;
  if (n.attrs.has("dst")) {
    SHOAL_ASSIGN_OR_RETURN(std::string name, n.attrs.get_string("dst"));
    SHOAL_ASSIGN_OR_RETURN(out, parse_dtype(name));
    if (out != DType::kF32 && out != t)
      return invalid_argument("dst {} for operands of {}: only f32 or the operands' type", name,
                              dtype_name(t));
  }
  // A bf16 output keeps an f32 bias (oneDNN adds it in f32 before rounding).
  if (in.size() == 3 && in[2].dtype != out && !(out == DType::kBF16 && in[2].dtype == DType::kF32))
    return invalid_argument("bias is {}, the output {}", in[2].str(), dtype_name(out));
  return out;
}

// A convolution pass's result type: its operands' float type, or under
// --precision bf16 (the "precision" attribute autocast_bf16 sets) f32, its
// operands each f32 or bf16 (the pass casts the activations once and
// shares the cast between the passes that read them).
Result<DType> conv_type(const Node& n, const Types& in) {
  if (n.attrs.get_string_or("precision", "") != "bf16") {
    SHOAL_RETURN_IF_ERROR(need_same_float(in));
    return in[0].dtype;
  }
  for (std::size_t i = 0; i < in.size(); ++i)
    if (in[i].dtype != DType::kF32 && in[i].dtype != DType::kBF16)
      return invalid_argument("a bf16 convolution reads f32 or bf16: input {} is {}", i,
                              in[i].str());
  return DType::kF32;
}

}  // namespace

void register_linear_ops(OpRegistry& r) {
  {
    OpDef d;
    d.name = "matmul";
    d.min_inputs = d.max_inputs = 2;
    d.attrs = {"transpose_a", "transpose_b", "dst"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(DType t, product_type(n, in));
      SHOAL_ASSIGN_OR_RETURN(Shape s, matmul_shape(n, in[0], in[1]));
      return Types{{t, s}};
    };
    d.grad = GRAD {
      bool ta = g.node.attrs.get_int_or("transpose_a", 0) != 0;
      bool tb = g.node.attrs.get_int_or("transpose_b", 0) != 0;
      Value a = X(0), b = X(1), dy = DY, da, db;
      if (!ta && !tb) {
        da = g.b.matmul(dy, b, false, true);
        db = g.b.matmul(a, dy, true, false);
      }
      if (ta && !tb) {
        da = g.b.matmul(b, dy, false, true);
        db = g.b.matmul(a, dy);
      }
      if (!ta && tb) {
        da = g.b.matmul(dy, b);
        db = g.b.matmul(dy, a, true, false);
      }
      if (ta && tb) {
        da = g.b.matmul(b, dy, true, true);
        db = g.b.matmul(dy, a, true, true);
      }
      return {reduce_to(g.b, da, SHAPE_OF(0)), reduce_to(g.b, db, SHAPE_OF(1))};
    };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "linear";
    d.min_inputs = 2;
    d.max_inputs = 3;
    d.attrs = {"activation", "dst"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(DType t, product_type(n, in));
      if (in[0].shape.size() != 2) return invalid_argument("linear input must be [N, in]");
      if (in[1].shape.size() != 2 || in[1].shape[1] != in[0].shape[1])
        return invalid_argument("weight must be [out, {}]", in[0].shape[1]);
      if (in.size() == 3 && in[2].shape != Shape{in[1].shape[0]})
        return invalid_argument("bias must be [{}]", in[1].shape[0]);
      auto act = n.attrs.get_string_or("activation", "");
      if (!act.empty() && act != "relu") return invalid_argument("unknown activation '{}'", act);
      return Types{{t, {in[0].shape[0], in[1].shape[0]}}};
    };
    d.grad = GRAD {
      Value dy = post_act_grad(g.b, g.node, Y(0), DY);
      std::vector<Value> out = {g.b.matmul(dy, X(1)), g.b.matmul(dy, X(0), true, false)};
      if (g.node.inputs.size() == 3) out.push_back(g.b.reduce_sum(dy, {0}));
      return out;
    };
    r.add(d);
  }
}

void register_conv_ops(OpRegistry& r) {
  {
    OpDef d;
    d.name = "conv2d";
    d.min_inputs = 2;
    d.max_inputs = 3;
    // dst: bf16, where --precision bf16 lets the convolution write the
    // batch norm after it its input in bf16 (graph/precision.cc).
    d.attrs = {"stride", "padding", "dilation", "groups", "activation", "precision", "dst"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(DType t, conv_type(n, in));
      SHOAL_ASSIGN_OR_RETURN(Shape s, conv_out_shape(n, in[0].shape, in[1].shape));
      if (in.size() == 3 && in[2].shape != Shape{in[1].shape[0]})
        return invalid_argument("bias must be [{}]", in[1].shape[0]);
      auto act = n.attrs.get_string_or("activation", "");
      if (!act.empty() && act != "relu") return invalid_argument("unknown activation '{}'", act);
      if (n.attrs.has("dst") && n.attrs.get_string_or("precision", "") != "bf16")
        return invalid_argument("dst only for a convolution --precision bf16 runs in bf16");
      SHOAL_ASSIGN_OR_RETURN(TensorType y, with_dst(n, {t, s}));
      return Types{y};
    };
    d.grad = GRAD {
      Value dy = post_act_grad(g.b, g.node, Y(0), DY);
      Attrs a;
      for (const char* k : {"stride", "padding", "dilation", "groups"})
        if (g.node.attrs.has(k)) a.set(k, g.node.attrs.all().at(k));
      Attrs ai = a, aw = a;
      ai.set("input_shape", SHAPE_OF(0));
      aw.set("weight_shape", SHAPE_OF(1));
      std::vector<Value> out = {g.b.op("conv2d_grad_input", {dy, X(1)}, ai),
                                g.b.op("conv2d_grad_weight", {X(0), dy}, aw)};
      if (g.node.inputs.size() == 3) out.push_back(g.b.reduce_sum(dy, {0, 2, 3}));
      return out;
    };
    r.add(d);
    OpDef gi;
    gi.name = "conv2d_grad_input";
    gi.min_inputs = gi.max_inputs = 2;
    gi.attrs = {"stride", "padding", "dilation", "groups", "input_shape", "precision"};
    gi.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(DType t, conv_type(n, in));
      SHOAL_ASSIGN_OR_RETURN(Shape xs, n.attrs.get_ints("input_shape"));
      SHOAL_ASSIGN_OR_RETURN(Shape ys, conv_out_shape(n, xs, in[1].shape));
      if (ys != in[0].shape) return invalid_argument("dy must be {}", shape_str(ys));
      return Types{{t, xs}};
    };
    // Also the transposed convolution (Builder::conv_transpose2d). It is
    // linear in dy and in w: its adjoint in dy is the convolution with w,
    // and in w the weight gradient of a convolution of the incoming gradient.
    gi.grad = GRAD {
      Attrs a;
      for (const char* k : {"stride", "padding", "dilation", "groups"})
        if (g.node.attrs.has(k)) a.set(k, g.node.attrs.all().at(k));
      Attrs aw = a;
      aw.set("weight_shape", SHAPE_OF(1));
      return {g.b.op("conv2d", {DY, X(1)}, a), g.b.op("conv2d_grad_weight", {DY, X(0)}, aw)};
    };
    r.add(gi);
    OpDef gw;
    gw.name = "conv2d_grad_weight";
    gw.min_inputs = gw.max_inputs = 2;
    gw.attrs = {"stride", "padding", "dilation", "groups", "weight_shape", "precision"};
    gw.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(DType t, conv_type(n, in));
      SHOAL_ASSIGN_OR_RETURN(Shape ws, n.attrs.get_ints("weight_shape"));
      SHOAL_ASSIGN_OR_RETURN(Shape ys, conv_out_shape(n, in[0].shape, ws));
      if (ys != in[1].shape) return invalid_argument("dy must be {}", shape_str(ys));
      return Types{{t, ws}};
    };
    r.add(gw);
  }
  for (std::string kind : {"max", "avg"}) {
    OpDef d;
    d.name = kind + "_pool2d";
    d.attrs = {"kernel", "stride", "padding"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
      SHOAL_ASSIGN_OR_RETURN(Shape s, pool_out_shape(n, in[0].shape));
      return Types{{in[0].dtype, s}};
    };
    if (kind == "max") {
      d.grad = GRAD { return {g.b.op("max_pool2d_grad", {X(0), DY}, g.node.attrs)}; };
    } else {
      d.grad = GRAD {
        Attrs a = g.node.attrs;
        a.set("input_shape", SHAPE_OF(0));
        return {g.b.op("avg_pool2d_grad", {DY}, a)};
      };
    }
    r.add(d);
  }
  {
    OpDef d;
    d.name = "max_pool2d_grad";
    d.min_inputs = d.max_inputs = 2;
    // relu = 1: also through the ReLU whose output x is (the CPU backend's
    // fusion of relu_grad(max_pool2d_grad(y, dy), y)).
    d.attrs = {"kernel", "stride", "padding", "relu"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_same_float(in));
      SHOAL_ASSIGN_OR_RETURN(Shape s, pool_out_shape(n, in[0].shape));
      if (s != in[1].shape) return invalid_argument("dy must be {}", shape_str(s));
      return Types{in[0]};
    };
    r.add(d);
    d.name = "avg_pool2d_grad";
    d.min_inputs = d.max_inputs = 1;
    d.attrs = {"kernel", "stride", "padding", "input_shape"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
      SHOAL_ASSIGN_OR_RETURN(Shape xs, n.attrs.get_ints("input_shape"));
      SHOAL_ASSIGN_OR_RETURN(Shape s, pool_out_shape(n, xs));
      if (s != in[0].shape) return invalid_argument("dy must be {}", shape_str(s));
      return Types{{in[0].dtype, xs}};
    };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "global_avg_pool";
    d.infer = [](const Node&, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
      if (in[0].shape.size() != 4) return invalid_argument("input must be NCHW (rank 4)");
      return Types{{in[0].dtype, {in[0].shape[0], in[0].shape[1]}}};
    };
    d.grad = GRAD {
      const Shape& s = SHAPE_OF(0);
      Value r4 = g.b.reshape(DY, {s[0], s[1], 1, 1});
      Value scale = g.b.scalar_like(1.0 / static_cast<double>(s[2] * s[3]), DY);
      return {g.b.mul(g.b.broadcast(r4, s), scale)};
    };
    r.add(d);
  }
}

void register_loss_ops(OpRegistry& r) {
  for (std::string name : {"softmax", "log_softmax"}) {
    OpDef d;
    d.name = name;
    d.attrs = {"axis"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
      SHOAL_RETURN_IF_ERROR(norm_axis(n.attrs.get_int_or("axis", -1), in[0].shape.size()).status());
      SHOAL_RETURN_IF_ERROR(check_softmax_attrs(n, in[0].shape));
      return Types{in[0]};
    };
    if (name == "softmax") {
      // softmax(scale * x + causal mask): attention's scores in one op.
      // --precision bf16 lets it read bf16 scores and write bf16 (dst).
      d.attrs = {"axis", "scale", "causal", "dst"};
      d.infer = [](const Node& n, const Types& in) -> InferResult {
        SHOAL_ASSIGN_OR_RETURN(TensorType y, read_as_float(in));
        SHOAL_RETURN_IF_ERROR(check_softmax_attrs(n, in[0].shape));
        SHOAL_RETURN_IF_ERROR(bf16_on_last_axis(n, in));
        SHOAL_ASSIGN_OR_RETURN(y, with_dst(n, y));
        return Types{y};
      };
      // One fused pass, dx = scale * y * (dy - sum(dy * y)), not four.
      d.grad = GRAD {
        Attrs a = {{"axis", g.node.attrs.get_int_or("axis", -1)}};
        if (g.node.attrs.has("scale")) a.set("scale", g.node.attrs.get_float_or("scale", 1.0));
        return {g.b.op("softmax_grad", {Y(0), DY}, a)};
      };
    } else {
      d.grad = GRAD {
        std::int64_t ax = *norm_axis(g.node.attrs.get_int_or("axis", -1), SHAPE_OF(0).size());
        Value s = g.b.reduce_sum(DY, {ax}, true);
        return {g.b.sub(DY, g.b.mul(g.b.exp(Y(0)), s))};
      };
    }
    r.add(d);
  }
  {
    OpDef d;
    d.name = "softmax_grad";  // (y, dy) -> scale * y * (dy - sum(dy * y) along axis)
    d.min_inputs = d.max_inputs = 2;
    d.attrs = {"axis", "scale", "dst"};  // dst: --precision bf16 (with_dst)
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      if (in[0].shape != in[1].shape)
        return invalid_argument("y {} and dy {} differ in shape", shape_str(in[0].shape),
                                shape_str(in[1].shape));
      SHOAL_ASSIGN_OR_RETURN(TensorType dx, read_as_float(in));
      SHOAL_RETURN_IF_ERROR(norm_axis(n.attrs.get_int_or("axis", -1), in[0].shape.size()).status());
      SHOAL_RETURN_IF_ERROR(check_softmax_attrs(n, in[0].shape));
      SHOAL_RETURN_IF_ERROR(bf16_on_last_axis(n, in));
      SHOAL_ASSIGN_OR_RETURN(dx, with_dst(n, dx));
      return Types{dx};
    };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "one_hot";
    d.attrs = {"depth", "dtype"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      if (in[0].dtype != DType::kI32 && in[0].dtype != DType::kI64)
        return invalid_argument("indices must be i32 or i64");
      SHOAL_ASSIGN_OR_RETURN(std::int64_t depth, n.attrs.get_int("depth"));
      SHOAL_ASSIGN_OR_RETURN(DType t, parse_dtype(n.attrs.get_string_or("dtype", "f32")));
      Shape s = in[0].shape;
      s.push_back(depth);
      return Types{{t, s}};
    };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "cross_entropy";  // mean over the batch of -log softmax(logits)[label]
    d.min_inputs = d.max_inputs = 2;
    d.infer = [](const Node&, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
      if (in[0].shape.size() != 2) return invalid_argument("logits must be [N, C]");
      if (in[1].dtype != DType::kI32 && in[1].dtype != DType::kI64)
        return invalid_argument("labels must be i32 or i64");
      if (in[1].shape != Shape{in[0].shape[0]})
        return invalid_argument("labels must be [{}]", in[0].shape[0]);
      return Types{{in[0].dtype, {}}};
    };
    d.grad = GRAD {
      const Shape& s = SHAPE_OF(0);
      DType t = g.b.dtype_of(X(0));
      Value oh =
          g.b.op("one_hot", {X(1)}, {{"depth", s[1]}, {"dtype", std::string(dtype_name(t))}});
      Value p = g.b.softmax(X(0), 1);
      Value scale =
          g.b.mul(DY, g.b.scalar(1.0 / static_cast<double>(std::max<std::int64_t>(s[0], 1)), t));
      return {g.b.mul(g.b.sub(p, oh), scale), Value{}};
    };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "mse";  // mean((a - b)^2)
    d.min_inputs = d.max_inputs = 2;
    d.infer = [](const Node&, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_same_float(in));
      if (in[0].shape != in[1].shape) return invalid_argument("shapes must match");
      return Types{{in[0].dtype, {}}};
    };
    d.grad = GRAD {
      double n = static_cast<double>(std::max<std::int64_t>(num_elements(SHAPE_OF(0)), 1));
      Value ga = g.b.mul(g.b.sub(X(0), X(1)), g.b.mul(DY, g.b.scalar_like(2.0 / n, DY)));
      return {ga, g.b.neg(ga)};
    };
    r.add(d);
  }
}

}  // namespace shoal::graph::ops_detail
