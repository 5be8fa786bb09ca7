#include "shoal/graph/builder.h"

namespace shoal::graph {

std::vector<Value> Builder::op_multi(const std::string& op, std::vector<Value> inputs, Attrs attrs,
                                     std::string name) {
  if (!status_.ok()) return {};
  for (const Value& v : inputs)
    if (!v.valid()) {
      status_ = invalid_argument("{}: an input is an invalid value", op);
      return {};
    }
  auto r = g_.add_node(op, std::move(inputs), std::move(attrs), std::move(name));
  if (!r.ok()) {
    status_ = r.status();
    return {};
  }
  return *r;
}

Value Builder::op(const std::string& op, std::vector<Value> inputs, Attrs attrs, std::string name) {
  auto outs = op_multi(op, std::move(inputs), std::move(attrs), std::move(name));
  return outs.empty() ? Value{} : outs[0];
}

Value Builder::scalar(double v, DType dt) { return g_.constant(Tensor::full({}, dt, v)); }

Value Builder::zeros(const TensorType& t) { return g_.constant(Tensor::zeros(t.shape, t.dtype)); }

Value Builder::matmul(Value a, Value b, bool ta, bool tb) {
  Attrs at;
  if (ta) at.set("transpose_a", std::int64_t{1});
  if (tb) at.set("transpose_b", std::int64_t{1});
  return op("matmul", {a, b}, at);
}

Value Builder::linear(Value x, Value w, Value bias) {
  if (bias.valid()) return op("linear", {x, w, bias});
  return op("linear", {x, w});
}

Value Builder::conv2d(Value x, Value w, Value bias, std::vector<std::int64_t> stride,
                      std::vector<std::int64_t> padding, std::vector<std::int64_t> dilation,
                      std::int64_t groups) {
  Attrs a{{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
  if (bias.valid()) return op("conv2d", {x, w, bias}, a);
  return op("conv2d", {x, w}, a);
}

Value Builder::conv_transpose2d(Value x, Value w, Value bias, std::vector<std::int64_t> stride,
                                std::vector<std::int64_t> padding,
                                std::vector<std::int64_t> output_padding,
                                std::vector<std::int64_t> dilation, std::int64_t groups) {
  const Shape& xs = shape(x);
  const Shape& ws = shape(w);
  if (xs.size() != 4 || ws.size() != 4 || stride.size() != 2 || padding.size() != 2 ||
      output_padding.size() != 2 || dilation.size() != 2) {
    fail(
        invalid_argument("conv_transpose2d: x {} and w {} must be rank 4, and stride, padding, "
                         "output_padding, dilation 2 values each",
                         shape_str(xs), shape_str(ws)));
    return {};
  }
  Shape out = {xs[0], ws[1] * groups, 0, 0};
  for (int i = 0; i < 2; ++i) {
    if (output_padding[i] < 0 || output_padding[i] >= stride[i]) {
      fail(invalid_argument("conv_transpose2d: output_padding {} must be in [0, stride {})",
                            output_padding[i], stride[i]));
      return {};
    }
    out[2 + i] = (xs[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (ws[2 + i] - 1) + 1 +
                 output_padding[i];
  }
  Attrs a{{"stride", stride},
          {"padding", padding},
          {"dilation", dilation},
          {"groups", groups},
          {"input_shape", out}};
  Value y = op("conv2d_grad_input", {x, w}, a);
  if (!bias.valid()) return y;
  return add(y, reshape(bias, {1, out[1], 1, 1}));
}

Value Builder::max_pool2d(Value x, std::vector<std::int64_t> kernel,
                          std::vector<std::int64_t> stride, std::vector<std::int64_t> padding) {
  return op("max_pool2d", {x}, {{"kernel", kernel}, {"stride", stride}, {"padding", padding}});
}

Value Builder::avg_pool2d(Value x, std::vector<std::int64_t> kernel,
                          std::vector<std::int64_t> stride, std::vector<std::int64_t> padding) {
  return op("avg_pool2d", {x}, {{"kernel", kernel}, {"stride", stride}, {"padding", padding}});
}

std::vector<Value> Builder::batch_norm(Value x, Value gamma, Value beta, Value running_mean,
                                       Value running_var, bool training, double eps) {
  return op_multi("batch_norm", {x, gamma, beta, running_mean, running_var},
                  {{"training", std::int64_t{training ? 1 : 0}}, {"eps", eps}});
}

Value Builder::layer_norm(Value x, Value gamma, Value beta, double eps) {
  return op("layer_norm", {x, gamma, beta}, {{"eps", eps}});
}

Value Builder::dropout(Value x, double p, std::int64_t seed, std::int64_t stream) {
  return op("dropout", {x}, {{"p", p}, {"seed", seed}, {"stream", stream}});
}

Value Builder::reduce_sum(Value x, std::vector<std::int64_t> axes, bool keepdims) {
  return op("reduce_sum", {x}, {{"axes", axes}, {"keepdims", std::int64_t{keepdims}}});
}
Value Builder::reduce_mean(Value x, std::vector<std::int64_t> axes, bool keepdims) {
  return op("reduce_mean", {x}, {{"axes", axes}, {"keepdims", std::int64_t{keepdims}}});
}
Value Builder::reduce_max(Value x, std::vector<std::int64_t> axes, bool keepdims) {
  return op("reduce_max", {x}, {{"axes", axes}, {"keepdims", std::int64_t{keepdims}}});
}

Value Builder::slice(Value x, std::int64_t axis, std::int64_t start, std::int64_t end,
                     std::int64_t step) {
  return op("slice", {x}, {{"axis", axis}, {"start", start}, {"end", end}, {"step", step}});
}

}  // namespace shoal::graph
