// Element-wise, matrix and reduction operators. Integer arithmetic on
// values known at import (shape computations) is folded on the host.
#include <cmath>

#include "onnx/context.h"

namespace shoal::onnx {

using graph::Value;

namespace {

// a (op) b on the host, numpy-broadcast, in a's dtype (shape arithmetic).
Result<Tensor> fold_binary(const Ctx& c, const std::string& op, const Tensor& a, const Tensor& b) {
  Shape s = a.rank() >= b.rank() ? a.shape() : b.shape();
  auto ab = a.broadcast_to(s);
  auto bb = b.broadcast_to(s);
  if (!ab.ok() || !bb.ok())
    return c.fail("shapes {} and {} do not broadcast", fmt::join(a.shape(), "x"),
                  fmt::join(b.shape(), "x"));
  Tensor out = Tensor::empty(s, a.dtype());
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    double x = ab->get(i), y = bb->get(i), r = 0;
    if (op == "Add") r = x + y;
    if (op == "Sub") r = x - y;
    if (op == "Mul") r = x * y;
    if (op == "Pow") r = std::pow(x, y);
    if (op == "Div") {
      if (y == 0) return c.fail("integer division by zero at import");
      r = std::floor(x / y);
    }
    out.set(i, r);
  }
  return out;
}

Converter binary(const std::string& shoal_op) {
  return [shoal_op](Ctx& c) -> Status {
    const Tensor *ka = c.known(0), *kb = c.known(1);
    if (ka && kb && !is_floating(ka->dtype()) && !is_floating(kb->dtype())) {
      SHOAL_ASSIGN_OR_RETURN(Tensor r, fold_binary(c, c.op(), *ka, *kb));
      c.out_known(0, std::move(r));
      return ok_status();
    }
    SHOAL_ASSIGN_OR_RETURN(Value a, c.in(0));
    SHOAL_ASSIGN_OR_RETURN(Value b, c.in(1));
    // Pow takes an integer exponent with a float base: computed in the base's type.
    DType da = c.b().dtype_of(a), db = c.b().dtype_of(b);
    if (is_floating(da) && !is_floating(db)) b = c.b().cast(b, da);
    c.out(0, c.b().op(shoal_op, {a, b}));
    return ok_status();
  };
}

Converter unary(const std::string& shoal_op) {
  return [shoal_op](Ctx& c) -> Status {
    SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
    c.out(0, c.b().op(shoal_op, {x}));
    return ok_status();
  };
}

// Softmax and LogSoftmax: before opset 13 the input is viewed as 2-D,
// [prod(dims < axis), prod(dims >= axis)], and normalized over the second.
Converter softmax(const std::string& shoal_op) {
  return [shoal_op](Ctx& c) -> Status {
    SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
    Shape s = c.b().shape(x);
    if (c.opset() >= 13) {
      SHOAL_ASSIGN_OR_RETURN(std::int64_t ax, norm_axis(c, c.attr_i("axis", -1), s.size()));
      c.out(0, c.b().op(shoal_op, {x}, {{"axis", ax}}));
      return ok_status();
    }
    SHOAL_ASSIGN_OR_RETURN(std::int64_t ax, norm_axis(c, c.attr_i("axis", 1), s.size()));
    auto at = s.begin() + ax;
    std::int64_t rows = num_elements(Shape(s.begin(), at)), cols = num_elements(Shape(at, s.end()));
    Value y = c.b().op(shoal_op, {c.b().reshape(x, {rows, cols})}, {{"axis", std::int64_t{1}}});
    c.out(0, c.b().reshape(y, s));
    return ok_status();
  };
}

// ONNX MatMul is numpy's: 1-D operands gain a dimension that is then dropped.
Status matmul(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Value a, c.in(0));
  SHOAL_ASSIGN_OR_RETURN(Value w, c.in(1));
  Shape sa = b.shape(a), sw = b.shape(w);
  if (sa.size() == 1) a = b.reshape(a, {1, sa[0]});
  if (sw.size() == 1) w = b.reshape(w, {sw[0], 1});
  if (sa.size() > 2 && sw.size() == 2) {
    // A Linear over a sequence ([..., M, K] times a [K, N] weight): one
    // [rows, K] x [K, N] product, whose gradients are single matmuls too,
    // instead of a batch broadcast over the weight (a Mixer's token MLPs
    // ran 2.8x slower through the broadcasting kernel).
    std::int64_t rows = 1;
    for (std::size_t i = 0; i + 1 < sa.size(); ++i) rows *= sa[i];
    Shape ys(sa.begin(), sa.end() - 1);
    ys.push_back(sw[1]);
    c.out(0, b.reshape(b.matmul(b.reshape(a, {rows, sa.back()}), w), ys));
    return ok_status();
  }
  Value y = b.matmul(a, w);
  if (sa.size() == 1 || sw.size() == 1) {
    Shape ys = b.shape(y);
    if (sa.size() == 1) ys.erase(ys.end() - 2);
    if (sw.size() == 1) ys.pop_back();
    y = b.reshape(y, ys);
  }
  c.out(0, y);
  return ok_status();
}

