// Shape and data-movement operators. Each folds on the host when its data
// input is known at import (the exporters' Shape -> Gather -> Unsqueeze ->
// Concat chains), else emits graph ops; shapes and indices must be known.
#include <numeric>

#include "onnx/context.h"

namespace shoal::onnx {

using graph::Value;

Value pad_axes(graph::Builder& b, Value x, const std::vector<std::int64_t>& begin,
               const std::vector<std::int64_t>& end, double value) {
  for (std::size_t i = 0; i < begin.size(); ++i) {
    auto axis = static_cast<std::int64_t>(i);
    for (int side = 0; side < 2; ++side) {
      std::int64_t p = side == 0 ? begin[i] : end[i];
      std::int64_t dim = b.shape(x)[i];
      if (p < 0) {
        x = side == 0 ? b.slice(x, axis, -p, dim) : b.slice(x, axis, 0, dim + p);
      } else if (p > 0) {
        Shape s = b.shape(x);
        s[i] = p;
        Value fill = b.constant(Tensor::full(s, b.dtype_of(x), value));
        x = side == 0 ? b.concat({fill, x}, axis) : b.concat({x, fill}, axis);
      }
    }
  }
  return x;
}

namespace {

// Output the input reshaped: a folded tensor when known, else a graph op.
Status reshaped(Ctx& c, const Shape& to) {
  if (const Tensor* k = c.known(0)) {
    auto r = k->contiguous().reshape(to);
    if (!r.ok()) return c.fail("{}", r.status().message());
    c.out_known(0, *r);
    return ok_status();
  }
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  c.out(0, c.b().reshape(x, to));
  return ok_status();
}

Status reshape(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(auto in, c.type(0));
  SHOAL_ASSIGN_OR_RETURN(auto want, c.ints(1));
  bool allow_zero = c.attr_i("allowzero", 0) != 0;
  Shape to(want.begin(), want.end());
  int infer = -1;
  for (std::size_t i = 0; i < to.size(); ++i) {
    if (to[i] == 0 && !allow_zero) {
      if (i >= in.shape.size()) return c.fail("dim {} is 0 (copy) past the input's rank", i);
      to[i] = in.shape[i];
    } else if (to[i] == -1) {
      if (infer >= 0) return c.fail("more than one -1 in shape {}", fmt::join(want, ","));
      infer = static_cast<int>(i);
    }
  }
  if (infer >= 0) {
    to[static_cast<std::size_t>(infer)] = 1;
    std::int64_t rest = num_elements(to);
    if (rest == 0 || num_elements(in.shape) % rest != 0)
      return c.fail("cannot reshape {} into {}", fmt::join(in.shape, "x"), fmt::join(want, ","));
    to[static_cast<std::size_t>(infer)] = num_elements(in.shape) / rest;
  }
  return reshaped(c, to);
}

Status flatten(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(auto in, c.type(0));
  const Shape& s = in.shape;
  std::int64_t ax = c.attr_i("axis", 1);
  if (ax < 0) ax += static_cast<std::int64_t>(s.size());
  if (ax < 0 || ax > static_cast<std::int64_t>(s.size())) return c.fail("axis out of range");
  Shape lead(s.begin(), s.begin() + ax), tail(s.begin() + ax, s.end());
  return reshaped(c, {num_elements(lead), num_elements(tail)});
}

Result<std::vector<std::int64_t>> axes_of(Ctx& c, int input) {
  if (c.has_input(input)) return c.ints(input);
  return c.attr_ints("axes");
}

Status squeeze(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(auto in, c.type(0));
  SHOAL_ASSIGN_OR_RETURN(auto axes, axes_of(c, 1));
  std::vector<bool> drop(in.shape.size(), false);
  for (auto a : axes) {
    SHOAL_ASSIGN_OR_RETURN(std::int64_t ax, norm_axis(c, a, in.shape.size()));
    if (in.shape[static_cast<std::size_t>(ax)] != 1) return c.fail("axis {} is not 1", a);
    drop[static_cast<std::size_t>(ax)] = true;
  }
  Shape to;
  for (std::size_t i = 0; i < in.shape.size(); ++i)
    if (!(axes.empty() ? in.shape[i] == 1 : drop[i])) to.push_back(in.shape[i]);
  return reshaped(c, to);
}

Status unsqueeze(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(auto in, c.type(0));
  SHOAL_ASSIGN_OR_RETURN(auto axes, axes_of(c, 1));
  std::size_t rank = in.shape.size() + axes.size();
  std::vector<bool> added(rank, false);
  for (auto a : axes) {
    SHOAL_ASSIGN_OR_RETURN(std::int64_t ax, norm_axis(c, a, rank));
    if (added[static_cast<std::size_t>(ax)]) return c.fail("axis {} given twice", a);
    added[static_cast<std::size_t>(ax)] = true;
  }
  Shape to;
  auto it = in.shape.begin();
  for (std::size_t i = 0; i < rank; ++i) to.push_back(added[i] ? 1 : *it++);
  return reshaped(c, to);
}

Status transpose(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  std::size_t r = c.b().shape(x).size();
  std::vector<std::int64_t> perm(r);
  for (std::size_t i = 0; i < r; ++i) perm[i] = static_cast<std::int64_t>(r - 1 - i);
  perm = c.attr_ints("perm", perm);
  c.out(0, c.b().transpose(x, perm));
  return ok_status();
}

// Index arithmetic for host folds: a tensor seen as [outer, dim, inner] at `axis`.
struct Split3 {
  std::int64_t outer = 1, dim = 1, inner = 1;
};
Split3 split3(const Shape& s, std::size_t axis) {
  Split3 r;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i < axis) r.outer *= s[i];
    if (i == axis) r.dim = s[i];
    if (i > axis) r.inner *= s[i];
  }
  return r;
}

