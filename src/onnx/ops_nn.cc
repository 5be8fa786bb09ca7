// Convolution (and its transpose), pooling, normalization and dropout. Shoal's conv and pool
// ops take symmetric 2-D padding; ONNX's asymmetric pads, auto_pad and
// ceil_mode become an explicit pad of the input (zeros for conv and
// average pooling, the lowest float for max pooling), 1-D inputs a
// height-1 image, and a 3-D convolution 2-D ones over its depth taps.
#include <cfloat>
#include <cmath>

#include "onnx/context.h"

namespace shoal::onnx {

using graph::Value;

namespace {

struct Window {
  std::vector<std::int64_t> kernel, stride, dilation, begin, end;  // per spatial dim
};

// Kernel, strides, dilations and pads of a conv/pool node for `spatial`
// input dims, with auto_pad resolved and ceil_mode turned into end padding.
Result<Window> window_of(const Ctx& c, const Shape& xs, const Shape& kernel) {
  std::size_t n = kernel.size();
  Window w;
  w.kernel = kernel;
  w.stride = c.attr_ints("strides", std::vector<std::int64_t>(n, 1));
  w.dilation = c.attr_ints("dilations", std::vector<std::int64_t>(n, 1));
  auto pads = c.attr_ints("pads", std::vector<std::int64_t>(2 * n, 0));
  if (w.stride.size() != n || w.dilation.size() != n || pads.size() != 2 * n)
    return c.fail("strides, dilations and pads must cover {} spatial dims", n);
  w.begin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(n));
  w.end.assign(pads.begin() + static_cast<std::ptrdiff_t>(n), pads.end());
  std::string ap = c.attr_s("auto_pad", "NOTSET");
  bool ceil = c.attr_i("ceil_mode", 0) != 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t in = xs[2 + i], k = (kernel[i] - 1) * w.dilation[i] + 1, s = w.stride[i];
    if (ap == "VALID") {
      w.begin[i] = w.end[i] = 0;
    } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      std::int64_t out = (in + s - 1) / s;
      std::int64_t total = std::max<std::int64_t>(0, (out - 1) * s + k - in);
      w.begin[i] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.end[i] = total - w.begin[i];
    } else if (ap != "NOTSET") {
      return c.fail("auto_pad '{}' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER", ap);
    }
    if (ceil) {
      std::int64_t span = in + w.begin[i] + w.end[i] - k;
      std::int64_t out = (span + s - 1) / s + 1;
      // The last window must start inside the input or its left padding.
      if ((out - 1) * s >= in + w.begin[i]) --out;
      w.end[i] += std::max<std::int64_t>(0, (out - 1) * s + k - (in + w.begin[i] + w.end[i]));
    }
  }
  return w;
}

// Pads the spatial dims (after N and C) by the window's begin/end.
Value pad_spatial(graph::Builder& b, Value x, const Window& w, double value) {
  std::vector<std::int64_t> begin = {0, 0}, end = {0, 0};
  begin.insert(begin.end(), w.begin.begin(), w.begin.end());
  end.insert(end.end(), w.end.begin(), w.end.end());
  return pad_axes(b, x, begin, end, value);
}

bool symmetric(const Window& w) { return w.begin == w.end; }

// 1-D inputs become height-1 images; returns the 4-D value.
Value as_2d(graph::Builder& b, Value x) {
  Shape s = b.shape(x);
  if (s.size() != 3) return x;
  return b.reshape(x, {s[0], s[1], 1, s[2]});
}

void to_2d(Window& w) {
  w.kernel.insert(w.kernel.begin(), 1);
  w.stride.insert(w.stride.begin(), 1);
  w.dilation.insert(w.dilation.begin(), 1);
  w.begin.insert(w.begin.begin(), 0);
  w.end.insert(w.end.begin(), 0);
}

// The depth taps a 3-D convolution computes. A tap whose frames are padding
// for every output frame adds zeros times its weights, so the taps kept are
// the span from the first that reads a real frame to the last (their
// weights' gradient outside it is zero, as it is in the full convolution),
// and the depth is padded only as far as the kept taps read.
struct DepthTaps {
  std::int64_t first = 0, count = 0;                           // taps [first, first + count)
  std::int64_t begin = 0, end = 0;                             // depth padding they read
  std::int64_t out = 0;                                        // output frames
  std::int64_t start(std::int64_t k, const Window& w) const {  // tap k's first frame
    return k * w.dilation[0] - w.begin[0] + begin;
  }
};

