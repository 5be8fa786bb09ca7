// An ONNX file as a Model: its graph is emitted into each graph the
// trainer builds (train and eval), its initializers become the context's
// given parameters and buffers, and the dataset's images are reshaped to
// the model's input when only the layout differs ([N, 1, 28, 28] fed to a
// model that takes [N, 784]).
#include "shoal/core/logging.h"
#include "shoal/onnx/import.h"
#include "shoal/train/model.h"

namespace shoal::train {

using graph::Value;

namespace {

// x as the model's input: same rank and dims (a symbolic dim takes x's),
// or the same number of elements per sample.
Result<Value> fit_input(graph::Builder& b, Value x, const onnx::ValueInfo& in,
                        const std::string& path) {
  const Shape& xs = b.shape(x);
  auto per_sample = [](const Shape& s) { return num_elements(Shape(s.begin() + 1, s.end())); };
  Shape want = in.shape;
  if (want.empty()) return invalid_argument("{}: input '{}' is a scalar", path, in.name);
  want[0] = xs[0];
  bool symbolic = false;
  for (std::size_t i = 1; i < want.size(); ++i) {
    if (want[i] < 0 && i < xs.size()) want[i] = xs[i];
    symbolic = symbolic || want[i] < 0;
  }
  if (want == xs) return x;
  if (!symbolic && per_sample(want) == per_sample(xs)) return b.reshape(x, want);
  return invalid_argument(
      "{}: the model's input '{}' is [{}] but the dataset's images are [{}] (batch first)", path,
      in.name, fmt::join(in.shape, ", "), fmt::join(xs, ", "));
}

Value emit(const onnx::Model& m, ModelContext& c, Value x, int classes, bool tied) {
  auto& b = c.b();
  if (m.inputs().size() != 1 || m.outputs().empty()) {
    b.fail(
        invalid_argument("{}: the model has {} data inputs and {} outputs; Shoal trains models "
                         "with one input (images) whose first output is the logits",
                         m.path(), m.inputs().size(), m.outputs().size()));
    return {};
  }
  auto fitted = fit_input(b, x, m.inputs()[0], m.path());
  if (!fitted.ok()) {
    b.fail(fitted.status());
    return {};
  }
  onnx::Bindings bind;
  bind.training = c.training();
  bind.seed = c.seed;
  bind.tie_shared = tied;
  bind.param = [&c](const std::string& n, const Tensor& t) { return c.given_param(n, t); };
  bind.buffer = [&c](const std::string& n, const Tensor& t) { return c.given_buffer(n, t); };
  bind.update_buffer = [&c](const std::string& n, Value v) {
    if (c.training()) c.update_buffer(n, v);
  };
  auto outs = m.emit(b, {{m.inputs()[0].name, *fitted}}, {}, bind);
  if (!outs.ok()) {
    b.fail(outs.status());
    return {};
  }
  Value logits = (*outs)[0];
  Shape ls = b.shape(logits);
  if (ls.size() != 2 || ls[0] != b.shape(x)[0]) {
    b.fail(
        invalid_argument("{}: the model's first output '{}' is [{}]; training needs logits "
                         "[{}, classes] (batch, classes)",
                         m.path(), m.outputs()[0].name, fmt::join(ls, ", "), b.shape(x)[0]));
    return {};
  }
  // The classes are the model's: a dataset whose labels use some of them
  // trains; a label beyond them is refused.
  if (ls[1] < classes) {
    b.fail(invalid_argument(
        "{}: the model's first output '{}' has {} classes, but the dataset's labels go up to "
        "{}: relabel the data to 0..{} or export the model with {} outputs",
        m.path(), m.outputs()[0].name, ls[1], classes - 1, ls[1] - 1, classes));
    return {};
  }
  return logits;
}

}  // namespace

Result<Model> onnx_model(const std::string& path, int classes, bool tied) {
  SHOAL_ASSIGN_OR_RETURN(onnx::Model m, onnx::Model::load(path));
  if (std::string shared = onnx::describe_shared(m, tied); !shared.empty())
    SHOAL_LOG_INFO("onnx: {}", shared);
  auto shared = std::make_shared<const onnx::Model>(std::move(m));
  Model out;
  out.name = path;
  out.forward = [shared, classes, tied](ModelContext& c, Value x) {
    return emit(*shared, c, x, classes, tied);
  };
  return out;
}

}  // namespace shoal::train
