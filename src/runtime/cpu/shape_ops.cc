// Shape kernels: reshape, flatten, transpose, concat, slice, slice_scatter
// (and the sum of several), embedding lookups and their scatter-add gradient.
#include <cstring>

#include "runtime/cpu/kernels_internal.h"

namespace shoal::runtime::cpu {
namespace {

Status copy_bytes(const Tensor& from, Tensor& to) {
  if (from.nbytes() != to.nbytes())
    return internal_error("copy of {} bytes into {}", from.nbytes(), to.nbytes());
  if (from.nbytes() > 0) std::memcpy(to.raw_data(), from.raw_data(), from.nbytes());
  return ok_status();
}

// reshape and flatten: the same bytes under another shape. The planner
// places the output over the input where nothing else reads the input
// afterwards (a pack, cpu_backend.cc), and then there is nothing to copy.
class ViewKernel final : public Kernel {
 public:
  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    viewed_ = in[0].raw_data() == out[0].raw_data() && in[0].nbytes() == out[0].nbytes();
    return viewed_ ? ok_status() : copy_bytes(in[0], out[0]);
  }
  bool wants_packed_inputs() const override { return true; }
  // What the last run did ("copy" before any).
  const char* impl() const override { return viewed_ ? "view" : "copy"; }

 private:
  bool viewed_ = false;
};

std::int64_t slice_axis(const Node& n, std::size_t rank) {
  std::int64_t a = n.attrs.get_int_or("axis", 0);
  return a < 0 ? a + static_cast<std::int64_t>(rank) : a;
}

// Which row of a table (or of a vocabulary shard: attrs offset, vocab) id
// `k` reads: its index, -1 for an id another shard holds, or an error.
struct RowMap {
  std::int64_t rows, offset, vocab;
  RowMap(const Node& n, std::int64_t table_rows)
      : rows(table_rows),
        offset(n.attrs.get_int_or("offset", 0)),
        vocab(n.attrs.get_int_or("vocab", 0)) {}
  Result<std::int64_t> operator()(std::int64_t k, std::int64_t i, const Node& node) const {
    const std::int64_t limit = vocab > 0 ? vocab : rows;
    if (k < 0 || k >= limit)
      return out_of_range("{}: id {} at position {} is outside the {}'s {} rows", node.label(), k,
                          i, vocab > 0 ? "vocabulary" : "table", limit);
    if (vocab <= 0) return k;
    return k >= offset && k < offset + rows ? k - offset : -1;
  }
};

template <typename I>
Status gather_rows(const Tensor& table, const Tensor& ids, Tensor& out, const Node& node) {
  std::int64_t d = table.dim(1), m = ids.numel();
  const RowMap map(node, table.dim(0));
  std::size_t row_bytes = static_cast<std::size_t>(d) * dtype_size(table.dtype());
  const I* id = ids.data<I>();
  for (std::int64_t i = 0; i < m; ++i) {
    SHOAL_ASSIGN_OR_RETURN(std::int64_t k, map(static_cast<std::int64_t>(id[i]), i, node));
    char* dst = static_cast<char*>(out.raw_data()) + static_cast<std::size_t>(i) * row_bytes;
    if (k < 0)
      std::memset(dst, 0, row_bytes);
    else
      std::memcpy(
          dst, static_cast<const char*>(table.raw_data()) + static_cast<std::size_t>(k) * row_bytes,
          row_bytes);
  }
  return ok_status();
}

template <typename I, typename T>
Status scatter_rows(const Tensor& ids, const Tensor& dy, Tensor& out, const Node& node) {
  std::int64_t d = out.dim(1), m = ids.numel();
  const RowMap map(node, out.dim(0));
  T* po = out.data<T>();
  const T* pd = dy.data<T>();
  std::fill(po, po + out.numel(), T(0));
  const I* id = ids.data<I>();
  for (std::int64_t i = 0; i < m; ++i) {
    SHOAL_ASSIGN_OR_RETURN(std::int64_t k, map(static_cast<std::int64_t>(id[i]), i, node));
    if (k >= 0)
      for (std::int64_t j = 0; j < d; ++j) po[k * d + j] += pd[i * d + j];
  }
  return ok_status();
}

// n elements of T from s (stride ss) to d (stride ds), in elements.
template <typename T>
void strided_move(char* d, const char* s, std::int64_t n, std::int64_t ds, std::int64_t ss) {
  for (std::int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, s + i * ss * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
    std::memcpy(d + i * ds * static_cast<std::int64_t>(sizeof(T)), &v, sizeof(T));
  }
}

// `rows` rows of `bytes` each, row i from s + i * ss to d + i * ds: a
// constant-size move per 64 bytes where the rows are whole 64-byte
// multiples (attention's head splits: rows of 32 floats or bf16), not a
// memcpy call per row.
void move_rows(char* d, const char* s, std::int64_t rows, std::int64_t bytes, std::int64_t ds,
               std::int64_t ss) {
  if (bytes % 64 == 0) {
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t b = 0; b < bytes; b += 64) std::memcpy(d + i * ds + b, s + i * ss + b, 64);
  } else {
    for (std::int64_t i = 0; i < rows; ++i)
      std::memcpy(d + i * ds, s + i * ss, static_cast<std::size_t>(bytes));
  }
}