Result<DepthTaps> depth_taps(Ctx& c, std::int64_t in, const Window& w, std::int64_t taps) {
  const std::int64_t pb = w.begin[0], dil = w.dilation[0], s = w.stride[0];
  const std::int64_t span = in + pb + w.end[0] - dil * (taps - 1) - 1;
  if (span < 0)
    return c.fail("3-D convolution: a depth of {} (padded) is shorter than the kernel's {}",
                  in + pb + w.end[0], dil * (taps - 1) + 1);
  DepthTaps t;
  t.out = span / s + 1;
  auto real = [&](std::int64_t k) {  // does tap k read a real frame for some output?
    const std::int64_t lo = k * dil, d = lo >= pb ? 0 : (pb - lo + s - 1) / s;
    return d < t.out && lo + d * s < pb + in;
  };
  std::int64_t last = -1;
  t.first = taps;
  for (std::int64_t k = 0; k < taps; ++k)
    if (real(k)) t.first = std::min(t.first, k), last = k;
  if (last < 0) t.first = last = 0;  // all padding: one tap, an output of zeros (plus bias)
  t.count = last - t.first + 1;
  t.begin = std::max<std::int64_t>(0, pb - t.first * dil);
  t.end = std::max<std::int64_t>(0, last * dil + (t.out - 1) * s - (pb + in - 1));
  return t;
}

// 3-D convolution (NCDHW input, OIDHW weight) as one 2-D convolution: the
// depth axis joins the batch, and the frames each output frame reads (one
// strided slice of the padded depth per kept tap, depth_taps) are stacked
// as channels, group by group; the weight's taps become input channels the
// same way ([O, C/g, KD, KH, KW] -> [O, KD x C/g, KH, KW]). Each piece
// (pad, slice, concat, transpose, reshape, conv2d) has its own gradient.
Result<Value> conv3d(Ctx& c, Value x, Value wt, Value bias, Window w, std::int64_t groups) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(DepthTaps dt, depth_taps(c, b.shape(x)[2], w, b.shape(wt)[2]));
  if (dt.count < b.shape(wt)[2]) wt = b.slice(wt, 2, dt.first, dt.first + dt.count);
  const Shape ws = b.shape(wt);
  const bool even = w.begin[1] == w.end[1] && w.begin[2] == w.end[2];
  Window pad = w;  // the depth as far as the taps read; height and width where uneven
  pad.begin[0] = dt.begin, pad.end[0] = dt.end;
  if (even) pad.begin[1] = pad.end[1] = pad.begin[2] = pad.end[2] = 0;
  x = pad_spatial(b, x, pad, 0.0);
  const Shape xs = b.shape(x);  // N, C, D', H', W'
  const std::int64_t n = xs[0], ch = xs[1], h = xs[3], wd = xs[4], taps = dt.count;
  const std::int64_t depth = dt.out, stride = w.stride[0];
  const Value frames = b.transpose(x, {0, 2, 1, 3, 4});  // N, D', C, H', W'
  std::vector<Value> tap;  // each [N, D, 1, C, H', W']: the frames tap k reads
  for (std::int64_t k = dt.first; k < dt.first + taps; ++k) {
    const std::int64_t at = dt.start(k, w);
    tap.push_back(b.reshape(b.slice(frames, 1, at, at + (depth - 1) * stride + 1, stride),
                            {n, depth, 1, ch, h, wd}));
  }
  Value stacked = taps == 1 ? tap[0] : b.concat(tap, 2);  // N, D, KD, C, H', W'
  Value wk = b.transpose(wt, {0, 2, 1, 3, 4});            // O, KD, C/g, KH, KW
  if (groups > 1 && taps > 1) {  // each group's channels together: (g, KD, C/g)
    stacked = b.transpose(b.reshape(stacked, {n, depth, taps, groups, ch / groups, h, wd}),
                          {0, 1, 3, 2, 4, 5, 6});
  }
  stacked = b.reshape(stacked, {n * depth, taps * ch, h, wd});
  wk = b.reshape(wk, {ws[0], taps * ws[1], ws[3], ws[4]});
  const std::vector<std::int64_t> pad2 =
      even ? std::vector<std::int64_t>{w.begin[1], w.begin[2]} : std::vector<std::int64_t>{0, 0};
  Value y = b.conv2d(stacked, wk, bias, {w.stride[1], w.stride[2]}, pad2,
                     {w.dilation[1], w.dilation[2]}, groups);
  const Shape ys = b.shape(y);  // N x D, O, H, W
  return b.transpose(b.reshape(y, {n, depth, ys[1], ys[2], ys[3]}), {0, 2, 1, 3, 4});
}

