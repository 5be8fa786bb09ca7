// Reductions, broadcasting and layout ops (reshape, transpose, concat,
// slice), and the embedding lookup.
#include "graph/ops_internal.h"

namespace shoal::graph::ops_detail {

void register_reduce_ops(OpRegistry& r) {
  for (std::string name : {"reduce_sum", "reduce_mean", "reduce_max"}) {
    OpDef d;
    d.name = name;
    d.attrs = {"axes", "keepdims"};
    if (name == "reduce_sum") d.attrs.push_back("dst");
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      // dst f32: a sum of bf16 in f32 (a bias gradient --precision bf16
      // left reading the bf16 gradient its products read).
      const bool widen = n.attrs.get_string_or("dst", "") == "f32";
      if (n.attrs.has("dst") && (!widen || in[0].dtype != DType::kBF16))
        return invalid_argument("dst {} for a {} input: only f32 from bf16",
                                n.attrs.get_string_or("dst", ""), in[0].str());
      if (!widen) SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
      SHOAL_ASSIGN_OR_RETURN(auto axes,
                             norm_axes(n.attrs.get_ints_or("axes", {}), in[0].shape.size()));
      bool keep = n.attrs.get_int_or("keepdims", 0) != 0;
      Shape s;
      for (std::size_t i = 0; i < in[0].shape.size(); ++i) {
        bool red = std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(i)) != axes.end();
        if (!red)
          s.push_back(in[0].shape[i]);
        else if (keep)
          s.push_back(1);
      }
      return Types{{widen ? DType::kF32 : in[0].dtype, s}};
    };
    if (name == "reduce_sum") {
      d.grad = GRAD { return {expand_back(g.b, DY, SHAPE_OF(0), g.node)}; };
    } else if (name == "reduce_mean") {
      d.grad = GRAD {
        double cnt = static_cast<double>(num_elements(SHAPE_OF(0))) /
                     static_cast<double>(std::max<std::int64_t>(num_elements(g.b.shape(Y(0))), 1));
        return {g.b.mul(expand_back(g.b, DY, SHAPE_OF(0), g.node), g.b.scalar_like(1.0 / cnt, DY))};
      };
    } else {
      d.grad = GRAD {
        // Ties share the gradient equally.
        Value yb = expand_back(g.b, Y(0), SHAPE_OF(0), g.node);
        Value mask = g.b.op("equal", {X(0), yb});
        Attrs ra = g.node.attrs;
        Value cnt = g.b.op("reduce_sum", {mask}, ra);
        Value share = g.b.div(DY, cnt);
        return {g.b.mul(mask, expand_back(g.b, share, SHAPE_OF(0), g.node))};
      };
    }
    r.add(d);
  }
}

