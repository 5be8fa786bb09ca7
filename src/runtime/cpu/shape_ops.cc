// Shape kernels: reshape, flatten, transpose, concat, slice, slice_scatter,
// embedding lookups and their scatter-add gradient.
#include <cstring>

#include "runtime/cpu/kernels_internal.h"

namespace shoal::runtime::cpu {
namespace {

Status copy_bytes(const Tensor& from, Tensor& to) {
  if (from.nbytes() != to.nbytes()) return internal_error("copy of {} bytes into {}", from.nbytes(), to.nbytes());
  if (from.nbytes() > 0) std::memcpy(to.raw_data(), from.raw_data(), from.nbytes());
  return ok_status();
}

std::int64_t slice_axis(const Node& n, std::size_t rank) {
  std::int64_t a = n.attrs.get_int_or("axis", 0);
  return a < 0 ? a + static_cast<std::int64_t>(rank) : a;
}

template <typename I>
Status gather_rows(const Tensor& table, const Tensor& ids, Tensor& out, const Node& node) {
  std::int64_t rows = table.dim(0), d = table.dim(1), m = ids.numel();
  std::size_t row_bytes = static_cast<std::size_t>(d) * dtype_size(table.dtype());
  const I* id = ids.data<I>();
  for (std::int64_t i = 0; i < m; ++i) {
    auto k = static_cast<std::int64_t>(id[i]);
    if (k < 0 || k >= rows)
      return out_of_range("{}: id {} at position {} is outside the table's {} rows", node.label(), k, i, rows);
    std::memcpy(static_cast<char*>(out.raw_data()) + static_cast<std::size_t>(i) * row_bytes,
                static_cast<const char*>(table.raw_data()) + static_cast<std::size_t>(k) * row_bytes, row_bytes);
  }
  return ok_status();
}

template <typename I, typename T>
Status scatter_rows(const Tensor& ids, const Tensor& dy, Tensor& out, const Node& node) {
  std::int64_t rows = out.dim(0), d = out.dim(1), m = ids.numel();
  T* po = out.data<T>();
  const T* pd = dy.data<T>();
  std::fill(po, po + out.numel(), T(0));
  const I* id = ids.data<I>();
  for (std::int64_t i = 0; i < m; ++i) {
    auto k = static_cast<std::int64_t>(id[i]);
    if (k < 0 || k >= rows)
      return out_of_range("{}: id {} at position {} is outside the table's {} rows", node.label(), k, i, rows);
    for (std::int64_t j = 0; j < d; ++j) po[k * d + j] += pd[i * d + j];
  }
  return ok_status();
}

}  // namespace

void register_shape_ops(KernelRegistry& r) {
  for (const char* op : {"reshape", "flatten"}) {
    r.add(op, [](const Node&, const Inputs&) {
      return make_fn([](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
        return copy_bytes(x[0], y[0]);
      });
    });
  }
  r.add("transpose", [](const Node& n, const Inputs&) {
    auto p = n.attrs.get_ints_or("perm", {});
    std::vector<int> perm(p.begin(), p.end());
    return make_fn([perm](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      auto v = x[0].transpose(perm);
      if (!v.ok()) return v.status();
      return y[0].copy_from(*v);
    });
  });
  r.add("concat", [](const Node& n, const Inputs& in) {
    std::int64_t ax = slice_axis(n, in[0].shape.size());
    return make_fn([ax](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      std::int64_t start = 0;
      for (const Tensor& t : x) {
        auto dst = y[0].slice(static_cast<int>(ax), start, start + t.dim(static_cast<int>(ax)));
        if (!dst.ok()) return dst.status();
        SHOAL_RETURN_IF_ERROR(dst->copy_from(t));
        start += t.dim(static_cast<int>(ax));
      }
      return ok_status();
    });
  });
  r.add("slice", [](const Node& n, const Inputs& in) {
    int ax = static_cast<int>(slice_axis(n, in[0].shape.size()));
    std::int64_t s = n.attrs.get_int_or("start", 0), e = n.attrs.get_int_or("end", in[0].shape[ax]);
    std::int64_t st = n.attrs.get_int_or("step", 1);
    return make_fn([=](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      auto v = x[0].slice(ax, s, e, st);
      if (!v.ok()) return v.status();
      return y[0].copy_from(*v);
    });
  });
  r.add("slice_scatter", [](const Node& n, const Inputs& in) {
    Shape full = n.attrs.get_ints_or("shape", {});
    int ax = static_cast<int>(slice_axis(n, full.size()));
    std::int64_t s = n.attrs.get_int_or("start", 0), e = n.attrs.get_int_or("end", full[ax]);
    std::int64_t st = n.attrs.get_int_or("step", 1);
    (void)in;
    return make_fn([=](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      std::memset(y[0].raw_data(), 0, y[0].nbytes());
      auto v = y[0].slice(ax, s, e, st);
      if (!v.ok()) return v.status();
      return v->copy_from(x[0]);
    });
  });
  r.add("embedding", [](const Node&, const Inputs&) {
    return make_fn([](const KernelContext& c, std::span<const Tensor> x, std::span<Tensor> y) {
      if (x[1].dtype() == DType::kI32) return gather_rows<std::int32_t>(x[0], x[1], y[0], c.node);
      return gather_rows<std::int64_t>(x[0], x[1], y[0], c.node);
    });
  });
  r.add("embedding_grad", [](const Node&, const Inputs&) {
    return make_fn([](const KernelContext& c, std::span<const Tensor> x, std::span<Tensor> y) {
      return dispatch_float(x[1].dtype(), [&](auto tag) {
        using T = decltype(tag);
        if (x[0].dtype() == DType::kI32) return scatter_rows<std::int32_t, T>(x[0], x[1], y[0], c.node);
        return scatter_rows<std::int64_t, T>(x[0], x[1], y[0], c.node);
      });
    });
  });
}

}  // namespace shoal::runtime::cpu