Status conv(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  SHOAL_ASSIGN_OR_RETURN(Value wt, c.in(1));
  Value bias;
  if (c.has_input(2)) {
    SHOAL_ASSIGN_OR_RETURN(bias, c.in(2));
  }
  Shape xs = b.shape(x), ws = b.shape(wt);
  if (xs.size() < 3 || xs.size() > 5 || ws.size() != xs.size())
    return c.fail(
        "only 1-D, 2-D and 3-D convolution (NCL/NCHW/NCDHW input, OIL/OIHW/OIDHW weight) is "
        "imported; input is {}, weight {}",
        fmt::join(xs, "x"), fmt::join(ws, "x"));
  const bool one_d = xs.size() == 3;
  SHOAL_ASSIGN_OR_RETURN(Window w, window_of(c, xs, Shape(ws.begin() + 2, ws.end())));
  if (xs.size() == 5) {
    SHOAL_ASSIGN_OR_RETURN(Value y, conv3d(c, x, wt, bias, w, c.attr_i("group", 1)));
    c.out(0, y);
    return ok_status();
  }
  if (one_d) {
    x = as_2d(b, x);
    wt = b.reshape(wt, {ws[0], ws[1], 1, ws[2]});
    to_2d(w);
  }
  if (!symmetric(w)) {
    x = pad_spatial(b, x, w, 0.0);
    w.begin = w.end = {0, 0};
  }
  Value y = b.conv2d(x, wt, bias, w.stride, w.begin, w.dilation, c.attr_i("group", 1));
  if (one_d) {
    Shape ys = b.shape(y);
    y = b.reshape(y, {ys[0], ys[1], ys[3]});
  }
  c.out(0, y);
  return ok_status();
}

// The full 3-D transposed convolution (no padding, no output window) of
// NCDHW x by the [C, O/g, KD, KH, KW] weight, as one 2-D one: the depth joins
// the batch, and the weight's depth taps become output channels, (g, KD, O/g),
// so every input frame yields the KD frames it adds to. Frame d's tap k lands
// on output frame d x stride + k x dilation: each tap's frames are scattered
// there into zeros (slice_scatter), and the KD of them summed.
Value conv_transpose3d(graph::Builder& b, Value x, Value wt,
                       const std::vector<std::int64_t>& stride,
                       const std::vector<std::int64_t>& dil, std::int64_t groups) {
  const Shape xs = b.shape(x), ws = b.shape(wt);
  const std::int64_t n = xs[0], ch = xs[1], d = xs[2], taps = ws[2], og = ws[1];
  const std::int64_t s = stride[0], depth = (d - 1) * s + (taps - 1) * dil[0] + 1;
  Value frames = b.reshape(b.transpose(x, {0, 2, 1, 3, 4}), {n * d, ch, xs[3], xs[4]});
  Value wk = b.reshape(b.transpose(wt, {0, 2, 1, 3, 4}), {ws[0], taps * og, ws[3], ws[4]});
  Value y = b.conv_transpose2d(frames, wk, {}, {stride[1], stride[2]}, {0, 0}, {0, 0},
                               {dil[1], dil[2]}, groups);
  const std::int64_t h = b.shape(y)[2], w = b.shape(y)[3];
  y = b.reshape(y, {n, d, groups, taps, og, h, w});
  const Shape whole = {n, depth, groups * og, h, w};
  Value sum;
  for (std::int64_t k = 0; k < taps; ++k) {  // frame i of tap k at k x dilation + i x stride
    Value t = b.reshape(b.slice(y, 3, k, k + 1), {n, d, groups * og, h, w});
    const std::int64_t at = k * dil[0];
    t = b.op("slice_scatter", {t},
             {{"axis", std::int64_t{1}},
              {"start", at},
              {"end", at + (d - 1) * s + 1},
              {"step", s},
              {"shape", whole}});
    sum = k == 0 ? t : b.add(sum, t);
  }
  return b.transpose(sum, {0, 2, 1, 3, 4});  // N, O, D, H, W
}

