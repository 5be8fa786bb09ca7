// Row-sparse pushes and pulls (Shard::push_rows, Shard::pull_rows): what
// embedding tables need, a few rows of a large key per step.
#include <cstring>

#include "ps/shard_key.h"

namespace shoal::ps {
namespace {

Status check_rows(const std::string& key, const std::vector<std::int64_t>& rows,
                  std::int64_t count) {
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || rows[i] >= count)
      return invalid_argument("key '{}': row {} (entry {} of the list) is outside its {} rows", key,
                              rows[i], i, count);
  return ok_status();
}

}  // namespace

Result<PushResult> Shard::push_rows(int worker, const std::string& key, std::int64_t step,
                                    std::uint64_t seq, const std::vector<std::int64_t>& rows,
                                    const Tensor& values, double lr) {
  auto it = keys_.find(key);
  if (it == keys_.end())
    return not_found("worker {} pushed rows of key '{}', which this server does not hold", worker,
                     key);
  const Tensor& v = it->second->value;
  if (v.rank() == 0) return invalid_argument("key '{}' is a scalar: it has no rows to push", key);
  Shape want = v.shape();
  want[0] = static_cast<std::int64_t>(rows.size());
  if (values.dtype() != DType::kF32 || values.shape() != want)
    return invalid_argument("worker {} pushed {} rows of key '{}' as {} {}; expected f32 {}",
                            worker, rows.size(), key, dtype_name(values.dtype()),
                            shape_str(values.shape()), shape_str(want));
  SHOAL_RETURN_IF_ERROR(check_rows(key, rows, v.dim(0)));
  Tensor dense = Tensor::zeros(v.shape(), DType::kF32);
  const Tensor src = values.contiguous();
  const std::int64_t width = v.numel() / v.dim(0);
  float* d = dense.data<float>();
  const float* s = src.data<float>();
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::int64_t j = 0; j < width; ++j)
      d[rows[i] * width + j] += s[static_cast<std::int64_t>(i) * width + j];
  SHOAL_ASSIGN_OR_RETURN(PushResult pr, push(worker, key, step, seq, dense, lr));
  if (pr != PushResult::kDuplicate && pr != PushResult::kWait) ++stats_.row_pushes;
  return pr;
}

Result<std::pair<std::uint64_t, Tensor>> Shard::pull_rows(
    const std::string& key, const std::vector<std::int64_t>& rows) const {
  SHOAL_ASSIGN_OR_RETURN(auto got, peek(key));
  const Tensor& v = *got.second;
  if (v.rank() == 0) return invalid_argument("key '{}' is a scalar: it has no rows to pull", key);
  SHOAL_RETURN_IF_ERROR(check_rows(key, rows, v.dim(0)));
  Shape shape = v.shape();
  shape[0] = static_cast<std::int64_t>(rows.size());
  Tensor out = Tensor::empty(shape, DType::kF32);
  const std::size_t row_bytes = v.dim(0) == 0 ? 0 : v.nbytes() / static_cast<std::size_t>(v.dim(0));
  const auto* src = static_cast<const char*>(v.raw_data());
  auto* dst = static_cast<char*>(out.raw_data());
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::memcpy(dst + i * row_bytes, src + static_cast<std::size_t>(rows[i]) * row_bytes,
                row_bytes);
  return std::pair{got.first, std::move(out)};
}

}  // namespace shoal::ps
