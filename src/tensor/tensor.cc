#include "shoal/tensor/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace shoal {

std::int64_t num_elements(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  std::int64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<std::int64_t>(s[i], 1);
  }
  return st;
}

Result<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      return invalid_argument("shapes {} and {} do not broadcast (dim {}: {} vs {})", shape_str(a),
                              shape_str(b), i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::shared_ptr<Storage> Storage::allocate(std::size_t bytes) {
  std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kTensorAlignment - 1) /
                        kTensorAlignment * kTensorAlignment;
  void* p = std::aligned_alloc(kTensorAlignment, rounded);
  SHOAL_CHECK(p != nullptr, "out of memory allocating {} bytes", rounded);
  std::memset(p, 0, rounded);
  return std::shared_ptr<Storage>(new Storage(p, bytes, true, nullptr));
}

std::shared_ptr<Storage> Storage::wrap(void* data, std::size_t bytes, std::shared_ptr<void> owner) {
  return std::shared_ptr<Storage>(new Storage(data, bytes, false, std::move(owner)));
}

Storage::~Storage() {
  if (owned_) std::free(data_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (auto d : shape) SHOAL_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.storage_ = Storage::allocate(static_cast<std::size_t>(num_elements(shape)) * dtype_size(dtype));
  return t;
}

Tensor Tensor::full(const Shape& shape, DType dtype, double value) {
  Tensor t = empty(shape, dtype);
  std::int64_t n = t.numel();
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v = from_double<T>(value);
    T* p = static_cast<T*>(t.raw_data());
    for (std::int64_t i = 0; i < n; ++i) p[i] = v;
  });
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                            std::int64_t offset) {
  Tensor t;
  t.storage_ = std::move(storage);
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.offset_ = offset;
  SHOAL_CHECK(static_cast<std::size_t>(offset + num_elements(shape)) * dtype_size(dtype) <=
                  t.storage_->size(),
              "tensor {} {} at offset {} exceeds storage of {} bytes", dtype_name(dtype),
              shape_str(shape), offset, t.storage_->size());
  return t;
}

bool Tensor::is_contiguous() const {
  std::int64_t expect = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) +
         offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

std::int64_t Tensor::element_offset(std::int64_t flat) const {
  std::int64_t off = 0;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    std::int64_t d = shape_[i];
    off += (flat % d) * strides_[i];
    flat /= d;
  }
  return off;
}

Result<Tensor> Tensor::slice(int dim, std::int64_t start, std::int64_t end,
                             std::int64_t step) const {
  if (dim < 0) dim += rank();
  if (dim < 0 || dim >= rank())
    return invalid_argument("slice: dim {} out of range for shape {}", dim, shape_str(shape_));
  std::int64_t n = shape_[dim];
  if (step <= 0) return invalid_argument("slice: step must be positive, got {}", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<std::int64_t>(start, 0, n);
  end = std::clamp<std::int64_t>(end, start, n);
  Tensor t = *this;
  t.offset_ += start * strides_[dim];
  t.shape_[dim] = (end - start + step - 1) / step;
  t.strides_[dim] *= step;
  return t;
}

Result<Tensor> Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) return invalid_argument("reshape: more than one -1 in {}", shape_str(shape));
      infer = static_cast<int>(i);
    } else if (s[i] < 0) {
      return invalid_argument("reshape: negative dimension in {}", shape_str(shape));
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0)
      return invalid_argument("reshape: cannot infer -1 in {} from {} elements", shape_str(shape),
                              numel());
    s[infer] = numel() / known;
  }
  if (num_elements(s) != numel())
    return invalid_argument("reshape: {} has {} elements but {} has {}", shape_str(shape_), numel(),
                            shape_str(s), num_elements(s));
  Tensor src = is_contiguous() ? *this : contiguous();
  src.shape_ = s;
  src.strides_ = contiguous_strides(s);
  return src;
}