// A transposed convolution's attributes, one entry per spatial dim (pads:
// the begins, then the ends).
struct TransposedAttrs {
  std::vector<std::int64_t> stride, dil, out_pad, pads, out_shape;
  std::string auto_pad;
};

Result<TransposedAttrs> transposed_attrs(Ctx& c, std::size_t n) {
  auto v = [&](const char* name, std::int64_t d) {
    return c.attr_ints(name, std::vector<std::int64_t>(n, d));
  };
  TransposedAttrs a{v("strides", 1),
                    v("dilations", 1),
                    v("output_padding", 0),
                    c.attr_ints("pads", std::vector<std::int64_t>(2 * n, 0)),
                    c.attr_ints("output_shape"),
                    c.attr_s("auto_pad", "NOTSET")};
  if (a.stride.size() != n || a.dil.size() != n || a.out_pad.size() != n ||
      a.pads.size() != 2 * n || (!a.out_shape.empty() && a.out_shape.size() != n))
    return c.fail("strides, dilations, output_padding, pads and output_shape must cover {} dims",
                  n);
  return a;
}

// Where the ONNX output window starts in the full (unpadded) transposed
// convolution, its size, and the full size, per spatial dim.
struct OutWindow {
  std::vector<std::int64_t> begin, size, full;
};

Result<OutWindow> out_window(Ctx& c, const Shape& xs, const Shape& ws, const TransposedAttrs& a) {
  const std::size_t n = xs.size() - 2;
  const std::string& ap = a.auto_pad;
  OutWindow o{std::vector<std::int64_t>(n), std::vector<std::int64_t>(n),
              std::vector<std::int64_t>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t eff = (ws[2 + i] - 1) * a.dil[i] + 1;
    o.full[i] = (xs[2 + i] - 1) * a.stride[i] + eff;
    std::int64_t want = -1;
    if (!a.out_shape.empty()) want = a.out_shape[i];
    if (want < 0 && (ap == "SAME_UPPER" || ap == "SAME_LOWER")) want = xs[2 + i] * a.stride[i];
    if (want >= 0) {
      std::int64_t total = o.full[i] + a.out_pad[i] - want;
      // A window past the full output (total < 0) grows at the end, as
      // output_padding does.
      o.begin[i] = total < 0 ? 0 : (ap == "SAME_UPPER" ? total / 2 : total - total / 2);
      o.size[i] = want;
    } else {
      o.begin[i] = a.pads[i];
      o.size[i] = o.full[i] + a.out_pad[i] - a.pads[i] - a.pads[n + i];
    }
    if (o.begin[i] < 0 || o.size[i] <= 0)
      return c.fail(
          "the output window (start {}, size {}) of spatial dim {} is empty or starts "
          "before the output",
          o.begin[i], o.size[i], i);
  }
  return o;
}

// The ONNX output window of the full transposed convolution y (NC + spatial
// dims): slices where it starts inside, zeros where it runs past the end.
Value cut_window(graph::Builder& b, Value y, const OutWindow& o) {
  std::vector<std::int64_t> lo = {0, 0}, hi = {0, 0};
  for (std::size_t i = 0; i < o.begin.size(); ++i) {
    lo.push_back(-o.begin[i]);
    hi.push_back(o.size[i] - (o.full[i] - o.begin[i]));
  }
  return pad_axes(b, y, lo, hi, 0.0);
}

