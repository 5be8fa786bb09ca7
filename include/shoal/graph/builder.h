// A builder that reads like the math: `auto y = b.relu(b.linear(x, w, bias));`.
// The first error is kept (status()) and later ops on invalid values are
// skipped, so model code checks once at the end. Not thread-safe.
#pragma once

#include <string>
#include <vector>

#include "shoal/graph/graph.h"

namespace shoal::graph {

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }
  const Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  // Records an error found while building (the first one is kept).
  void fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }
  const TensorType& type(Value v) const { return g_.type(v); }
  const Shape& shape(Value v) const { return g_.type(v).shape; }

  Value op(const std::string& op, std::vector<Value> inputs, Attrs attrs = {},
           std::string name = "");
  std::vector<Value> op_multi(const std::string& op, std::vector<Value> inputs, Attrs attrs = {},
                              std::string name = "");

  Value input(const std::string& name, DType dt, Shape shape) {
    return g_.input(name, {dt, shape});
  }
  Value constant(Tensor t) { return g_.constant(std::move(t)); }
  Value scalar(double v, DType dt = DType::kF32);
  Value scalar_like(double v, Value like) { return scalar(v, dtype_of(like)); }
  Value zeros(const TensorType& t);
  DType dtype_of(Value v) const { return v.valid() ? g_.type(v).dtype : DType::kF32; }

  // Elementwise (numpy broadcasting).
  Value add(Value a, Value b) { return op("add", {a, b}); }
  Value sub(Value a, Value b) { return op("sub", {a, b}); }
  Value mul(Value a, Value b) { return op("mul", {a, b}); }
  Value div(Value a, Value b) { return op("div", {a, b}); }
  Value pow(Value a, Value b) { return op("pow", {a, b}); }
  Value neg(Value a) { return op("neg", {a}); }
  Value exp(Value a) { return op("exp", {a}); }
  Value log(Value a) { return op("log", {a}); }
  Value sqrt(Value a) { return op("sqrt", {a}); }
  Value rsqrt(Value a) { return op("rsqrt", {a}); }
  Value abs(Value a) { return op("abs", {a}); }
  Value relu(Value a) { return op("relu", {a}); }
  Value gelu(Value a) { return op("gelu", {a}); }
  Value tanh(Value a) { return op("tanh", {a}); }
  Value erf(Value a) { return op("erf", {a}); }
  Value sigmoid(Value a) { return op("sigmoid", {a}); }
  Value where(Value c, Value a, Value b) { return op("where", {c, a, b}); }
  Value cast(Value a, DType to) {
    return op("cast", {a}, {{"dtype", std::string(dtype_name(to))}});
  }

  // Linear algebra and NN.
  Value matmul(Value a, Value b, bool ta = false, bool tb = false);
  Value linear(Value x, Value w, Value bias = {});
  Value conv2d(Value x, Value w, Value bias = {}, std::vector<std::int64_t> stride = {1, 1},
               std::vector<std::int64_t> padding = {0, 0},
               std::vector<std::int64_t> dilation = {1, 1}, std::int64_t groups = 1);
  // Transposed convolution (the gradient of conv2d in its input): w is
  // [C_in, C_out/groups, kH, kW]; the output is [N, C_out, (H-1)*s - 2p +
  // d(k-1) + 1 + output_padding, ...].
  Value conv_transpose2d(Value x, Value w, Value bias, std::vector<std::int64_t> stride,
                         std::vector<std::int64_t> padding,
                         std::vector<std::int64_t> output_padding,
                         std::vector<std::int64_t> dilation, std::int64_t groups);
  Value max_pool2d(Value x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride,
                   std::vector<std::int64_t> padding = {0, 0});
  Value avg_pool2d(Value x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride,
                   std::vector<std::int64_t> padding = {0, 0});
  Value global_avg_pool(Value x) { return op("global_avg_pool", {x}); }
  // Returns {y, batch_mean, batch_var} (train) or {y, mean, var} (eval).
  std::vector<Value> batch_norm(Value x, Value gamma, Value beta, Value running_mean,
                                Value running_var, bool training, double eps = 1e-5);
  Value layer_norm(Value x, Value gamma, Value beta, double eps = 1e-5);
  Value dropout(Value x, double p, std::int64_t seed, std::int64_t stream = 0);
  Value softmax(Value x, std::int64_t axis = -1) { return op("softmax", {x}, {{"axis", axis}}); }
  // softmax(scale * x) over the last axis, positions j > i + cols - rows
  // masked out (0) when causal (a row that sees nothing is all 0):
  // attention's scores in one op.
  Value attention_softmax(Value x, double scale, bool causal) {
    return op("softmax", {x},
              {{"axis", std::int64_t{-1}}, {"scale", scale}, {"causal", std::int64_t{causal}}});
  }
  Value log_softmax(Value x, std::int64_t axis = -1) {
    return op("log_softmax", {x}, {{"axis", axis}});
  }
  Value cross_entropy(Value logits, Value labels) { return op("cross_entropy", {logits, labels}); }
  Value mse(Value a, Value b) { return op("mse", {a, b}); }
  Value embedding(Value table, Value ids) { return op("embedding", {table, ids}); }

  // Reductions and shape ops.
  Value reduce_sum(Value x, std::vector<std::int64_t> axes, bool keepdims = false);
  Value reduce_mean(Value x, std::vector<std::int64_t> axes, bool keepdims = false);
  Value reduce_max(Value x, std::vector<std::int64_t> axes, bool keepdims = false);
  Value broadcast(Value x, Shape shape) { return op("broadcast", {x}, {{"shape", shape}}); }
  Value sum_to(Value x, Shape shape) { return op("sum_to", {x}, {{"shape", shape}}); }
  Value reshape(Value x, Shape shape) { return op("reshape", {x}, {{"shape", shape}}); }
  Value transpose(Value x, std::vector<std::int64_t> perm) {
    return op("transpose", {x}, {{"perm", perm}});
  }
  Value concat(std::vector<Value> xs, std::int64_t axis) {
    return op("concat", xs, {{"axis", axis}});
  }
  Value slice(Value x, std::int64_t axis, std::int64_t start, std::int64_t end,
              std::int64_t step = 1);
  Value flatten(Value x, std::int64_t start_dim = 1) {
    return op("flatten", {x}, {{"start_dim", start_dim}});
  }

 private:
  Graph& g_;
  Status status_;
};

}  // namespace shoal::graph