// Y = alpha * A' B' + beta * C. The common exported form (B transposed, a
// bias vector, alpha = beta = 1) is Shoal's linear, one oneDNN call.
Status gemm(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Value a, c.in(0));
  SHOAL_ASSIGN_OR_RETURN(Value w, c.in(1));
  bool ta = c.attr_i("transA", 0) != 0, tb = c.attr_i("transB", 0) != 0;
  double alpha = c.attr_f("alpha", 1.0), beta = c.attr_f("beta", 1.0);
  Value bias;
  if (c.has_input(2)) {
    SHOAL_ASSIGN_OR_RETURN(bias, c.in(2));
  }
  Shape sw = b.shape(w);
  if (!ta && tb && alpha == 1.0 && beta == 1.0 &&
      (!bias.valid() || b.shape(bias) == Shape{sw[0]})) {
    c.out(0, b.linear(a, w, bias));
    return ok_status();
  }
  Value y = b.matmul(a, w, ta, tb);
  if (alpha != 1.0) y = b.mul(y, b.scalar_like(alpha, y));
  if (bias.valid()) {
    if (beta != 1.0) bias = b.mul(bias, b.scalar_like(beta, bias));
    y = b.add(y, bias);
  }
  c.out(0, y);
  return ok_status();
}

// ReduceSum/ReduceMean: axes from the attribute (older opsets, and
// ReduceMean through 17) or the second input (ReduceSum from 13); none
// means all axes unless noop_with_empty_axes.
Converter reduce(const std::string& shoal_op) {
  return [shoal_op](Ctx& c) -> Status {
    SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
    std::size_t rank = c.b().shape(x).size();
    std::vector<std::int64_t> axes = c.attr_ints("axes");
    if (c.has_input(1)) {
      SHOAL_ASSIGN_OR_RETURN(axes, c.ints(1));
    }
    if (axes.empty()) {
      if (c.attr_i("noop_with_empty_axes", 0) != 0) {
        c.out(0, x);
        return ok_status();
      }
      for (std::size_t i = 0; i < rank; ++i) axes.push_back(static_cast<std::int64_t>(i));
    }
    for (auto& a : axes) {
      SHOAL_ASSIGN_OR_RETURN(a, norm_axis(c, a, rank));
    }
    bool keep = c.attr_i("keepdims", 1) != 0;
    c.out(0, c.b().op(shoal_op, {x}, {{"axes", axes}, {"keepdims", std::int64_t{keep}}}));
    return ok_status();
  };
}

// clip(x, lo, hi) = lo + relu(x - lo) - relu(x - hi): ReLU6 (MobileNet's
// Clip(0, 6)) in two ReLUs, with their gradient. Infinite bounds: no bound.
Value clamp(graph::Builder& b, Value x, double lo, double hi) {
  if (std::isinf(lo) && std::isinf(hi)) return x;
  if (std::isinf(lo))  // min(x, hi) = hi - relu(hi - x)
    return b.sub(b.scalar_like(hi, x), b.relu(b.sub(b.scalar_like(hi, x), x)));
  Value y = b.relu(lo == 0 ? x : b.sub(x, b.scalar_like(lo, x)));
  if (!std::isinf(hi)) y = b.sub(y, b.relu(b.sub(x, b.scalar_like(hi, x))));
  if (lo != 0) y = b.add(y, b.scalar_like(lo, x));
  return y;
}

Status clip(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  double lo = c.attr_f("min", -INFINITY), hi = c.attr_f("max", INFINITY);
  for (int i : {1, 2}) {
    if (!c.has_input(i)) continue;
    const Tensor* k = c.known(i);
    if (!k) return c.fail("the clip bounds must be known at import");
    (i == 1 ? lo : hi) = k->get(0);
  }
  c.out(0, clamp(c.b(), x, lo, hi));
  return ok_status();
}

// max(x, 0) + alpha * min(x, 0), from ReLUs so the gradient comes along.
Status leaky_relu(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  Value neg = b.neg(b.relu(b.neg(x)));
  c.out(0, b.add(b.relu(x), b.mul(neg, b.scalar_like(c.attr_f("alpha", 0.01), x))));
  return ok_status();
}

// clip(alpha * x + beta, 0, 1), Clip's clamp; HardSwish is x times it with
// alpha 1/6, beta 1/2 (MobileNetV3).
Value hard_sigmoid(graph::Builder& b, Value x, double alpha, double beta) {
  return clamp(b, b.add(b.mul(x, b.scalar_like(alpha, x)), b.scalar_like(beta, x)), 0.0, 1.0);
}

Status hard_sigmoid_op(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  c.out(0, hard_sigmoid(c.b(), x, c.attr_f("alpha", 0.2), c.attr_f("beta", 0.5)));
  return ok_status();
}

Status hard_swish(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  c.out(0, c.b().mul(x, hard_sigmoid(c.b(), x, 1.0 / 6.0, 0.5)));
  return ok_status();
}

}  // namespace

void add_math_ops(std::map<std::string, Converter>& t) {
  t["Add"] = binary("add");
  t["Sub"] = binary("sub");
  t["Mul"] = binary("mul");
  t["Div"] = binary("div");
  t["Pow"] = binary("pow");
  t["Sqrt"] = unary("sqrt");
  t["Neg"] = unary("neg");
  t["Abs"] = unary("abs");
  t["Exp"] = unary("exp");
  t["Log"] = unary("log");
  t["Relu"] = unary("relu");
  t["Sigmoid"] = unary("sigmoid");
  t["Tanh"] = unary("tanh");
  t["Erf"] = unary("erf");  // with Div/Add/Mul: the Gelu PyTorch exports
  t["LeakyRelu"] = leaky_relu;
  t["HardSigmoid"] = hard_sigmoid_op;
  t["HardSwish"] = hard_swish;
  t["Softmax"] = softmax("softmax");
  t["LogSoftmax"] = softmax("log_softmax");
  t["Clip"] = clip;
  t["MatMul"] = matmul;
  t["Gemm"] = gemm;
  t["ReduceSum"] = reduce("reduce_sum");
  t["ReduceMean"] = reduce("reduce_mean");
}

}  // namespace shoal::onnx
