// The model zoo: MLP, CNN (conv-BN-ReLU-pool blocks, then linear layers)
// and a ResNet-20-style small ResNet, written against the graph Builder.
// A model's forward function is run once per graph (train, eval) through a
// ModelContext that turns each parameter and buffer into a named graph
// input ("param/<name>", "buf/<name>"), so every graph binds the same
// tensors. Initialization (Kaiming normal for ReLU layers, Xavier uniform
// for the classifier, zero biases) draws from Philox streams keyed by the
// parameter's position, so a seed fixes every weight.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/graph/builder.h"

namespace shoal::train {

struct ParamSpec {
  std::string name;
  Shape shape;
  std::string init;  // kaiming, xavier, normal (stddev), zeros, ones, given
  double fan_in = 1, fan_out = 1;
  Tensor value;       // init == "given": an imported model's weights
  double stddev = 0;  // init == "normal"
};

struct BufferSpec {
  std::string name;
  Shape shape;
  double init = 0;
  Tensor value;  // when given (an imported model's running statistics)
  bool given = false;
};

class ModelContext {
 public:
  ModelContext(graph::Builder& b, bool training) : b_(b), training_(training) {}
  graph::Builder& b() { return b_; }
  bool training() const { return training_; }

  graph::Value param(const std::string& name, Shape shape, const std::string& init, double fan_in,
                     double fan_out);
  graph::Value buffer(const std::string& name, Shape shape, double init);
  // A parameter drawn from N(0, stddev^2) (transformers' init).
  graph::Value normal_param(const std::string& name, Shape shape, double stddev);
  // A parameter or buffer whose initial value comes with the model (ONNX).
  graph::Value given_param(const std::string& name, const Tensor& value);
  graph::Value given_buffer(const std::string& name, const Tensor& value);
  // The buffer's value after a training step (training graphs only).
  void update_buffer(const std::string& name, graph::Value v) { updates_.push_back({name, v}); }
  std::uint64_t seed = 0;  // random ops (dropout) in the model

  // Layers. Names are prefixes ("conv1" makes "conv1.weight", ...).
  graph::Value conv(graph::Value x, std::int64_t cin, std::int64_t cout, std::int64_t k,
                    std::int64_t stride, std::int64_t pad, const std::string& name, bool bias);
  // Batch norm: batch statistics in training (and running-stat updates as
  // graph values), running statistics in eval.
  graph::Value batch_norm(graph::Value x, std::int64_t c, const std::string& name);
  graph::Value dense(graph::Value x, std::int64_t in, std::int64_t out, const std::string& name,
                     const std::string& init = "kaiming");

  const std::vector<ParamSpec>& params() const { return params_; }
  const std::vector<BufferSpec>& buffers() const { return buffers_; }
  const std::map<std::string, graph::Value>& param_values() const { return pvals_; }
  // New running statistics ("buf/<name>" -> value), training graphs only.
  const std::vector<std::pair<std::string, graph::Value>>& buffer_updates() const {
    return updates_;
  }

  double bn_momentum = 0.1;

 private:
  graph::Builder& b_;
  bool training_;
  std::vector<ParamSpec> params_;
  std::vector<BufferSpec> buffers_;
  std::map<std::string, graph::Value> pvals_;
  std::vector<std::pair<std::string, graph::Value>> updates_;
};

// The GPT-style decoder's size (--layers --heads --dim --context); its
// vocabulary is the data's classes.
struct GptConfig {
  int layers = 2;
  int heads = 4;
  std::int64_t dim = 128;
  std::int64_t context = 64;  // also the text data's tokens per sample
  bool tied = true;           // the output head is the token embedding transposed
  std::string str() const;    // "layers=2 heads=4 dim=128 context=64 tied=1"
};
Result<GptConfig> parse_gpt_config(std::string_view s);  // the form str() writes
Status validate(const GptConfig& c);

struct Model {
  std::string name;
  // Input x is f32 [N, 1, H, W] (or token ids [N, T]); returns logits
  // [N, classes] ([N*T, vocabulary] for a language model).
  std::function<graph::Value(ModelContext&, graph::Value x)> forward;
};

// "mlp", "cnn", "resnet" (ResNet-20), "gpt" (sized by `gpt`), or a path
// ending in .onnx (an ONNX model; onnx/import.h). The error lists the
// known names.
// `onnx_tied`: onnx::Bindings::tie_shared for an ONNX model.
Result<Model> make_model(const std::string& name, int classes, const GptConfig& gpt = {},
                         bool onnx_tied = false);
// The GPT decoder over token ids [N, T] (T <= context): logits [N*T, vocab].
Result<Model> gpt_model(const GptConfig& c, int vocab);
std::vector<std::string> model_names();
// Whether make_model accepts `name`: a built-in name, the alias "resnet20",
// or a path ending in .onnx (the file is not opened).
bool is_model_name(const std::string& name);
bool is_onnx_path(const std::string& name);

// Initial values for params (by spec) and buffers, from Philox(seed).
std::map<std::string, Tensor> init_params(const std::vector<ParamSpec>& specs, std::uint64_t seed);
std::map<std::string, Tensor> init_buffers(const std::vector<BufferSpec>& specs);

}  // namespace shoal::train