// ConvTranspose: the full transposed convolution (no padding), then the
// ONNX output window cut from it (pads, output_padding, output_shape,
// auto_pad), zeros where the window passes its end, then the bias. PyTorch's
// exports (symmetric pads, output_padding < stride) go straight to the op.
Status conv_transpose(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  SHOAL_ASSIGN_OR_RETURN(Value wt, c.in(1));
  Value bias;
  if (c.has_input(2)) {
    SHOAL_ASSIGN_OR_RETURN(bias, c.in(2));
  }
  Shape xs = b.shape(x), ws = b.shape(wt);
  if (xs.size() < 3 || xs.size() > 5 || ws.size() != xs.size())
    return c.fail("only 1-D, 2-D and 3-D transposed convolution is imported; input is {}",
                  fmt::join(xs, "x"));
  const bool one_d = xs.size() == 3;
  const std::size_t n = xs.size() - 2;
  SHOAL_ASSIGN_OR_RETURN(TransposedAttrs a, transposed_attrs(c, n));
  SHOAL_ASSIGN_OR_RETURN(OutWindow ow, out_window(c, xs, ws, a));
  auto &stride = a.stride, &dil = a.dil, &out_pad = a.out_pad;
  auto &begin = ow.begin, &size = ow.size, &full = ow.full;
  const std::int64_t groups = c.attr_i("group", 1);
  if (n == 3) {  // the full output, then the window cut from it, then the bias
    Value y = cut_window(b, conv_transpose3d(b, x, wt, stride, dil, groups), ow);
    if (bias.valid()) y = b.add(y, b.reshape(bias, {1, ws[1] * groups, 1, 1, 1}));
    c.out(0, y);
    return ok_status();
  }
  if (one_d) {
    x = b.reshape(x, {xs[0], xs[1], 1, xs[2]});
    wt = b.reshape(wt, {ws[0], ws[1], 1, ws[2]});
    stride.insert(stride.begin(), 1), dil.insert(dil.begin(), 1),
        out_pad.insert(out_pad.begin(), 0);
    begin.insert(begin.begin(), 0), size.insert(size.begin(), 1), full.insert(full.begin(), 1);
  }
  bool direct = true;
  for (std::size_t i = 0; i < 2; ++i)
    direct = direct && out_pad[i] < stride[i] && size[i] == full[i] + out_pad[i] - 2 * begin[i];
  Value y;
  if (direct) {
    y = b.conv_transpose2d(x, wt, {}, stride, begin, out_pad, dil, groups);
  } else {
    y = cut_window(b, b.conv_transpose2d(x, wt, {}, stride, {0, 0}, {0, 0}, dil, groups), ow);
  }
  if (bias.valid()) y = b.add(y, b.reshape(bias, {1, ws[1] * groups, 1, 1}));
  if (one_d) {
    Shape ys = b.shape(y);
    y = b.reshape(y, {ys[0], ys[1], ys[3]});
  }
  c.out(0, y);
  return ok_status();
}

// 2-D pooling of NCHW x over window w (2 dims), as ONNX pads it.
Value pool2d(graph::Builder& b, Value x, Window w, bool is_max, bool include_pad) {
  if (is_max) {
    // Shoal's pool pads at most half a kernel; beyond that, pad explicitly.
    bool fits = symmetric(w);
    for (std::size_t i = 0; i < w.begin.size(); ++i) fits = fits && 2 * w.begin[i] <= w.kernel[i];
    if (!fits) x = pad_spatial(b, x, w, -FLT_MAX), w.begin = w.end = {0, 0};
    return b.max_pool2d(x, w.kernel, w.stride, w.begin);
  }
  Value y = b.avg_pool2d(pad_spatial(b, x, w, 0.0), w.kernel, w.stride, {0, 0});
  bool padded = false;
  for (std::size_t i = 0; i < w.begin.size(); ++i) padded = padded || w.begin[i] || w.end[i];
  if (include_pad || !padded) return y;
  // Divide by the count of real (unpadded) elements in each window: the
  // average of a padded ones-image, folded to a constant.
  Tensor ones = Tensor::full(b.shape(x), b.dtype_of(x), 1.0);
  Value frac = b.avg_pool2d(pad_spatial(b, b.constant(ones), w, 0.0), w.kernel, w.stride, {0, 0});
  return b.div(y, frac);
}

// Dims i and j of a window as a 2-D one.
Window window_dims(const Window& w, std::size_t i, std::size_t j) {
  auto pick = [&](const std::vector<std::int64_t>& v) {
    return std::vector<std::int64_t>{v[i], v[j]};
  };
  return {pick(w.kernel), pick(w.stride), pick(w.dilation), pick(w.begin), pick(w.end)};
}

