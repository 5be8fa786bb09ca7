// Elementwise ops: unary maps, broadcasting binary ops, where, cast.
#include "graph/ops_internal.h"

namespace shoal::graph::ops_detail {

void register_unary_ops(OpRegistry& r) {
  r.add(unary(
      "neg", GRAD { return {g.b.neg(DY)}; }));
  r.add(unary(
      "exp", GRAD { return {g.b.mul(DY, Y(0))}; }));
  r.add(unary(
      "log", GRAD { return {g.b.div(DY, X(0))}; }));
  r.add(unary(
      "sqrt", GRAD { return {g.b.div(g.b.mul(DY, g.b.scalar_like(0.5, DY)), Y(0))}; }));
  r.add(unary(
      "rsqrt", GRAD {
        Value y3 = g.b.mul(g.b.mul(Y(0), Y(0)), Y(0));
        return {g.b.mul(g.b.mul(DY, g.b.scalar_like(-0.5, DY)), y3)};
      }));
  r.add(unary(
      "abs", GRAD { return {g.b.mul(DY, g.b.op("sign", {X(0)}))}; }));
  {
    OpDef d = unary(
        "relu", GRAD {
          return {g.b.op("relu_grad", {DY, Y(0)})};
        });
    // --precision bf16: a ReLU read by its cast and its gradient writes
    // bf16 itself (graph/precision.cc); the gradient reads that y.
    d.attrs = {"dst"};
    d.infer = [infer = d.infer](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(Types t, infer(n, in));
      SHOAL_ASSIGN_OR_RETURN(t[0], with_dst(n, t[0]));
      return t;
    };
    r.add(d);
  }
  {
    OpDef d = unary(
        "gelu", GRAD {
          return {g.b.op("gelu_grad", {X(0), DY})};
        });
    // --precision bf16 makes a GELU whose only reader is a cast to bf16
    // write bf16 itself (graph/precision.cc): "dst" names the output type;
    // and one whose input a product wrote read bf16 (read_as_float).
    d.attrs = {"dst"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(TensorType x, read_as_float(in));
      SHOAL_ASSIGN_OR_RETURN(TensorType y, with_dst(n, x));
      return Types{y};
    };
    r.add(d);
  }
  r.add(unary(
      "erf", GRAD {  // 2/sqrt(pi) exp(-x^2)
        Value e = g.b.exp(g.b.neg(g.b.mul(X(0), X(0))));
        return {g.b.mul(DY, g.b.mul(e, g.b.scalar_like(1.12837916709551257390, DY)))};
      }));
  r.add(unary(
      "tanh", GRAD {
        Value one = g.b.scalar_like(1.0, DY);
        return {g.b.mul(DY, g.b.sub(one, g.b.mul(Y(0), Y(0))))};
      }));
  r.add(unary(
      "sigmoid", GRAD {
        Value one = g.b.scalar_like(1.0, DY);
        return {g.b.mul(DY, g.b.mul(Y(0), g.b.sub(one, Y(0))))};
      }));
  r.add(unary("step", nullptr));  // 1 where x > 0, else 0
  r.add(unary("sign", nullptr));
  {
    OpDef d = binary("gelu_grad", nullptr);
    d.attrs = {"dst"};  // --precision bf16 (with_dst, read_as_float)
    d.infer = [infer = d.infer](const Node& n, const Types& in) -> InferResult {
      Types t;
      if (in[0].dtype == DType::kBF16 || in[1].dtype == DType::kBF16) {
        SHOAL_ASSIGN_OR_RETURN(TensorType x, read_as_float(in));
        t = {x};
      } else {
        SHOAL_ASSIGN_OR_RETURN(t, infer(n, in));
      }
      SHOAL_ASSIGN_OR_RETURN(t[0], with_dst(n, t[0]));
      return t;
    };
    r.add(d);
  }
  // dy where y > 0, else 0: ReLU's gradient in one pass (it was mul(dy,
  // step(y)): two passes and a temporary; same bits). Linear in dy; no
  // gradient for y (zero almost everywhere), as step had none.
}

void register_binary_ops(OpRegistry& r) {
  {
    OpDef d = binary(
        "relu_grad", GRAD {
          return {g.b.op("relu_grad", {DY, X(1)}), Value{}};
        });
    // (dy, y): y may be the bf16 a ReLU wrote under --precision bf16, dy the
    // bf16 a product wrote (read_as_float).
    d.infer = [infer = d.infer](const Node& n, const Types& in) -> InferResult {
      if (in[0].dtype != DType::kBF16 && in[1].dtype != DType::kBF16) return infer(n, in);
      SHOAL_ASSIGN_OR_RETURN(TensorType dx, read_as_float(in));
      return Types{dx};
    };
    r.add(d);
  }

  r.add(binary(
      "add", GRAD {
        return {reduce_to(g.b, DY, SHAPE_OF(0)), reduce_to(g.b, DY, SHAPE_OF(1))};
      }));
  r.add(binary(
      "sub", GRAD {
        return {reduce_to(g.b, DY, SHAPE_OF(0)), reduce_to(g.b, g.b.neg(DY), SHAPE_OF(1))};
      }));
  r.add(binary(
      "mul", GRAD {
        return {reduce_to(g.b, g.b.mul(DY, X(1)), SHAPE_OF(0)),
                reduce_to(g.b, g.b.mul(DY, X(0)), SHAPE_OF(1))};
      }));
  r.add(binary(
      "div", GRAD {
        Value da = g.b.div(DY, X(1));
        Value db = g.b.neg(g.b.div(g.b.mul(DY, Y(0)), X(1)));
        return {reduce_to(g.b, da, SHAPE_OF(0)), reduce_to(g.b, db, SHAPE_OF(1))};
      }));
  r.add(binary(
      "pow", GRAD {
        Value one = g.b.scalar_like(1.0, DY);
        Value da = g.b.mul(DY, g.b.mul(X(1), g.b.pow(X(0), g.b.sub(X(1), one))));
        Value db = g.b.mul(DY, g.b.mul(g.b.log(X(0)), Y(0)));
        return {reduce_to(g.b, da, SHAPE_OF(0)), reduce_to(g.b, db, SHAPE_OF(1))};
      }));
  r.add(binary("equal", nullptr));  // 1 where a == b, else 0

  {
    OpDef d;
    d.name = "where";
    d.min_inputs = d.max_inputs = 3;
    d.infer = [](const Node&, const Types& in) -> InferResult {
      Types ab = {in[1], in[2]};
      SHOAL_RETURN_IF_ERROR(need_same_float(ab));
      SHOAL_ASSIGN_OR_RETURN(Shape s, broadcast_shapes(in[1].shape, in[2].shape));
      SHOAL_ASSIGN_OR_RETURN(s, broadcast_shapes(in[0].shape, s));
      return Types{{in[1].dtype, s}};
    };
    d.grad = GRAD {
      Value z = g.b.scalar_like(0.0, DY);
      return {Value{}, reduce_to(g.b, g.b.where(X(0), DY, z), SHAPE_OF(1)),
              reduce_to(g.b, g.b.where(X(0), z, DY), SHAPE_OF(2))};
    };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "cast";
    d.attrs = {"dtype"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(std::string s, n.attrs.get_string("dtype"));
      SHOAL_ASSIGN_OR_RETURN(DType t, parse_dtype(s));
      return Types{{t, in[0].shape}};
    };
    d.grad = GRAD {
      DType from = g.b.dtype_of(X(0));
      if (!is_floating(from) || !is_floating(g.b.dtype_of(DY))) return {Value{}};
      return {g.b.cast(DY, from)};
    };
    r.add(d);
  }
}

}  // namespace shoal::graph::ops_detail
