// Tensor: a strided view (shape, strides in elements, offset) over
// 64-byte-aligned, ref-counted Storage. Views (slice, reshape, transpose,
// broadcast_to) share storage; copies are explicit. A Tensor is a value
// handle: copying it shares the storage. Not synchronized: callers that share
// a storage across threads coordinate writes themselves.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/tensor/dtype.h"

namespace shoal {

using Shape = std::vector<std::int64_t>;

std::int64_t num_elements(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3]"
Shape contiguous_strides(const Shape& s);
// Numpy-style broadcast of two shapes; error names both shapes.
Result<Shape> broadcast_shapes(const Shape& a, const Shape& b);

inline constexpr std::size_t kTensorAlignment = 64;

class Storage {
 public:
  // Owning, 64-byte aligned, zero-filled.
  static std::shared_ptr<Storage> allocate(std::size_t bytes);
  // Non-owning view of memory kept alive by `owner` (e.g. an executor arena).
  static std::shared_ptr<Storage> wrap(void* data, std::size_t bytes, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return bytes_; }

 private:
  Storage(void* data, std::size_t bytes, bool owned, std::shared_ptr<void> owner)
      : data_(data), bytes_(bytes), owned_(owned), owner_(std::move(owner)) {}
  void* data_;
  std::size_t bytes_;
  bool owned_;
  std::shared_ptr<void> owner_;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype);  // zero-filled
  static Tensor zeros(const Shape& shape, DType dtype) { return empty(shape, dtype); }
  static Tensor full(const Shape& shape, DType dtype, double value);
  static Tensor scalar(double value, DType dtype = DType::kF32) { return full({}, dtype, value); }
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                             std::int64_t offset = 0);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  std::int64_t offset() const { return offset_; }
  std::int64_t dim(int i) const { return shape_[static_cast<std::size_t>(i)]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return num_elements(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Pointer to the first element of the view.
  void* raw_data() const;
  template <typename T>
  T* data() const {
    SHOAL_CHECK(DTypeOf<T>::value == dtype_, "data<{}>() on a {} tensor",
                dtype_name(DTypeOf<T>::value), dtype_name(dtype_));
    return static_cast<T*>(raw_data());
  }

  // Views. Errors name the operation and the shapes involved.
  Result<Tensor> slice(int dim, std::int64_t start, std::int64_t end, std::int64_t step = 1) const;
  Result<Tensor> reshape(const Shape& shape) const;  // view if contiguous, else a copy
  Result<Tensor> transpose(const std::vector<int>& perm) const;
  Result<Tensor> broadcast_to(const Shape& shape) const;

  // Copies.
  Tensor contiguous() const;  // itself if already contiguous
  Tensor clone() const;
  Tensor cast(DType to) const;
  // Copies src's elements (converting dtype) into this view; shapes must match.
  Status copy_from(const Tensor& src);

  // Element access by flat index over the logical shape (slow; tests, tools).
  double get(std::int64_t flat_index) const;
  void set(std::int64_t flat_index, double v);
  template <typename T>
  std::vector<T> to_vector() const;

  std::string to_string(std::int64_t max_elems = 16) const;

 private:
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
  std::int64_t offset_ = 0;
  std::int64_t element_offset(std::int64_t flat_index) const;
};

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& v, const Shape& shape) {
  SHOAL_CHECK(static_cast<std::int64_t>(v.size()) == num_elements(shape),
              "from_vector: {} values for shape {}", v.size(), shape_str(shape));
  Tensor t = empty(shape, DTypeOf<T>::value);
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < v.size(); ++i) t.data<bool>()[i] = v[i];
  } else if (!v.empty()) {
    std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(T));
  }
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = dtype_ == DTypeOf<T>::value ? contiguous() : cast(DTypeOf<T>::value);
  std::vector<T> out(static_cast<std::size_t>(c.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = c.data<T>()[i];
  return out;
}

}  // namespace shoal
