// ONNX import: an ONNX model (parsed and checked by the ONNX project's own
// library) becomes Shoal's forward graph. Float initializers become named
// parameters (names kept, so checkpoints map back to the exporter's names);
// BatchNormalization's running statistics become buffers; integer
// initializers, Constant nodes and the Shape -> Gather -> Unsqueeze ->
// Concat -> Reshape chains that exporters emit are folded to constants at
// import, since Shoal's shapes are static. The caller appends the loss,
// autodiff and optimizer. A model is immutable once loaded; emit() may run
// from several threads on different builders.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/graph/builder.h"

namespace shoal::onnx {

// What a model's emit() asks of whoever owns the weights (the trainer's
// model context, a test, the conformance runner).
struct Bindings {
  bool training = true;  // batch-norm batch statistics, dropout active
  // A trainable float initializer; returns the graph value to use.
  std::function<graph::Value(const std::string& name, const Tensor& init)> param;
  // A batch-norm running statistic.
  std::function<graph::Value(const std::string& name, const Tensor& init)> buffer;
  // The new value of a buffer after a training step.
  std::function<void(const std::string& name, graph::Value v)> update_buffer;
  std::uint64_t seed = 0;  // dropout masks
  // A float initializer read by several nodes. torch.onnx.export (eval mode,
  // its default) merges initializers of equal value: deep-copied layers,
  // zero biases, unit norm scales. So by default each node after the first
  // gets a parameter of its own ("<initializer>@<node>"); true keeps the
  // file's sharing (weights tied on purpose, an embedding used as the head).
  bool tie_shared = false;
};

// A float initializer that several nodes read as a weight.
struct SharedInitializer {
  std::string name;
  std::vector<std::string> nodes;  // the readers' names ("node <i>" when unnamed)
};

struct ValueInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;  // -1 for a symbolic dimension (a dynamic batch)
};

class Model {
 public:
  // Parses and checks `path`; every operator Shoal does not import is named
  // in one error (node, op type, opset).
  static Result<Model> load(const std::string& path);
  static Result<Model> parse(const std::string& bytes, const std::string& where);

  const std::string& path() const { return path_; }
  int opset() const { return opset_; }
  const std::vector<ValueInfo>& inputs() const { return inputs_; }  // data inputs only
  const std::vector<ValueInfo>& outputs() const { return outputs_; }
  std::size_t num_nodes() const;
  // Float initializers (rank >= 1) read by more than one node, through
  // Identity nodes, in the file's order.
  const std::vector<SharedInitializer>& shared_initializers() const { return shared_; }
  // Layer norms and GELUs written as decompositions, imported as one op each.
  int fused() const { return fused_; }

  // Emits the forward graph. `feeds` holds one graph value per data input
  // (by name); `known` holds inputs whose values are fixed at import (they
  // fold like constants). Returns the graph outputs in ONNX order.
  Result<std::vector<graph::Value>> emit(graph::Builder& b,
                                         const std::map<std::string, graph::Value>& feeds,
                                         const std::map<std::string, Tensor>& known,
                                         Bindings& bind) const;

 private:
  struct Proto;
  std::shared_ptr<const Proto> proto_;
  std::string path_;
  int opset_ = 0;
  std::vector<ValueInfo> inputs_, outputs_;
  std::vector<SharedInitializer> shared_;
  int fused_ = 0;
};

// One line for the log: which initializers are shared and what emit() does
// with them ("" when none is).
std::string describe_shared(const Model& m, bool tie_shared);

// shoal::onnx::import(path): Model::load under the name users look for.
inline Result<Model> import(const std::string& path) { return Model::load(path); }

// Operator types (default domain) the importer handles.
std::vector<std::string> supported_ops();

// Reads a serialized TensorProto (the ONNX test suite's input_*.pb and
// output_*.pb files).
Result<Tensor> read_tensor_file(const std::string& path);
// Writes one (tests and tools that hand tensors to PyTorch).
Status write_tensor_file(const std::string& path, const Tensor& t);

}  // namespace shoal::onnx
