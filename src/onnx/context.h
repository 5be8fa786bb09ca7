// Private to the importer: what an operator converter sees of one ONNX node
// (its inputs as graph values or import-time constants, its attributes) and
// the converter table. Converters are registered per op type in ops_*.cc.
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "shoal/onnx/import.h"

namespace shoal::onnx {

// TensorProto <-> Tensor (dtype mapped; external data refused, named).
Result<Tensor> from_proto(const ::onnx::TensorProto& p);
::onnx::TensorProto to_proto(const Tensor& t);
Result<DType> dtype_of(int onnx_type);

// The state of one emit(): every ONNX value seen so far, as a graph value
// or as a tensor known at import time (or both).
struct Env {
  graph::Builder& b;
  Bindings& bind;
  std::map<std::string, graph::Value> values;
  std::map<std::string, Tensor> known;
  std::map<std::string, const ::onnx::TensorProto*> initializers;  // not yet bound
  std::map<std::string, std::string> missing;  // outputs Shoal does not compute: why
  // An Identity's output -> the initializer it passes on: PyTorch's
  // eval-mode export feeds batch norm's running statistics through Identity
  // nodes, and a buffer must be bound under the initializer's own name.
  std::map<std::string, std::string> alias;
  // Every initializer (bound or not), and those bound as buffers: the
  // exporter merges initializers of equal value, so a running statistic and
  // a parameter (fresh zeros, ones) can arrive as one; each gets its own.
  std::map<std::string, const ::onnx::TensorProto*> protos;
  std::set<std::string> buffers;
  // A float initializer bound as a parameter -> the node that bound it
  // (Bindings::tie_shared: whether other nodes get their own).
  std::map<std::string, int> param_node;
  // Initializers a Slice or Split bound first: their other slices are views
  // of the same parameter, never copies (an RNN's weight cut into gates).
  std::set<std::string> views;
};

bool is_view(const ::onnx::NodeProto& n);

// A node's name, or "node <i>" when the file gives none.
std::string node_name(const ::onnx::NodeProto& n, int index);

class Ctx {
 public:
  Ctx(Env& env, const ::onnx::NodeProto& n, int index, int opset)
      : env_(env), n_(n), index_(index), opset_(opset) {}

  graph::Builder& b() { return env_.b; }
  Bindings& bind() { return env_.bind; }
  int opset() const { return opset_; }
  const ::onnx::NodeProto& node() const { return n_; }
  const std::string& op() const { return n_.op_type(); }

  int num_inputs() const;  // trailing empty ("" = omitted) inputs not counted
  bool has_input(int i) const;
  // The input's name, through Identity aliases to the initializer it names.
  const std::string& input_name(int i) const;
  // Makes output i another name of input i's initializer (Identity).
  void alias_output(int i);
  // Whether input i is an initializer no node has bound yet.
  bool unbound_initializer(int i) const;
  // The input as a graph value (a known tensor becomes a graph constant; a
  // float initializer becomes a parameter).
  Result<graph::Value> in(int i);
  // The input as a batch-norm buffer (initializer) or graph value; `*bound`
  // gets the name it was bound under (its own copy's when the initializer
  // was bound already, as a parameter or another node's buffer).
  Result<graph::Value> in_buffer(int i, std::string* bound);
  // The input's value if known at import, else null.
  const Tensor* known(int i);
  // A known integer input as int64s; an error naming the input otherwise.
  Result<std::vector<std::int64_t>> ints(int i);
  Result<graph::TensorType> type(int i);

  void out(int i, graph::Value v);
  void out_known(int i, Tensor t);
  // An output Shoal does not compute; reading it is an error naming `what`.
  void out_missing(int i, std::string what);
  int num_outputs() const { return n_.output_size(); }
  bool wants_output(int i) const { return i < n_.output_size() && !n_.output(i).empty(); }

  bool has_attr(const std::string& name) const { return attr(name) != nullptr; }
  std::int64_t attr_i(const std::string& name, std::int64_t d) const;
  double attr_f(const std::string& name, double d) const;
  std::vector<std::int64_t> attr_ints(const std::string& name,
                                      std::vector<std::int64_t> d = {}) const;
  std::string attr_s(const std::string& name, std::string d = "") const;
  const ::onnx::AttributeProto* attr(const std::string& name) const;

  // An error naming the node and its op type.
  template <typename... Args>
  Status fail(fmt::format_string<Args...> f, Args&&... args) const {
    return invalid_argument("{}: {}", label(), fmt::format(f, std::forward<Args>(args)...));
  }
  std::string label() const;

 private:
  Result<graph::Value> own_copy(int i, bool buffer, std::string* bound);
  Env& env_;
  const ::onnx::NodeProto& n_;
  int index_;
  int opset_;
};

using Converter = std::function<Status(Ctx&)>;
// All converters by op type; each ops_*.cc adds its own.
std::map<std::string, Converter>& converters();
void add_math_ops(std::map<std::string, Converter>& t);
void add_nn_ops(std::map<std::string, Converter>& t);
void add_shape_ops(std::map<std::string, Converter>& t);
void add_rnn_ops(std::map<std::string, Converter>& t);

// Nodes fuse_decompositions writes carry this domain; their converters are
// fused_converters(), apart from the ONNX operators Shoal claims.
inline constexpr const char* kFusedDomain = "ai.shoal.fused";
std::map<std::string, Converter>& fused_converters();
// Rewrites the decompositions exporters write for layer norm and GELU into
// one node each (fuse.cc); returns how many it fused.
int fuse_decompositions(::onnx::GraphProto& g);

// Pads x by begin[i]/end[i] along axis i with `value` (concatenated
// constants, so the gradient is concat's); negative amounts crop.
graph::Value pad_axes(graph::Builder& b, graph::Value x, const std::vector<std::int64_t>& begin,
                      const std::vector<std::int64_t>& end, double value);

// Normalizes an axis against a rank (negative counts from the end).
Result<std::int64_t> norm_axis(const Ctx& c, std::int64_t axis, std::size_t rank);

}  // namespace shoal::onnx
