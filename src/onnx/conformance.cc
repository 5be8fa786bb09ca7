// The node-test runner behind `shoal onnx conformance` and the
// conformance test.
#include "shoal/onnx/conformance.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "onnx/context.h"
#include "shoal/core/file.h"
#include "shoal/runtime/backend.h"

namespace shoal::onnx {

namespace fs = std::filesystem;
using graph::Value;

namespace {

// Whether the model asks for training semantics: a BatchNormalization in
// its training form, or a Dropout given a training_mode input.
bool declares_training(const ::onnx::ModelProto& m) {
  for (const auto& n : m.graph().node()) {
    if (n.op_type() == "BatchNormalization") {
      for (const auto& a : n.attribute())
        if (a.name() == "training_mode" && a.i() != 0) return true;
      if (n.output_size() > 1) return true;
    }
    if (n.op_type() == "Dropout" && n.input_size() > 2 && !n.input(2).empty()) return true;
  }
  return false;
}

Status compare(const std::string& what, const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape())
    return invalid_argument("{}: shape [{}], expected [{}]", what, fmt::join(got.shape(), ","),
                            fmt::join(want.shape(), ","));
  if (got.dtype() != want.dtype())
    return invalid_argument("{}: dtype {}, expected {}", what, dtype_name(got.dtype()),
                            dtype_name(want.dtype()));
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    double g = got.get(i), w = want.get(i);
    bool same = (std::isnan(g) && std::isnan(w)) || g == w;
    if (!same && !(std::abs(g - w) <= 1e-7 + 1e-3 * std::abs(w)))
      return invalid_argument("{}: element {} is {}, expected {}", what, i, g, w);
  }
  return ok_status();
}

Status run_data_set(const Model& model, const std::string& dir, bool training) {
  std::map<std::string, Tensor> known, fed;
  graph::Graph g;
  graph::Builder b(g);
  std::map<std::string, Value> feeds;
  for (std::size_t i = 0; i < model.inputs().size(); ++i) {
    const std::string& name = model.inputs()[i].name;
    SHOAL_ASSIGN_OR_RETURN(Tensor t, read_tensor_file(fmt::format("{}/input_{}.pb", dir, i)));
    // Float tensors are data, fed at run time; integers, bools and float
    // scalars (a dropout ratio, a pad value) are settings, known at import.
    if (is_floating(t.dtype()) && t.rank() > 0) {
      feeds[name] = b.input(name, t.dtype(), t.shape());
      fed[name] = t;
    } else {
      known[name] = t;
    }
  }
  Bindings bind;
  bind.training = training;
  bind.param = [&b](const std::string&, const Tensor& t) { return b.constant(t); };
  bind.buffer = bind.param;
  SHOAL_ASSIGN_OR_RETURN(std::vector<Value> outs, model.emit(b, feeds, known, bind));
  for (Value v : outs) g.mark_output(v);
  SHOAL_ASSIGN_OR_RETURN(auto backend, runtime::make_backend("cpu"));
  SHOAL_ASSIGN_OR_RETURN(auto exe, backend->compile(std::move(g), {}));
  runtime::Executor run(*exe);
  SHOAL_ASSIGN_OR_RETURN(std::vector<Tensor> got, run.run(fed));
  for (std::size_t i = 0; i < got.size(); ++i) {
    SHOAL_ASSIGN_OR_RETURN(Tensor want, read_tensor_file(fmt::format("{}/output_{}.pb", dir, i)));
    SHOAL_RETURN_IF_ERROR(compare(fmt::format("output {}", i), got[i], want));
  }
  return ok_status();
}

Result<::onnx::ModelProto> read_model(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  ::onnx::ModelProto m;
  if (!m.ParseFromString(bytes)) return data_loss("{}: not an ONNX model", path);
  return m;
}

}  // namespace

NodeTest run_node_test(const std::string& dir) {
  NodeTest t;
  t.name = fs::path(dir).filename().string();
  auto proto = read_model(dir + "/model.onnx");
  if (proto.ok() && proto->graph().node_size() > 0) t.op = proto->graph().node(0).op_type();
  Status s = proto.status();
  std::vector<std::string> sets;
  if (s.ok()) {
    auto model = Model::load(dir + "/model.onnx");
    s = model.status();
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory()) sets.push_back(e.path().string());
    std::sort(sets.begin(), sets.end());
    if (s.ok() && sets.empty()) s = not_found("{}: no test_data_set_* directory", dir);
    for (const auto& d : sets) {
      if (!s.ok()) break;
      s = run_data_set(*model, d, declares_training(*proto));
      if (!s.ok()) s = s.with_context(fs::path(d).filename().string());
    }
  }
  t.passed = s.ok();
  if (!s.ok()) t.error = s.message();
  return t;
}

Result<std::vector<NodeTest>> run_node_tests(const std::string& root,
                                             const std::vector<std::string>& ops) {
  if (!fs::is_directory(root))
    return not_found("{}: no ONNX node tests here (Debian package libonnx-testdata)", root);
  std::set<std::string> want(ops.begin(), ops.end());
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  std::vector<NodeTest> out;
  for (const auto& d : dirs) {
    auto m = read_model(d + "/model.onnx");
    if (!m.ok() || m->graph().node_size() != 1) continue;  // expanded (multi-node) tests
    if (!want.empty() && !want.count(m->graph().node(0).op_type())) continue;
    out.push_back(run_node_test(d));
  }
  return out;
}

std::vector<std::string> claimed_ops() {
  // Imported but not claimed, with the suite's failing tests as the reason:
  // MaxPool (dilations, uint8, argmax indices), Cast
  // (bf16 as uint16, strings), Clip (int8), Dropout (training masks come from another
  // RNG), Identity (int8, sequences), Pad (edge, reflect), Pow (integer
  // bases, unsigned exponents), Slice (negative steps), ConvTranspose
  // (test_convtranspose, where Winograd's rounding leaves 4e-6 on an exact 0
  // on CPUs where oneDNN picks Winograd: passes with SHOAL_CONV_ALGO=direct;
  // the 3-D test passes since 2026-12-07).
  static const std::set<std::string> partial = {
      "MaxPool", "Cast", "Clip", "Dropout", "Identity", "Pad", "Pow", "Slice", "ConvTranspose"};
  std::vector<std::string> out;
  for (const auto& op : supported_ops())
    if (!partial.count(op)) out.push_back(op);
  return out;
}

}  // namespace shoal::onnx