// 3-D pooling (NCDHW) as two 2-D poolings: over (H, W) with the depth
// joined to the channels, then over (D, 1) with H x W as one axis. A box's
// maximum is the maximum over depth of the planes' maxima, and its average
// the average over depth of the planes' averages: every plane's window
// holds as many real elements (padding excluded or counted), so the
// division by the box's count splits into the two.
Value pool3d(graph::Builder& b, Value x, const Window& w, bool is_max, bool include_pad) {
  const Shape xs = b.shape(x);
  Value planes = b.reshape(x, {xs[0], xs[1] * xs[2], xs[3], xs[4]});
  Value y = pool2d(b, planes, window_dims(w, 1, 2), is_max, include_pad);
  const Shape ys = b.shape(y);
  y = b.reshape(y, {xs[0], xs[1], xs[2], ys[2] * ys[3]});
  Window depth = window_dims(w, 0, 0);
  depth.kernel[1] = depth.stride[1] = depth.dilation[1] = 1;
  depth.begin[1] = depth.end[1] = 0;
  y = pool2d(b, y, depth, is_max, include_pad);
  return b.reshape(y, {xs[0], xs[1], b.shape(y)[2], ys[2], ys[3]});
}

Converter pool(bool is_max) {
  return [is_max](Ctx& c) -> Status {
    auto& b = c.b();
    SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
    Shape xs = b.shape(x);
    if (xs.size() < 3 || xs.size() > 5)
      return c.fail("only 1-D, 2-D and 3-D pooling is imported, not input {}", shape_str(xs));
    if (c.wants_output(1)) return c.fail("the Indices output of MaxPool is not supported");
    SHOAL_ASSIGN_OR_RETURN(Window w, window_of(c, xs, c.attr_ints("kernel_shape")));
    if (w.kernel.size() != xs.size() - 2)
      return c.fail("kernel_shape has {} dims for {} spatial dims", w.kernel.size(), xs.size() - 2);
    for (auto d : w.dilation)
      if (d != 1) return c.fail("pooling dilations other than 1 are not supported");
    const bool include_pad = c.attr_i("count_include_pad", 0) != 0;
    if (xs.size() == 5) {
      c.out(0, pool3d(b, x, w, is_max, include_pad));
      return ok_status();
    }
    const bool one_d = xs.size() == 3;
    if (one_d) to_2d(w);
    Value y = pool2d(b, as_2d(b, x), w, is_max, include_pad);
    if (one_d) {
      Shape ys = b.shape(y);
      y = b.reshape(y, {ys[0], ys[1], ys[3]});
    }
    c.out(0, y);
    return ok_status();
  };
}

Status global_avg_pool(Ctx& c) {
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  Shape s = c.b().shape(x);
  if (s.size() != 3 && s.size() != 4) return c.fail("only NCL and NCHW input is imported");
  Shape out = {s[0], s[1], 1};
  if (s.size() == 4) out.push_back(1);
  c.out(0, c.b().reshape(c.b().global_avg_pool(as_2d(c.b(), x)), out));
  return ok_status();
}

// Training (batch statistics, running statistics updated) when the graph is
// built for training; inference (running statistics) otherwise. Running
// statistics follow ONNX: momentum * running + (1 - momentum) * batch, with
// the batch's population variance.
Status batch_norm(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  SHOAL_ASSIGN_OR_RETURN(Value gamma, c.in(1));
  SHOAL_ASSIGN_OR_RETURN(Value beta, c.in(2));
  std::string rm_name, rv_name;
  SHOAL_ASSIGN_OR_RETURN(Value rm, c.in_buffer(3, &rm_name));
  SHOAL_ASSIGN_OR_RETURN(Value rv, c.in_buffer(4, &rv_name));
  bool training = c.bind().training;
  Shape xs = b.shape(x);
  if (xs.size() < 2 || xs.size() > 4)
    return c.fail("input must be [N, C], NCL or NCHW, not rank {}", xs.size());
  const bool reshaped = xs.size() != 4;
  if (reshaped) x = b.reshape(x, {xs[0], xs[1], 1, xs.size() == 3 ? xs[2] : 1});
  auto outs = b.batch_norm(x, gamma, beta, rm, rv, training, c.attr_f("epsilon", 1e-5));
  if (!b.ok()) return b.status();
  c.out(0, reshaped ? b.reshape(outs[0], xs) : outs[0]);
  if (training) {
    double m = c.attr_f("momentum", 0.9);
    Value keep = b.scalar(m), take = b.scalar(1.0 - m);
    Value nm = b.add(b.mul(rm, keep), b.mul(outs[1], take));
    Value nv = b.add(b.mul(rv, keep), b.mul(outs[2], take));
    c.out(1, nm);
    c.out(2, nv);
    if (c.bind().update_buffer) {
      c.bind().update_buffer(rm_name, nm);
      c.bind().update_buffer(rv_name, nv);
    }
  }
  return ok_status();
}