Status concat(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(auto t0, c.type(0));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t ax, norm_axis(c, c.attr_i("axis", 0), t0.shape.size()));
  bool all_known = true;
  for (int i = 0; i < c.num_inputs(); ++i) all_known = all_known && c.known(i);
  if (all_known && !is_floating(t0.dtype)) {
    Shape s = t0.shape;
    s[static_cast<std::size_t>(ax)] = 0;
    for (int i = 0; i < c.num_inputs(); ++i)
      s[static_cast<std::size_t>(ax)] += c.known(i)->dim(static_cast<int>(ax));
    Tensor out = Tensor::empty(s, t0.dtype);
    Split3 o = split3(s, static_cast<std::size_t>(ax));
    std::int64_t at = 0;
    for (int i = 0; i < c.num_inputs(); ++i) {
      const Tensor& k = *c.known(i);
      Split3 p = split3(k.shape(), static_cast<std::size_t>(ax));
      for (std::int64_t a = 0; a < p.outer; ++a)
        for (std::int64_t d = 0; d < p.dim; ++d)
          for (std::int64_t e = 0; e < p.inner; ++e)
            out.set((a * o.dim + at + d) * o.inner + e, k.get((a * p.dim + d) * p.inner + e));
      at += p.dim;
    }
    c.out_known(0, std::move(out));
    return ok_status();
  }
  std::vector<Value> xs;
  for (int i = 0; i < c.num_inputs(); ++i) {
    SHOAL_ASSIGN_OR_RETURN(Value v, c.in(i));
    xs.push_back(v);
  }
  c.out(0, c.b().concat(xs, ax));
  return ok_status();
}