// slice_scatter_sum: the result as [outer, A, inner] around the axis (A
// its length), each input as [outer, L_k, inner]. Every position along the
// axis is written once per outer index: zeros where no input covers it,
// else the first covering input's row, the others added in input order.
// The per-position moves are planned once and merged into runs where
// source and destination are both contiguous (a GRU's gate gradients are
// three pieces of a row, inner = 1: a move per element ran 10x slower than
// the scatters and adds it replaced).
class SliceScatterSumKernel final : public Kernel {
 public:
  SliceScatterSumKernel(const Node& n, const Inputs& in) {
    const Shape full = n.attrs.get_ints_or("shape", {});
    const auto ax = static_cast<std::size_t>(slice_axis(n, full.size()));
    const auto starts = n.attrs.get_ints_or("starts", {}), steps = n.attrs.get_ints_or("steps", {});
    axis_ = full[ax];
    for (std::size_t k = 0; k < full.size(); ++k) {
      if (k < ax) outer_ *= full[k];
      if (k > ax) inner_ *= full[k];
    }
    std::vector<std::vector<std::pair<int, std::int64_t>>> cover(static_cast<std::size_t>(axis_));
    for (std::size_t k = 0; k < in.size(); ++k) {
      lens_.push_back(in[k].shape[ax]);
      for (std::int64_t j = 0; j < in[k].shape[ax]; ++j)
        cover[static_cast<std::size_t>(starts[k] + j * steps[k])].push_back(
            {static_cast<int>(k), j});
    }
    // Zeros, then first covers (copies), then the others (adds) by input:
    // each position's adds come after its copy, in input order.
    for (std::int64_t a = 0; a < axis_; ++a)
      if (cover[static_cast<std::size_t>(a)].empty()) push({Move::kZero, -1, 0, a, 1});
    for (std::int64_t a = 0; a < axis_; ++a)
      if (!cover[static_cast<std::size_t>(a)].empty()) {
        const auto [k, j] = cover[static_cast<std::size_t>(a)][0];
        push({Move::kCopy, k, j, a, 1});
      }
    for (std::size_t k = 0; k < in.size(); ++k)
      for (std::int64_t a = 0; a < axis_; ++a) {
        const auto& c = cover[static_cast<std::size_t>(a)];
        for (std::size_t i = 1; i < c.size(); ++i)
          if (c[i].first == static_cast<int>(k)) push({Move::kAdd, c[i].first, c[i].second, a, 1});
      }
  }