// Over the trailing dims from `axis`, which Shoal's layer_norm (last dim)
// covers after flattening them into one.
Status layer_norm(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  SHOAL_ASSIGN_OR_RETURN(Value gamma, c.in(1));
  Shape xs = b.shape(x);
  SHOAL_ASSIGN_OR_RETURN(std::int64_t ax, norm_axis(c, c.attr_i("axis", -1), xs.size()));
  std::int64_t inner = 1;
  for (std::size_t i = static_cast<std::size_t>(ax); i < xs.size(); ++i) inner *= xs[i];
  Shape flat(xs.begin(), xs.begin() + ax);
  flat.push_back(inner);
  Value beta;
  if (c.has_input(2)) {
    SHOAL_ASSIGN_OR_RETURN(beta, c.in(2));
  } else {
    beta = b.constant(Tensor::zeros(b.shape(gamma), DType::kF32));
  }
  double eps = c.attr_f("epsilon", 1e-5);
  Value xf = b.reshape(x, flat);
  Value y = b.layer_norm(xf, b.reshape(gamma, {inner}), b.reshape(beta, {inner}), eps);
  c.out(0, b.reshape(y, xs));
  if (c.wants_output(1) || c.wants_output(2)) {
    Shape stat = flat;
    stat.back() = 1;
    Value mean = b.reduce_mean(xf, {ax}, true);
    Value d = b.sub(xf, mean);
    Value var = b.reduce_mean(b.mul(d, d), {ax}, true);
    Shape keep(xs.begin(), xs.begin() + ax);
    keep.resize(xs.size(), 1);
    c.out(1, b.reshape(mean, keep));
    c.out(2, b.reshape(b.rsqrt(b.add(var, b.scalar_like(eps, var))), keep));
  }
  return ok_status();
}

// Active in training graphs (as a PyTorch module in train mode), identity
// in eval graphs. The mask output exists only for inference (all true).
Status dropout(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Value x, c.in(0));
  double ratio = c.attr_f("ratio", 0.5);
  if (c.has_input(1)) {
    const Tensor* r = c.known(1);
    if (!r) return c.fail("the ratio must be known at import");
    ratio = r->get(0);
  }
  bool on = c.bind().training && ratio > 0;
  if (const Tensor* t = c.has_input(2) ? c.known(2) : nullptr) on = on && t->get(0) != 0;
  // A training mask (exporters name it; models rarely read it) is an error
  // only if a node reads it.
  if (on && c.wants_output(1)) c.out_missing(1, "the mask output of a training Dropout");
  if (!on) {
    c.out(0, x);
    c.out_known(1, Tensor::full(b.shape(x), DType::kBool, 1.0));
    return ok_status();
  }
  // A stream per node (from its output's name): masks differ between
  // layers and are the same on every rank and in every build of the graph.
  auto stream = static_cast<std::int64_t>(std::hash<std::string>{}(c.node().output(0)) >> 2);
  c.out(0, b.dropout(x, ratio, static_cast<std::int64_t>(c.bind().seed), stream));
  return ok_status();
}

}  // namespace

void add_nn_ops(std::map<std::string, Converter>& t) {
  t["Conv"] = conv;
  t["ConvTranspose"] = conv_transpose;
  t["MaxPool"] = pool(true);
  t["AveragePool"] = pool(false);
  t["GlobalAveragePool"] = global_avg_pool;
  t["BatchNormalization"] = batch_norm;
  t["LayerNormalization"] = layer_norm;
  t["Dropout"] = dropout;
}

}  // namespace shoal::onnx