// Gathers along `axis` with known indices: on the host when the data is
// known, else one slice per index (exported models gather a few rows of
// a shape or a position) or, for a 2-D table on axis 0, Shoal's embedding.
Status gather(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(auto in, c.type(0));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t ax, norm_axis(c, c.attr_i("axis", 0), in.shape.size()));
  auto axu = static_cast<std::size_t>(ax);
  const Tensor* kidx = c.known(1);
  if (!kidx) {
    SHOAL_ASSIGN_OR_RETURN(Value table, c.in(0));
    SHOAL_ASSIGN_OR_RETURN(Value ids, c.in(1));
    if (ax != 0 || in.shape.size() != 2)
      return c.fail("gathering computed indices works on a 2-D table along axis 0 only");
    c.out(0, c.b().embedding(table, c.b().cast(ids, DType::kI32)));
    return ok_status();
  }
  std::vector<std::int64_t> idx = kidx->to_vector<std::int64_t>();
  for (auto& i : idx) {
    if (i < -in.shape[axu] || i >= in.shape[axu])
      return c.fail("index {} is out of range for dim {} of size {}", i, ax, in.shape[axu]);
    if (i < 0) i += in.shape[axu];
  }
  Shape out_shape(in.shape.begin(), in.shape.begin() + ax);
  for (auto d : kidx->shape()) out_shape.push_back(d);
  out_shape.insert(out_shape.end(), in.shape.begin() + ax + 1, in.shape.end());
  if (const Tensor* k = c.known(0)) {
    Split3 p = split3(in.shape, axu);
    Tensor out = Tensor::empty(out_shape, in.dtype);
    auto n = static_cast<std::int64_t>(idx.size());
    for (std::int64_t a = 0; a < p.outer; ++a)
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t e = 0; e < p.inner; ++e)
          out.set((a * n + j) * p.inner + e, k->get((a * p.dim + idx[j]) * p.inner + e));
    c.out_known(0, std::move(out));
    return ok_status();
  }
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  std::vector<Value> parts;
  for (auto i : idx) parts.push_back(c.b().slice(x, ax, i, i + 1));
  Value y = parts.size() == 1 ? parts[0] : c.b().concat(parts, ax);
  c.out(0, c.b().reshape(y, out_shape));
  return ok_status();
}

struct SliceAxis {
  std::int64_t axis, start, end, step;
};

// ONNX's clamping: positive steps to [0, dim], negative to [-1, dim - 1].
Result<std::vector<SliceAxis>> slice_axes(Ctx& c, const Shape& s) {
  std::vector<std::int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) {
    starts = c.attr_ints("starts"), ends = c.attr_ints("ends"), axes = c.attr_ints("axes");
  } else {
    SHOAL_ASSIGN_OR_RETURN(starts, c.ints(1));
    SHOAL_ASSIGN_OR_RETURN(ends, c.ints(2));
    if (c.has_input(3)) {
      SHOAL_ASSIGN_OR_RETURN(axes, c.ints(3));
    }
    if (c.has_input(4)) {
      SHOAL_ASSIGN_OR_RETURN(steps, c.ints(4));
    }
  }
  if (axes.empty())
    for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return c.fail("starts, ends, axes and steps differ in length");
  std::vector<SliceAxis> out;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    SHOAL_ASSIGN_OR_RETURN(std::int64_t ax, norm_axis(c, axes[i], s.size()));
    std::int64_t dim = s[static_cast<std::size_t>(ax)], st = steps[i];
    if (st == 0) return c.fail("step 0 on axis {}", ax);
    auto fix = [&](std::int64_t v) {
      if (v < 0) v += dim;
      return st > 0 ? std::clamp<std::int64_t>(v, 0, dim)
                    : std::clamp<std::int64_t>(v, -1, dim - 1);
    };
    out.push_back({ax, fix(starts[i]), fix(ends[i]), st});
  }
  return out;
}

Status slice(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(auto in, c.type(0));
  SHOAL_ASSIGN_OR_RETURN(auto axes, slice_axes(c, in.shape));
  if (const Tensor* k = c.known(0); k && !is_floating(in.dtype) && k->rank() == 1) {
    const SliceAxis& a = axes.at(0);
    std::vector<std::int64_t> v = k->to_vector<std::int64_t>(), out;
    for (std::int64_t i = a.start; a.step > 0 ? i < a.end : i > a.end; i += a.step)
      out.push_back(v[static_cast<std::size_t>(i)]);
    c.out_known(0,
                Tensor::from_vector(out, {static_cast<std::int64_t>(out.size())}).cast(in.dtype));
    return ok_status();
  }
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  for (const auto& a : axes) {
    if (a.step < 0) return c.fail("negative slice steps are not supported (axis {})", a.axis);
    x = c.b().slice(x, a.axis, a.start, std::max(a.start, a.end), a.step);
  }
  c.out(0, x);
  return ok_status();
}