void register_layout_ops(OpRegistry& r) {
  {
    OpDef d;
    d.name = "broadcast";
    d.attrs = {"shape"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(Shape s, n.attrs.get_ints("shape"));
      auto bs = broadcast_shapes(in[0].shape, s);
      if (!bs.ok() || *bs != s) return invalid_argument("cannot broadcast to {}", shape_str(s));
      return Types{{in[0].dtype, s}};
    };
    d.grad = GRAD { return {reduce_to(g.b, DY, SHAPE_OF(0))}; };
    r.add(d);
    d.name = "sum_to";
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
      SHOAL_ASSIGN_OR_RETURN(Shape s, n.attrs.get_ints("shape"));
      auto bs = broadcast_shapes(s, in[0].shape);
      if (!bs.ok() || *bs != in[0].shape || s.size() > in[0].shape.size())
        return invalid_argument("cannot sum to {}", shape_str(s));
      return Types{{in[0].dtype, s}};
    };
    d.grad = GRAD { return {g.b.broadcast(DY, SHAPE_OF(0))}; };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "reshape";
    d.attrs = {"shape"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(Shape s, n.attrs.get_ints("shape"));
      std::int64_t known = 1;
      int infer = -1;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == -1 && infer < 0)
          infer = static_cast<int>(i);
        else if (s[i] < 0)
          return invalid_argument("bad target shape {}", shape_str(s));
        else
          known *= s[i];
      }
      std::int64_t total = num_elements(in[0].shape);
      if (infer >= 0) {
        if (known == 0 || total % known != 0)
          return invalid_argument("cannot infer -1 in {}", shape_str(s));
        s[infer] = total / known;
      }
      if (num_elements(s) != total)
        return invalid_argument("{} elements cannot be viewed as {}", total, shape_str(s));
      return Types{{in[0].dtype, s}};
    };
    d.grad = GRAD { return {g.b.reshape(DY, SHAPE_OF(0))}; };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "flatten";
    d.attrs = {"start_dim"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(auto sd,
                             norm_axis(n.attrs.get_int_or("start_dim", 1), in[0].shape.size()));
      Shape s(in[0].shape.begin(), in[0].shape.begin() + sd);
      std::int64_t rest = 1;
      for (std::size_t i = static_cast<std::size_t>(sd); i < in[0].shape.size(); ++i)
        rest *= in[0].shape[i];
      s.push_back(rest);
      return Types{{in[0].dtype, s}};
    };
    d.grad = GRAD { return {g.b.reshape(DY, SHAPE_OF(0))}; };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "transpose";
    d.attrs = {"perm"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(auto perm, n.attrs.get_ints("perm"));
      if (perm.size() != in[0].shape.size())
        return invalid_argument("perm has {} entries", perm.size());
      std::vector<bool> seen(perm.size());
      Shape s;
      for (auto p : perm) {
        if (p < 0 || p >= static_cast<std::int64_t>(perm.size()) || seen[p])
          return invalid_argument("perm is not a permutation");
        seen[p] = true;
        s.push_back(in[0].shape[p]);
      }
      return Types{{in[0].dtype, s}};
    };
    d.grad = GRAD {
      auto perm = *g.node.attrs.get_ints("perm");
      std::vector<std::int64_t> inv(perm.size());
      for (std::size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<std::int64_t>(i);
      return {g.b.transpose(DY, inv)};
    };
    r.add(d);
  }
  {
    OpDef d;
    d.name = "concat";
    d.max_inputs = -1;
    d.attrs = {"axis"};
    d.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(auto ax, norm_axis(n.attrs.get_int_or("axis", 0), in[0].shape.size()));
      Shape s = in[0].shape;
      for (std::size_t i = 1; i < in.size(); ++i) {
        if (in[i].dtype != in[0].dtype || in[i].shape.size() != s.size())
          return invalid_argument("input {} ({}) does not match input 0", i, in[i].str());
        for (std::size_t k = 0; k < s.size(); ++k)
          if (static_cast<std::int64_t>(k) != ax && in[i].shape[k] != s[k])
            return invalid_argument("input {} differs in dim {}", i, k);
        s[ax] += in[i].shape[ax];
      }
      return Types{{in[0].dtype, s}};
    };
    d.grad = GRAD {
      std::int64_t ax = *norm_axis(g.node.attrs.get_int_or("axis", 0), SHAPE_OF(0).size());
      std::vector<Value> out;
      std::int64_t start = 0;
      for (std::size_t i = 0; i < g.node.inputs.size(); ++i) {
        std::int64_t len = g.b.shape(X(i))[ax];
        out.push_back(g.b.slice(DY, ax, start, start + len));
        start += len;
      }
      return out;
    };
    r.add(d);
  }
  {
    auto slice_shape = [](const Node& n, const Shape& in) -> Result<Shape> {
      SHOAL_ASSIGN_OR_RETURN(auto ax, norm_axis(n.attrs.get_int_or("axis", 0), in.size()));
      std::int64_t start = n.attrs.get_int_or("start", 0), end = n.attrs.get_int_or("end", in[ax]);
      std::int64_t step = n.attrs.get_int_or("step", 1);
      if (step < 1 || start < 0 || end > in[ax] || start > end)
        return invalid_argument("need 0 <= start ({}) <= end ({}) <= {} and step >= 1", start, end,
                                in[ax]);
      Shape s = in;
      s[ax] = (end - start + step - 1) / step;
      return s;
    };
    OpDef d;
    d.name = "slice";
    d.attrs = {"axis", "start", "end", "step"};
    d.infer = [slice_shape](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(Shape s, slice_shape(n, in[0].shape));
      return Types{{in[0].dtype, s}};
    };
    d.grad = GRAD {
      Attrs a = g.node.attrs;
      a.set("shape", SHAPE_OF(0));
      return {g.b.op("slice_scatter", {DY}, a)};
    };
    r.add(d);
    OpDef sc;
    sc.name = "slice_scatter";  // zeros of `shape` with the input placed at the slice
    sc.attrs = {"axis", "start", "end", "step", "shape"};
    sc.infer = [slice_shape](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(Shape full, n.attrs.get_ints("shape"));
      SHOAL_ASSIGN_OR_RETURN(Shape s, slice_shape(n, full));
      if (s != in[0].shape) return invalid_argument("input must be {}", shape_str(s));
      return Types{{in[0].dtype, full}};
    };
    sc.grad = GRAD {
      Attrs a = g.node.attrs;
      Attrs sa;
      for (const char* k : {"axis", "start", "end", "step"})
        if (a.has(k)) sa.set(k, a.all().at(k));
      return {g.b.op("slice", {DY}, sa)};
    };
    r.add(sc);
    // Zeros of `shape` with input k added at its slice (starts[k], ends[k],
    // steps[k]) along `axis`: the CPU backend's fusion of an add tree of
    // slice_scatters (compile_passes.cc), one pass over the result where
    // each scatter and add made one or two.
    OpDef ss;
    ss.name = "slice_scatter_sum";
    ss.max_inputs = -1;
    ss.attrs = {"axis", "shape", "starts", "ends", "steps"};
    ss.infer = [slice_shape](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(Shape full, n.attrs.get_ints("shape"));
      SHOAL_ASSIGN_OR_RETURN(auto starts, n.attrs.get_ints("starts"));
      SHOAL_ASSIGN_OR_RETURN(auto ends, n.attrs.get_ints("ends"));
      SHOAL_ASSIGN_OR_RETURN(auto steps, n.attrs.get_ints("steps"));
      if (starts.size() != in.size() || ends.size() != in.size() || steps.size() != in.size())
        return invalid_argument(
            "starts, ends and steps need one entry per input ({}), not {}, {}, {}", in.size(),
            starts.size(), ends.size(), steps.size());
      for (std::size_t k = 0; k < in.size(); ++k) {
        Node one = n;
        one.attrs.set("start", starts[k]);
        one.attrs.set("end", ends[k]);
        one.attrs.set("step", steps[k]);
        SHOAL_ASSIGN_OR_RETURN(Shape s, slice_shape(one, full));
        if (s != in[k].shape || in[k].dtype != in[0].dtype)
          return invalid_argument("input {} must be {}, not {}", k,
                                  TensorType{in[0].dtype, s}.str(), in[k].str());
      }
      return Types{{in[0].dtype, full}};
    };
    ss.grad = GRAD {
      const Attrs& a = g.node.attrs;
      const auto starts = *a.get_ints("starts"), ends = *a.get_ints("ends"),
                 steps = *a.get_ints("steps");
      std::vector<Value> out;
      for (std::size_t k = 0; k < starts.size(); ++k)
        out.push_back(g.b.slice(DY, a.get_int_or("axis", 0), starts[k], ends[k], steps[k]));
      return out;
    };
    r.add(ss);
  }
}