  Status run(const KernelContext&, std::span<const Tensor> in, std::span<Tensor> out) override {
    return dispatch_float(out[0].dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* y = out[0].data<T>();
      const std::int64_t inner = inner_;
#pragma omp parallel for if (outer_ > 1 && outer_ * axis_ * inner > kParallelGrain) schedule(static)
      for (std::int64_t o = 0; o < outer_; ++o)
        for (const Move& m : moves_) {
          T* d = y + (o * axis_ + m.at) * inner;
          const std::int64_t len = m.rows * inner;
          if (m.kind == Move::kZero) {
            std::fill(d, d + len, T(0));
            continue;
          }
          const T* s = in[static_cast<std::size_t>(m.input)].data<T>() +
                       (o * lens_[static_cast<std::size_t>(m.input)] + m.from) * inner;
          if (m.kind == Move::kCopy) {
            std::copy_n(s, len, d);
            continue;
          }
#pragma omp simd
          for (std::int64_t e = 0; e < len; ++e) d[e] += s[e];
        }
      return ok_status();
    });
  }

 private:
  struct Move {
    enum Kind { kZero, kCopy, kAdd } kind;
    int input;                    // -1 for zeros
    std::int64_t from, at, rows;  // input rows [from, from + rows) to result rows [at, ...)
  };
  // Appends m, or extends the last move where m continues it on both sides.
  void push(const Move& m) {
    if (!moves_.empty()) {
      Move& last = moves_.back();
      if (last.kind == m.kind && last.input == m.input && last.at + last.rows == m.at &&
          (m.kind == Move::kZero || last.from + last.rows == m.from)) {
        ++last.rows;
        return;
      }
    }
    moves_.push_back(m);
  }

  std::int64_t axis_ = 0, outer_ = 1, inner_ = 1;
  std::vector<std::int64_t> lens_;  // each input's length along the axis
  std::vector<Move> moves_;
};

}  // namespace

// Dense last axis: the last two axes are one loop of whole rows, the
// others an odometer over blocks of them; blocks split across threads
// when the copy is large.
void StridedCopy::dense_rows(const char* s, char* d) const {
  const int r = static_cast<int>(shape.size());
  const auto e = static_cast<std::int64_t>(elem);
  const std::int64_t bytes = shape[r - 1] * e, rows = shape[r - 2];
  const std::int64_t blocks = num_elements(shape) / (shape[r - 1] * rows);
  auto block = [&](std::int64_t b) {
    std::int64_t so = 0, dof = 0, rest = b;
    for (int k = r - 3; k >= 0; --k) {
      const std::int64_t i = rest % shape[k];
      rest /= shape[k];
      so += i * src_st[k];
      dof += i * dst_st[k];
    }
    move_rows(d + dof * e, s + so * e, rows, bytes, dst_st[r - 2] * e, src_st[r - 2] * e);
  };
#pragma omp parallel for if (blocks > 1 && num_elements(shape) > kParallelGrain) schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) block(b);
}

void StridedCopy::run(const void* src, void* dst) const {
  std::int64_t n = num_elements(shape);
  if (n == 0) return;
  const char* s = static_cast<const char*>(src) + src_off * static_cast<std::int64_t>(elem);
  char* d = static_cast<char*>(dst) + dst_off * static_cast<std::int64_t>(elem);
  int r = static_cast<int>(shape.size());
  if (r == 0) {
    std::memcpy(d, s, elem);
    return;
  }
  const bool dense = src_st[r - 1] == 1 && dst_st[r - 1] == 1;
  if (dense && r >= 2 && shape[r - 2] > 1) {
    dense_rows(s, d);
    return;
  }
  idx.assign(static_cast<std::size_t>(r), 0);
  std::int64_t inner = shape[r - 1], outer = n / inner;
  std::int64_t so = 0, dof = 0;
  const auto e = static_cast<std::int64_t>(elem);
  for (std::int64_t o = 0; o < outer; ++o) {
    if (dense) {
      std::memcpy(d + dof * e, s + so * e, static_cast<std::size_t>(inner * e));
    } else if (e == 4) {
      // A transpose's inner loop: typed strided moves, not a memcpy call per
      // element (a Mixer's token transposes ran at 1.7 ns per element).
      strided_move<std::uint32_t>(d + dof * e, s + so * e, inner, dst_st[r - 1], src_st[r - 1]);
    } else if (e == 2) {
      strided_move<std::uint16_t>(d + dof * e, s + so * e, inner, dst_st[r - 1], src_st[r - 1]);
    } else if (e == 8) {
      strided_move<std::uint64_t>(d + dof * e, s + so * e, inner, dst_st[r - 1], src_st[r - 1]);
    } else {
      for (std::int64_t i = 0; i < inner; ++i)
        std::memcpy(d + (dof + i * dst_st[r - 1]) * e, s + (so + i * src_st[r - 1]) * e, elem);
    }
    for (int k = r - 2; k >= 0; --k) {
      ++idx[k];
      so += src_st[k];
      dof += dst_st[k];
      if (idx[k] < shape[k]) break;
      so -= src_st[k] * shape[k];
      dof -= dst_st[k] * shape[k];
      idx[k] = 0;
    }
  }
}

