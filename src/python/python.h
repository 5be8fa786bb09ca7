// Shared pieces of the `shoal` Python module (pybind11): Status to Python
// exceptions, and tensors to and from NumPy without copies.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "shoal/core/status.h"
#include "shoal/tensor/tensor.h"

namespace shoal::python {

namespace py = pybind11;

// Raises the Python exception for `s`: ValueError (invalid argument),
// FileNotFoundError (not found), TimeoutError (deadline), RuntimeError
// (anything else), carrying Shoal's message.
[[noreturn]] void raise(const Status& s);
inline void check(const Status& s) {
  if (!s.ok()) raise(s);
}
template <typename T>
T check(Result<T> r) {
  if (!r.ok()) raise(r.status());
  return std::move(r).value();
}

// Runs f (returning a Status or Result) with the GIL released; the caller
// raises its error after the GIL is back (raising needs it).
template <typename F>
auto without_gil(F&& f) {
  py::gil_scoped_release nogil;
  return f();
}

// A view of a C-contiguous NumPy array (or any buffer) as a Tensor: the
// tensor shares the array's memory and keeps it alive. Arrays that are not
// contiguous, or of a type Shoal lacks, are copied (converted) first.
Tensor from_numpy(const py::buffer& b);
// Anything array-like (buffer protocol, __array__, nested lists) as a
// Tensor; a ValueError naming `what` otherwise.
Tensor from_array_like(py::handle obj, std::string_view what);
// A NumPy array over the tensor's memory (kept alive by the array); bf16
// tensors, which NumPy lacks, are widened to f32 (a copy).
py::array to_numpy(const Tensor& t);
// A NumPy array that owns a copy.
py::array copy_to_numpy(const Tensor& t);

void bind_tensor(py::module_& m);
void bind_trainer(py::module_& m);
void bind_onnx(py::module_& m);

}  // namespace shoal::python