void register_embedding_ops(OpRegistry& r) {
  {
    // With attr `vocab` > 0 the table is a shard of a vocabulary of that
    // size, holding its rows [offset, offset + rows): other ids (within the
    // vocabulary) give zero rows, and their gradient goes elsewhere
    // (tensor parallelism's vocabulary-parallel embedding).
    OpDef d;
    d.name = "embedding";
    d.min_inputs = d.max_inputs = 2;
    d.attrs = {"offset", "vocab"};
    d.infer = [](const Node&, const Types& in) -> InferResult {
      SHOAL_RETURN_IF_ERROR(need_float(in[0], 0));
      if (in[0].shape.size() != 2) return invalid_argument("table must be [rows, dim]");
      if (in[1].dtype != DType::kI32 && in[1].dtype != DType::kI64)
        return invalid_argument("ids must be i32 or i64");
      Shape s = in[1].shape;
      s.push_back(in[0].shape[1]);
      return Types{{in[0].dtype, s}};
    };
    d.grad = GRAD {
      return {g.b.op("embedding_grad", {X(1), DY},
                     {{"rows", SHAPE_OF(0)[0]},
                      {"offset", g.node.attrs.get_int_or("offset", 0)},
                      {"vocab", g.node.attrs.get_int_or("vocab", 0)}}),
              Value{}};
    };
    r.add(d);
    OpDef gd;
    gd.name = "embedding_grad";  // scatter-add dy rows into a [rows, dim] table
    gd.min_inputs = gd.max_inputs = 2;
    gd.attrs = {"rows", "offset", "vocab"};
    gd.infer = [](const Node& n, const Types& in) -> InferResult {
      SHOAL_ASSIGN_OR_RETURN(std::int64_t rows, n.attrs.get_int("rows"));
      SHOAL_RETURN_IF_ERROR(need_float(in[1], 1));
      if (in[1].shape.empty()) return invalid_argument("dy must have rank >= 1");
      return Types{{in[1].dtype, {rows, in[1].shape.back()}}};
    };
    r.add(gd);
  }
}

}  // namespace shoal::graph::ops_detail