namespace {
Result<std::unique_ptr<Kernel>> copy_kernel(StridedCopy c) {
  c.idx.reserve(c.shape.size());
  return make_fn([c](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
    c.run(x[0].raw_data(), y[0].raw_data());
    return ok_status();
  });
}
}  // namespace

void register_shape_ops(KernelRegistry& r) {
  for (const char* op : {"reshape", "flatten"}) {
    r.add(op, [](const Node&, const Inputs&) -> Result<std::unique_ptr<Kernel>> {
      return std::unique_ptr<Kernel>(std::make_unique<ViewKernel>());
    });
  }
  r.add("transpose", [](const Node& n, const Inputs& in) {
    auto perm = n.attrs.get_ints_or("perm", {});
    Shape cs = contiguous_strides(in[0].shape);
    StridedCopy c{n.outputs[0].shape,      {}, contiguous_strides(n.outputs[0].shape), 0, 0,
                  dtype_size(in[0].dtype), {}};
    for (auto p : perm) c.src_st.push_back(cs[static_cast<std::size_t>(p)]);
    return copy_kernel(std::move(c));
  });
  r.add("concat", [](const Node& n, const Inputs& in) {
    auto ax = static_cast<std::size_t>(slice_axis(n, in[0].shape.size()));
    Shape os = contiguous_strides(n.outputs[0].shape);
    std::vector<StridedCopy> parts;
    std::int64_t start = 0;
    for (const TensorType& t : in) {
      parts.push_back(
          {t.shape, contiguous_strides(t.shape), os, 0, start * os[ax], dtype_size(t.dtype), {}});
      parts.back().idx.reserve(t.shape.size());
      start += t.shape[ax];
    }
    return make_fn([parts](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      for (std::size_t i = 0; i < parts.size(); ++i) parts[i].run(x[i].raw_data(), y[0].raw_data());
      return ok_status();
    });
  });
  r.add("slice", [](const Node& n, const Inputs& in) {
    int ax = static_cast<int>(slice_axis(n, in[0].shape.size()));
    std::int64_t s = n.attrs.get_int_or("start", 0), e = n.attrs.get_int_or("end", in[0].shape[ax]);
    std::int64_t st = n.attrs.get_int_or("step", 1);
    (void)e;
    Shape cs = contiguous_strides(in[0].shape);
    StridedCopy c{
        n.outputs[0].shape,      cs, contiguous_strides(n.outputs[0].shape), s * cs[ax], 0,
        dtype_size(in[0].dtype), {}};
    c.src_st[ax] *= st;
    return copy_kernel(std::move(c));
  });
  r.add("slice_scatter", [](const Node& n, const Inputs& in) {
    Shape full = n.attrs.get_ints_or("shape", {});
    int ax = static_cast<int>(slice_axis(n, full.size()));
    std::int64_t s = n.attrs.get_int_or("start", 0), e = n.attrs.get_int_or("end", full[ax]);
    std::int64_t st = n.attrs.get_int_or("step", 1);
    (void)e;
    Shape fs = contiguous_strides(full);
    StridedCopy c{in[0].shape, contiguous_strides(in[0].shape), fs, 0,
                  s * fs[ax],  dtype_size(in[0].dtype),         {}};
    c.dst_st[ax] *= st;
    c.idx.reserve(full.size());
    return make_fn([c](const KernelContext&, std::span<const Tensor> x, std::span<Tensor> y) {
      std::memset(y[0].raw_data(), 0, y[0].nbytes());
      c.run(x[0].raw_data(), y[0].raw_data());
      return ok_status();
    });
  });
  r.add("slice_scatter_sum",
        [](const Node& n, const Inputs& in) -> Result<std::unique_ptr<Kernel>> {
          return std::unique_ptr<Kernel>(std::make_unique<SliceScatterSumKernel>(n, in));
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
        if (x[0].dtype() == DType::kI32)
          return scatter_rows<std::int32_t, T>(x[0], x[1], y[0], c.node);
        return scatter_rows<std::int64_t, T>(x[0], x[1], y[0], c.node);
      });
    });
  });
}

}  // namespace shoal::runtime::cpu
