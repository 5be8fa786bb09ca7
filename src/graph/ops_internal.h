// Shared pieces of the op registrations (ops*.cc): type checks, axis
// normalization, gradient helpers and the GRAD shorthand.
#pragma once

#include <algorithm>
#include <functional>
#include <numeric>

#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"

namespace shoal::graph::ops_detail {

using Types = std::vector<TensorType>;
using InferResult = Result<Types>;

inline Status need_float(const TensorType& t, int i) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kF64)
    return invalid_argument("input {} must be f32 or f64, got {}", i, t.str());
  return ok_status();
}

inline Status need_same_float(const Types& in) {
  for (std::size_t i = 0; i < in.size(); ++i)
    SHOAL_RETURN_IF_ERROR(need_float(in[i], static_cast<int>(i)));
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != in[0].dtype)
      return invalid_argument("dtype mismatch: input 0 is {}, input {} is {}", in[0].str(), i,
                              in[i].str());
  return ok_status();
}

// The gradient through a fused activation (attribute "activation": relu
// stored the output ReLU'd; linear, conv2d and batch_norm): dy masked by y.
inline Value post_act_grad(Builder& b, const Node& n, Value y, Value dy) {
  if (n.attrs.get_string_or("activation", "") == "relu") return b.op("relu_grad", {dy, y});
  return dy;
}

// An op that --precision bf16 lets write bf16 itself where its only
// reader was a cast (graph/precision.cc's narrow_producers): "dst" names
// its output type, only bf16 from an f32 computation.
inline Result<TensorType> with_dst(const Node& n, TensorType t) {
  const std::string dst = n.attrs.get_string_or("dst", "");
  if (dst.empty()) return t;
  if (dst != "bf16" || t.dtype != DType::kF32)
    return invalid_argument("dst {} for a {} result: only bf16 from f32", dst, dtype_name(t.dtype));
  t.dtype = DType::kBF16;
  return t;
}

// The inputs of an op --precision bf16 lets read bf16 (graph/precision.cc's
// bf16 readers: GELU, softmax and their gradients): f32 or bf16 in any mix,
// each read into f32, or all f64. The result's type before "dst": f32
// where any input is bf16, else the inputs'. Where they differ, the shapes
// must agree (no broadcasting across dtypes).
inline Result<TensorType> read_as_float(const Types& in) {
  bool bf16 = false;
  for (const TensorType& t : in) bf16 = bf16 || t.dtype == DType::kBF16;
  if (!bf16) {
    SHOAL_RETURN_IF_ERROR(need_same_float(in));
    return in[0];
  }
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i].dtype != DType::kF32 && in[i].dtype != DType::kBF16)
      return invalid_argument("input {} must be f32 or bf16 beside a bf16 input, got {}", i,
                              in[i].str());
    if (in[i].shape != in[0].shape)
      return invalid_argument("input {} {} differs in shape from input 0 {}", i, in[i].str(),
                              in[0].str());
  }
  return TensorType{DType::kF32, in[0].shape};
}

inline Result<std::int64_t> norm_axis(std::int64_t axis, std::size_t rank) {
  auto r = static_cast<std::int64_t>(rank);
  if (axis < -r || axis >= std::max<std::int64_t>(r, 1))
    return invalid_argument("axis {} out of range for rank {}", axis, rank);
  return axis < 0 ? axis + r : axis;
}

inline Result<std::vector<std::int64_t>> norm_axes(const std::vector<std::int64_t>& axes,
                                                   std::size_t rank) {
  std::vector<std::int64_t> out;
  if (axes.empty()) {
    for (std::size_t i = 0; i < rank; ++i) out.push_back(static_cast<std::int64_t>(i));
    return out;
  }
  for (auto a : axes) {
    SHOAL_ASSIGN_OR_RETURN(auto n, norm_axis(a, rank));
    if (std::find(out.begin(), out.end(), n) != out.end())
      return invalid_argument("axis {} listed twice", a);
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Gradient helpers.
inline Value reduce_to(Builder& b, Value v, const Shape& shape) {
  if (!v.valid() || b.shape(v) == shape) return v;
  return b.sum_to(v, shape);
}

inline Shape keepdims_shape(const Shape& in, const std::vector<std::int64_t>& axes) {
  Shape s = in;
  for (auto a : axes) s[static_cast<std::size_t>(a)] = 1;
  return s;
}

// dy of a reduction, broadcast back to the input's shape.
inline Value expand_back(Builder& b, Value dy, const Shape& in, const Node& n) {
  auto axes = norm_axes(n.attrs.get_ints_or("axes", {}), in.size());
  Value r = b.reshape(dy, keepdims_shape(in, *axes));
  return b.broadcast(r, in);
}

inline OpDef unary(const std::string& name, std::function<std::vector<Value>(GradInputs&)> grad) {
  OpDef d;
  d.name = name;
  d.infer = [](const Node&, const Types& in) -> InferResult {
    SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
    return Types{in[0]};
  };
  d.grad = std::move(grad);
  return d;
}

inline OpDef binary(const std::string& name, std::function<std::vector<Value>(GradInputs&)> grad) {
  OpDef d;
  d.name = name;
  d.min_inputs = d.max_inputs = 2;
  d.infer = [](const Node&, const Types& in) -> InferResult {
    SHOAL_RETURN_IF_ERROR(need_same_float(in));
    SHOAL_ASSIGN_OR_RETURN(Shape s, broadcast_shapes(in[0].shape, in[1].shape));
    return Types{{in[0].dtype, s}};
  };
  d.grad = std::move(grad);
  return d;
}

#define GRAD [](GradInputs & g) -> std::vector<Value>
#define X(i) g.node.inputs[i]
#define Y(i) g.outputs[i]
#define DY g.output_grads[0]
#define SHAPE_OF(i) g.b.shape(g.node.inputs[i])

// One function per family of ops (ops_elementwise.cc, ops_nn.cc, ops_shape.cc).
void register_unary_ops(OpRegistry& r);
void register_binary_ops(OpRegistry& r);
void register_linear_ops(OpRegistry& r);
void register_conv_ops(OpRegistry& r);
void register_norm_ops(OpRegistry& r);
void register_loss_ops(OpRegistry& r);
void register_reduce_ops(OpRegistry& r);
void register_layout_ops(OpRegistry& r);
void register_embedding_ops(OpRegistry& r);

}  // namespace shoal::graph::ops_detail