Result<Tensor> Tensor::transpose(const std::vector<int>& perm) const {
  if (static_cast<int>(perm.size()) != rank())
    return invalid_argument("transpose: permutation of length {} for shape {}", perm.size(),
                            shape_str(shape_));
  std::vector<bool> seen(perm.size(), false);
  Tensor t = *this;
  for (std::size_t i = 0; i < perm.size(); ++i) {
    int p = perm[i];
    if (p < 0 || p >= rank() || seen[p])
      return invalid_argument("transpose: invalid permutation for shape {}", shape_str(shape_));
    seen[p] = true;
    t.shape_[i] = shape_[p];
    t.strides_[i] = strides_[p];
  }
  return t;
}

Result<Tensor> Tensor::broadcast_to(const Shape& shape) const {
  if (shape.size() < shape_.size())
    return invalid_argument("broadcast_to: cannot broadcast {} to smaller rank {}",
                            shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  std::size_t lead = shape.size() - shape_.size();
  t.shape_ = shape;
  t.strides_.assign(shape.size(), 0);
  for (std::size_t i = 0; i < shape_.size(); ++i) {
    std::int64_t d = shape_[i];
    if (d == shape[lead + i]) {
      t.strides_[lead + i] = strides_[i];
    } else if (d != 1) {
      return invalid_argument("broadcast_to: cannot broadcast {} to {}", shape_str(shape_),
                              shape_str(shape));
    }
  }
  return t;
}

namespace {

// Strided element-wise copy with conversion; iterates the destination's
// logical index with an odometer over both stride sets.
template <typename S, typename D>
void strided_convert(const Tensor& src, Tensor& dst) {
  const Shape& shape = dst.shape();
  std::int64_t n = dst.numel();
  if (n == 0) return;
  const S* sp = static_cast<const S*>(src.raw_data());
  D* dp = static_cast<D*>(dst.raw_data());
  int r = dst.rank();
  if (src.is_contiguous() && dst.is_contiguous()) {
    for (std::int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<S, D>)
        dp[i] = sp[i];
      else
        dp[i] = from_double<D>(to_double(sp[i]));
    }
    return;
  }
  std::vector<std::int64_t> idx(static_cast<std::size_t>(r), 0);
  std::int64_t so = 0, doff = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<S, D>)
      dp[doff] = sp[so];
    else
      dp[doff] = from_double<D>(to_double(sp[so]));
    for (int d = r - 1; d >= 0; --d) {
      ++idx[d];
      so += src.strides()[d];
      doff += dst.strides()[d];
      if (idx[d] < shape[d]) break;
      so -= src.strides()[d] * shape[d];
      doff -= dst.strides()[d] * shape[d];
      idx[d] = 0;
    }
  }
}

}  // namespace

Status Tensor::copy_from(const Tensor& src) {
  if (src.shape_ != shape_)
    return invalid_argument("copy_from: shape {} into {}", shape_str(src.shape_),
                            shape_str(shape_));
  dispatch_dtype(src.dtype_, [&](auto s) {
    dispatch_dtype(dtype_, [&](auto d) { strided_convert<decltype(s), decltype(d)>(src, *this); });
  });
  return ok_status();
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const { return cast(dtype_); }

Tensor Tensor::cast(DType to) const {
  Tensor out = empty(shape_, to);
  Status st = out.copy_from(*this);
  SHOAL_CHECK(st.ok(), "{}", st.to_string());
  return out;
}

double Tensor::get(std::int64_t flat) const {
  SHOAL_CHECK(flat >= 0 && flat < numel(), "get({}) on {} elements", flat, numel());
  std::int64_t off = element_offset(flat);
  return dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    return to_double(static_cast<const T*>(raw_data())[off]);
  });
}

void Tensor::set(std::int64_t flat, double v) {
  SHOAL_CHECK(flat >= 0 && flat < numel(), "set({}) on {} elements", flat, numel());
  std::int64_t off = element_offset(flat);
  dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    static_cast<T*>(raw_data())[off] = from_double<T>(v);
  });
}

std::string Tensor::to_string(std::int64_t max_elems) const {
  std::string out = fmt::format("Tensor({} {}", dtype_name(dtype_), shape_str(shape_));
  if (!defined()) return out + " undefined)";
  out += " [";
  std::int64_t n = std::min(numel(), max_elems);
  for (std::int64_t i = 0; i < n; ++i) out += fmt::format("{}{:.6g}", i ? ", " : "", get(i));
  if (numel() > n) out += ", ...";
  return out + "])";
}

}  // namespace shoal
