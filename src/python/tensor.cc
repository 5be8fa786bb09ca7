// shoal.Tensor and the NumPy conversions: the buffer protocol both ways,
// so a NumPy array and a Shoal tensor share one block of memory.
#include <Python.h>
#include <pybind11/stl.h>

#include <cstring>

#include "python/python.h"

namespace shoal::python {

namespace {

// The NumPy type Shoal keeps as is, or none (the array is converted).
std::optional<DType> dtype_of(const py::buffer_info& info) {
  std::string f = info.format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f = f.substr(1);
  if (f.size() != 1) return std::nullopt;
  char c = f[0];
  auto size = info.itemsize;
  if (c == 'f' && size == 4) return DType::kF32;
  if (c == 'd' && size == 8) return DType::kF64;
  if (c == 'e' && size == 2) return DType::kF16;
  if (c == 'B' && size == 1) return DType::kU8;
  if (c == '?' && size == 1) return DType::kBool;
  if ((c == 'i' || c == 'l' || c == 'q') && size == 4) return DType::kI32;
  if ((c == 'i' || c == 'l' || c == 'q') && size == 8) return DType::kI64;
  return std::nullopt;
}

const char* numpy_format(DType t) {
  switch (t) {
    case DType::kF32:
      return "f";
    case DType::kF64:
      return "d";
    case DType::kF16:
      return "e";
    case DType::kI32:
      return "i";
    case DType::kI64:
      return "q";
    case DType::kU8:
      return "B";
    case DType::kBool:
      return "?";
    default:
      return nullptr;
  }
}

bool c_contiguous(const py::buffer_info& info) {
  py::ssize_t want = info.itemsize;
  for (auto d = info.ndim; d-- > 0;) {
    if (info.shape[static_cast<std::size_t>(d)] > 1 &&
        info.strides[static_cast<std::size_t>(d)] != want)
      return false;
    want *= info.shape[static_cast<std::size_t>(d)];
  }
  return true;
}

// Keeps a Python object alive from C++; drops it holding the GIL (the last
// reference may go on a training thread).
std::shared_ptr<void> hold(py::object o) {
  return std::shared_ptr<void>(new py::object(std::move(o)), [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
}

}  // namespace

Tensor from_numpy(const py::buffer& b) {
  py::buffer_info info = b.request();
  auto dt = dtype_of(info);
  if (!dt || !c_contiguous(info)) {
    py::module_ np = py::module_::import("numpy");
    py::object arr = np.attr("asarray")(b);
    std::string kind = py::str(arr.attr("dtype").attr("kind"));
    const char* to = nullptr;
    if (kind == "f") to = "float32";
    if (kind == "i" || kind == "u") to = "int64";
    if (kind == "b") to = "bool";
    if (to == nullptr)
      throw py::value_error(fmt::format("shoal.Tensor: NumPy dtype {} has no Shoal type",
                                        std::string(py::str(arr.attr("dtype")))));
    // int8/16 and uint16/32 widen to i64 and f16 stays when contiguous; a
    // strided array of a kept type is only made contiguous.
    py::object conv = dt ? np.attr("ascontiguousarray")(arr)
                         : np.attr("ascontiguousarray")(arr, py::arg("dtype") = to);
    return from_numpy(py::reinterpret_borrow<py::buffer>(conv));
  }
  Shape shape(info.shape.begin(), info.shape.end());
  auto bytes = static_cast<std::size_t>(num_elements(shape)) * dtype_size(*dt);
  auto storage = Storage::wrap(info.ptr, bytes, hold(py::reinterpret_borrow<py::object>(b)));
  return Tensor::from_storage(storage, shape, *dt);
}

Tensor from_array_like(py::handle obj, std::string_view what) {
  if (PyObject_CheckBuffer(obj.ptr())) return from_numpy(py::reinterpret_borrow<py::buffer>(obj));
  // A torch tensor, a list, anything NumPy can make an array of (through
  // __array__ or nesting); before, "a bytes-like object is required".
  py::object arr;
  try {
    arr = py::module_::import("numpy").attr("asarray")(obj);
  } catch (const py::error_already_set& e) {
    throw py::value_error(
        fmt::format("{}: a {} is not an array and NumPy cannot make one of it "
                    "({})",
                    what, std::string(py::str(py::type::of(obj).attr("__name__"))), e.what()));
  }
  if (std::string(py::str(arr.attr("dtype").attr("kind"))) == "O")
    throw py::value_error(fmt::format(
        "{}: NumPy made an array of Python objects of it (ragged lists, mixed types): give "
        "numbers of one type and shape",
        what));
  return from_numpy(py::reinterpret_borrow<py::buffer>(arr));
}

py::array to_numpy(const Tensor& t) {
  Tensor c = t.dtype() == DType::kBF16 ? t.cast(DType::kF32) : t.contiguous();
  const char* fmt = numpy_format(c.dtype());
  std::vector<py::ssize_t> shape(c.shape().begin(), c.shape().end()), strides(shape.size());
  py::ssize_t s = static_cast<py::ssize_t>(dtype_size(c.dtype()));
  for (auto d = shape.size(); d-- > 0;) {
    strides[d] = s;
    s *= shape[d];
  }
  auto* keep = new Tensor(c);
  py::capsule owner(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(py::dtype(fmt), shape, strides, c.raw_data(), owner);
}

py::array copy_to_numpy(const Tensor& t) {
  Tensor c = t.dtype() == DType::kBF16 ? t.cast(DType::kF32) : t.contiguous();
  Tensor copy = Tensor::empty(c.shape(), c.dtype());
  std::memcpy(copy.raw_data(), c.raw_data(), c.nbytes());
  return to_numpy(copy);
}

void bind_tensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(),
                     "An n-dimensional array on Shoal's aligned storage. shoal.Tensor(ndarray) "
                     "shares the array's memory; np.asarray(tensor) shares the tensor's.")
      .def(py::init([](py::buffer b) { return from_numpy(b); }), py::arg("array"))
      .def_buffer([](Tensor& t) -> py::buffer_info {
        if (!t.is_contiguous() || numpy_format(t.dtype()) == nullptr)
          throw py::value_error(
              "shoal.Tensor: only contiguous tensors of NumPy types export a "
              "buffer; use .numpy()");
        std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides(shape.size());
        py::ssize_t s = static_cast<py::ssize_t>(dtype_size(t.dtype()));
        for (auto d = shape.size(); d-- > 0;) {
          strides[d] = s;
          s *= shape[d];
        }
        return py::buffer_info(t.raw_data(), static_cast<py::ssize_t>(dtype_size(t.dtype())),
                               numpy_format(t.dtype()), static_cast<py::ssize_t>(shape.size()),
                               shape, strides);
      })
      .def_property_readonly("shape",
                             [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("dtype",
                             [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def("numpy", &to_numpy, "A NumPy array sharing this tensor's memory")
      .def("__len__", [](const Tensor& t) { return t.rank() ? t.dim(0) : 0; })
      .def("__repr__", [](const Tensor& t) { return t.to_string(8); });
}

}  // namespace shoal::python
