// The `shoal` Python module: tensors (shoal.Tensor), ONNX models
// (shoal.onnx.load), training (shoal.Trainer), and weights as
// {name: ndarray} (shoal.load_weights / shoal.save_weights, safetensors).
#include <Python.h>
#include <pybind11/stl.h>

#include "python/python.h"
#include "shoal/core/version.h"
#include "shoal/onnx/import.h"
#include "shoal/tensor/safetensors.h"
#include "shoal/train/weights.h"

namespace shoal::python {

void raise(const Status& s) {
  std::string msg = s.message();
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      type = PyExc_ValueError;
      break;
    case StatusCode::kNotFound:
      type = PyExc_FileNotFoundError;
      break;
    case StatusCode::kDeadlineExceeded:
      type = PyExc_TimeoutError;
      break;
    case StatusCode::kUnimplemented:  // an operator or opset not imported
      type = PyExc_NotImplementedError;
      break;
    default:
      break;
  }
  PyErr_SetString(type, msg.c_str());
  throw py::error_already_set();
}

namespace {

py::dict weights_dict(const std::map<std::string, Tensor>& tensors) {
  py::dict d;
  for (const auto& [name, t] : tensors) d[py::str(name)] = copy_to_numpy(t);
  return d;
}

void bind_weights(py::module_& m) {
  m.def(
      "load_weights",
      [](const std::string& path) {
        auto w = check(train::read_weights(path));
        return weights_dict(w.tensors);
      },
      py::arg("path"),
      "Tensors of a safetensors file (a Shoal checkpoint or a PyTorch state_dict) as "
      "{name: ndarray}; a Shoal checkpoint's CRC is verified.");
  m.def(
      "save_weights",
      [](const std::string& path, const py::dict& tensors) {
        std::vector<std::pair<std::string, Tensor>> list;
        for (auto [k, v] : tensors)
          list.emplace_back(
              py::cast<std::string>(k),
              from_array_like(v, fmt::format("save_weights: '{}'", py::cast<std::string>(k))));
        std::sort(list.begin(), list.end(),
                  [](const auto& a, const auto& b) { return a.first < b.first; });
        check(without_gil([&] { return write_safetensors(path, list); }));
      },
      py::arg("path"), py::arg("tensors"),
      "Writes {name: ndarray} as a safetensors file (atomically), readable by "
      "shoal.load_weights, `shoal train --init-from` and PyTorch's safetensors loaders.");
}

}  // namespace

void bind_onnx(py::module_& m) {
  py::module_ o = m.def_submodule("onnx", "ONNX models (parsed by the ONNX project's library)");
  py::class_<onnx::Model>(o, "Model", "A parsed, checked ONNX model")
      .def_property_readonly("path", &onnx::Model::path)
      .def_property_readonly("opset", &onnx::Model::opset)
      .def_property_readonly("num_nodes", &onnx::Model::num_nodes)
      .def_property_readonly("inputs",
                             [](const onnx::Model& mo) {
                               py::list l;
                               for (const auto& v : mo.inputs())
                                 l.append(py::make_tuple(v.name, py::tuple(py::cast(v.shape))));
                               return l;
                             })
      .def_property_readonly("outputs",
                             [](const onnx::Model& mo) {
                               py::list l;
                               for (const auto& v : mo.outputs())
                                 l.append(py::make_tuple(v.name, py::tuple(py::cast(v.shape))));
                               return l;
                             })
      .def("__repr__", [](const onnx::Model& mo) {
        return fmt::format("<shoal.onnx.Model {} opset {}, {} nodes>", mo.path(), mo.opset(),
                           mo.num_nodes());
      });
  o.def(
      "load", [](const std::string& path) { return check(onnx::Model::load(path)); },
      py::arg("path"),
      "Parses and checks an ONNX file; every operator Shoal does not import is named in one "
      "NotImplementedError (malformed files raise ValueError). Pass the model to shoal.Trainer.");
  o.def("supported_ops", &onnx::supported_ops);
}

PYBIND11_MODULE(_shoal, m) {
  m.doc() = "Shoal: train networks on one process or many (C++ library, Python front).";
  std::string id = build_id();  // "shoal <version> <commit> ..."
  m.attr("__version__") = id.substr(6, id.find(' ', 6) - 6);
  m.attr("build") = id;
  bind_tensor(m);
  bind_weights(m);
  bind_onnx(m);
  bind_trainer(m);
}

}  // namespace shoal::python