Status split(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  Shape s = c.b().shape(x);
  SHOAL_ASSIGN_OR_RETURN(std::int64_t ax, norm_axis(c, c.attr_i("axis", 0), s.size()));
  std::vector<std::int64_t> sizes = c.attr_ints("split");
  if (c.has_input(1)) {
    SHOAL_ASSIGN_OR_RETURN(sizes, c.ints(1));
  }
  std::int64_t dim = s[static_cast<std::size_t>(ax)], n = c.num_outputs();
  if (sizes.empty()) {
    if (dim % n != 0) return c.fail("dim {} does not split into {} equal parts", dim, n);
    sizes.assign(static_cast<std::size_t>(n), dim / n);
  }
  if (static_cast<std::int64_t>(sizes.size()) != n ||
      std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0}) != dim)
    return c.fail("split sizes {} do not cover dim {} in {} outputs", fmt::join(sizes, ","), dim,
                  n);
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    c.out(static_cast<int>(i), c.b().slice(x, ax, at, at + sizes[static_cast<std::size_t>(i)]));
    at += sizes[static_cast<std::size_t>(i)];
  }
  return ok_status();
}

Status expand(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  SHOAL_ASSIGN_OR_RETURN(auto want, c.ints(1));
  Shape s = c.b().shape(x), to(std::max(s.size(), want.size()), 1);
  for (std::size_t i = 0; i < to.size(); ++i) {
    std::int64_t a = i + s.size() >= to.size() ? s[i + s.size() - to.size()] : 1;
    std::int64_t b = i + want.size() >= to.size() ? want[i + want.size() - to.size()] : 1;
    if (a != b && a != 1 && b != 1) return c.fail("cannot expand {} to {}", a, b);
    to[i] = a == 1 ? b : a;
  }
  c.out(0, c.b().broadcast(x, to));
  return ok_status();
}

Status shape(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(auto in, c.type(0));
  auto r = static_cast<std::int64_t>(in.shape.size());
  auto clampi = [r](std::int64_t v) { return std::clamp<std::int64_t>(v < 0 ? v + r : v, 0, r); };
  std::int64_t start = clampi(c.attr_i("start", 0)), end = clampi(c.attr_i("end", r));
  std::vector<std::int64_t> dims(in.shape.begin() + start, in.shape.begin() + std::max(start, end));
  c.out_known(0, Tensor::from_vector(dims, {static_cast<std::int64_t>(dims.size())}));
  return ok_status();
}

Status cast(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(DType to, dtype_of(static_cast<int>(c.attr_i("to", 1))));
  if (const Tensor* k = c.known(0)) {
    c.out_known(0, k->cast(to));
    return ok_status();
  }
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  c.out(0, c.b().dtype_of(x) == to ? x : c.b().cast(x, to));
  return ok_status();
}

Status identity(Ctx& c) {
  if (const Tensor* k = c.known(0)) {
    c.out_known(0, *k);
    return ok_status();
  }
  // Of a weight or statistic not bound yet: the same initializer under a
  // second name, so its consumer decides what it is (parameter or buffer).
  if (c.unbound_initializer(0)) {
    c.alias_output(0);
    return ok_status();
  }
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  c.out(0, x);
  return ok_status();
}

Status constant(Ctx& c) {
  if (const auto* a = c.attr("value")) {
    SHOAL_ASSIGN_OR_RETURN(Tensor t, from_proto(a->t()));
    c.out_known(0, std::move(t));
  } else if (const auto* f = c.attr("value_float")) {
    c.out_known(0, Tensor::scalar(f->f()));
  } else if (const auto* fs = c.attr("value_floats")) {
    std::vector<float> v(fs->floats().begin(), fs->floats().end());
    c.out_known(0, Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}));
  } else if (const auto* i = c.attr("value_int")) {
    c.out_known(0, Tensor::scalar(static_cast<double>(i->i()), DType::kI64));
  } else if (const auto* is = c.attr("value_ints")) {
    std::vector<std::int64_t> v(is->ints().begin(), is->ints().end());
    c.out_known(0, Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}));
  } else {
    return c.fail(
        "no value, value_float(s) or value_int(s) attribute (sparse and string "
        "constants are not supported)");
  }
  return ok_status();
}

// A tensor of the known shape filled with `value` (a one-element tensor;
// f32 0 by default): known at import, as every exported use of it is (a
// zero initial state, the ones an expand is compared against).
Status constant_of_shape(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(auto dims, c.ints(0));
  for (auto d : dims)
    if (d < 0) return c.fail("negative dimension {} in shape {}", d, fmt::join(dims, "x"));
  Tensor fill = Tensor::scalar(0.0);
  if (const auto* a = c.attr("value")) {
    SHOAL_ASSIGN_OR_RETURN(fill, from_proto(a->t()));
    if (fill.numel() != 1) return c.fail("value has {} elements, not one", fill.numel());
  }
  c.out_known(0, Tensor::full(Shape(dims.begin(), dims.end()), fill.dtype(), fill.get(0)));
  return ok_status();
}

