// TensorProto <-> Tensor. ONNX stores a tensor either as raw little-endian
// bytes or in a typed repeated field (f16, bf16, bool and small integers
// travel in int32_data); both are read. External data (models over 2 GB)
// is refused with the tensor's name.
#include <cstring>
#include <fstream>

#include "onnx/context.h"
#include "shoal/core/file.h"

namespace shoal::onnx {

using ::onnx::TensorProto;

namespace {

// ONNX element types with a Shoal dtype, both directions from one table.
constexpr std::pair<int, DType> kTypes[] = {
    {TensorProto::FLOAT, DType::kF32},   {TensorProto::DOUBLE, DType::kF64},
    {TensorProto::FLOAT16, DType::kF16}, {TensorProto::BFLOAT16, DType::kBF16},
    {TensorProto::INT32, DType::kI32},   {TensorProto::INT64, DType::kI64},
    {TensorProto::UINT8, DType::kU8},    {TensorProto::BOOL, DType::kBool},
};

int onnx_type(DType t) {
  for (const auto& [o, d] : kTypes)
    if (d == t) return o;
  return TensorProto::UNDEFINED;
}

// Copies a typed repeated field into `t`, narrowing each element to the
// tensor's element size (int32_data carries f16/bf16 bit patterns, bools
// and bytes as whole int32s).
template <typename Field>
Status copy_field(const Field& f, Tensor& t, const std::string& name) {
  if (f.size() != t.numel())
    return data_loss("tensor '{}' holds {} values for shape {} ({} elements)", name, f.size(),
                     fmt::join(t.shape(), "x"), t.numel());
  auto* out = static_cast<unsigned char*>(t.raw_data());
  const std::size_t es = dtype_size(t.dtype());
  for (int i = 0; i < f.size(); ++i) {
    auto v = f.Get(i);
    if (es == sizeof(v)) {
      std::memcpy(out + static_cast<std::size_t>(i) * es, &v, es);
    } else {  // int32 field holding a narrower type (little-endian low bytes)
      std::uint32_t bits = static_cast<std::uint32_t>(v);
      std::memcpy(out + static_cast<std::size_t>(i) * es, &bits, es);
    }
  }
  return ok_status();
}

}  // namespace

Result<DType> dtype_of(int t) {
  for (const auto& [o, d] : kTypes)
    if (o == t) return d;
  return unimplemented("ONNX element type {} ({}) has no Shoal dtype", t,
                       TensorProto::DataType_Name(static_cast<TensorProto::DataType>(t)));
}

Result<Tensor> from_proto(const TensorProto& p) {
  const std::string& name = p.name();
  if (p.data_location() == TensorProto::EXTERNAL)
    return unimplemented(
        "tensor '{}' keeps its data in an external file; Shoal reads only "
        "models whose weights are inside the .onnx file",
        name);
  SHOAL_ASSIGN_OR_RETURN(DType dt, dtype_of(p.data_type()));
  Shape shape(p.dims().begin(), p.dims().end());
  for (auto d : shape)
    if (d < 0) return data_loss("tensor '{}' has a negative dimension {}", name, d);
  Tensor t = Tensor::empty(shape, dt);
  if (p.has_raw_data()) {
    if (p.raw_data().size() != t.nbytes())
      return data_loss("tensor '{}' has {} raw bytes; shape {} of {} needs {}", name,
                       p.raw_data().size(), fmt::join(shape, "x"), dtype_name(dt), t.nbytes());
    if (t.nbytes()) std::memcpy(t.raw_data(), p.raw_data().data(), t.nbytes());
    return t;
  }
  Status s;
  switch (dt) {
    case DType::kF32:
      s = copy_field(p.float_data(), t, name);
      break;
    case DType::kF64:
      s = copy_field(p.double_data(), t, name);
      break;
    case DType::kI64:
      s = copy_field(p.int64_data(), t, name);
      break;
    default:
      s = copy_field(p.int32_data(), t, name);
      break;
  }
  if (!s.ok()) return s;
  return t;
}

TensorProto to_proto(const Tensor& t) {
  TensorProto p;
  Tensor c = t.contiguous();
  p.set_data_type(onnx_type(c.dtype()));
  for (auto d : c.shape()) p.add_dims(d);
  p.set_raw_data(std::string(static_cast<const char*>(c.raw_data()), c.nbytes()));
  return p;
}

Result<Tensor> read_tensor_file(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  TensorProto p;
  if (!p.ParseFromString(bytes)) return data_loss("{}: not a serialized ONNX TensorProto", path);
  auto t = from_proto(p);
  if (!t.ok()) return t.status().with_context(path);
  return t;
}

Status write_tensor_file(const std::string& path, const Tensor& t) {
  return write_file_atomic(path, to_proto(t).SerializeAsString());
}

}  // namespace shoal::onnx