// Equal of two tensors known at import (shape arithmetic, as torchvision's
// ViT builds for `expand(N, -1, -1)`); a comparison of computed values
// has no gradient, and no exported training graph has needed one.
Status equal(Ctx& c) {
  const Tensor *ka = c.known(0), *kb = c.known(1);
  if (!ka || !kb) return c.fail("only comparisons of values known at import are imported");
  Shape s = ka->rank() >= kb->rank() ? ka->shape() : kb->shape();
  auto ba = ka->broadcast_to(s), bb = kb->broadcast_to(s);
  if (!ba.ok() || !bb.ok())
    return c.fail("shapes {} and {} do not broadcast", fmt::join(ka->shape(), "x"),
                  fmt::join(kb->shape(), "x"));
  Tensor out = Tensor::empty(s, DType::kBool);
  for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, ba->get(i) == bb->get(i) ? 1 : 0);
  c.out_known(0, std::move(out));
  return ok_status();
}

Status where(Ctx& c) {
  const Tensor *kc = c.known(0), *ka = c.known(1), *kb = c.known(2);
  if (kc && ka && kb && !is_floating(ka->dtype())) {  // index arithmetic: on the host
    Shape s = kc->shape();
    for (const Tensor* t : {ka, kb})
      if (t->rank() > static_cast<int>(s.size())) s = t->shape();
    auto bc = kc->broadcast_to(s), ba = ka->broadcast_to(s), bb = kb->broadcast_to(s);
    if (!bc.ok() || !ba.ok() || !bb.ok()) return c.fail("inputs do not broadcast");
    Tensor out = Tensor::empty(s, ka->dtype());
    for (std::int64_t i = 0; i < out.numel(); ++i)
      out.set(i, bc->get(i) != 0 ? ba->get(i) : bb->get(i));
    c.out_known(0, std::move(out));
    return ok_status();
  }
  SHOAL_ASSIGN_OR_RETURN(Value cond, c.in(0));
  SHOAL_ASSIGN_OR_RETURN(Value a, c.in(1));
  SHOAL_ASSIGN_OR_RETURN(Value b, c.in(2));
  c.out(0, c.b().where(cond, a, b));
  return ok_status();
}

Status pad(Ctx& c) {
  std::string mode = c.attr_s("mode", "constant");
  if (mode != "constant") return c.fail("pad mode '{}' is not supported (only constant)", mode);
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  std::size_t r = c.b().shape(x).size();
  std::vector<std::int64_t> pads = c.attr_ints("pads");
  double value = c.attr_f("value", 0.0);
  if (c.opset() >= 11) {
    SHOAL_ASSIGN_OR_RETURN(pads, c.ints(1));
    if (c.has_input(2)) {
      const Tensor* v = c.known(2);
      if (!v) return c.fail("the constant value must be known at import");
      value = v->get(0);
    }
  }
  if (pads.size() != 2 * r) return c.fail("{} pads for rank {}", pads.size(), r);
  std::vector<std::int64_t> begin(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(r)),
      end(pads.begin() + static_cast<std::ptrdiff_t>(r), pads.end());
  c.out(0, pad_axes(c.b(), x, begin, end, value));
  return ok_status();
}

}  // namespace

void add_shape_ops(std::map<std::string, Converter>& t) {
  t["Reshape"] = reshape;
  t["Flatten"] = flatten;
  t["Squeeze"] = squeeze;
  t["Unsqueeze"] = unsqueeze;
  t["Transpose"] = transpose;
  t["Concat"] = concat;
  t["Gather"] = gather;
  t["Slice"] = slice;
  t["Split"] = split;
  t["Expand"] = expand;
  t["Shape"] = shape;
  t["Cast"] = cast;
  t["Identity"] = identity;
  t["Constant"] = constant;
  t["Where"] = where;
  t["ConstantOfShape"] = constant_of_shape;
  t["Equal"] = equal;
  t["Pad"] = pad;
}

}  // namespace shoal::onnx
