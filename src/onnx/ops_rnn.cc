// RNN, GRU and LSTM, unrolled at import into the graph's own ops (matmul, slice,
// sigmoid, tanh, mul, add, concat): the sequence length is static, so the
// recurrence is a chain of steps autodiff differentiates like any other, and
// every piece already has its gradient check. Per step the input projection
// is its own small matmul over that step's slice of X: one matmul over the
// whole sequence followed by per-step slices would cost the backward pass a
// full-size gradient buffer per step (a slice's gradient is a zero-padded
// copy), quadratic in the sequence length.
//
// ONNX's gate orders: GRU z, r, h; LSTM i, o, f, c. Both directions and
// bidirectional, layout 0 and 1, LSTM peepholes. Not imported (refused by
// name): activations other than the defaults, clip, input_forget, and
// sequence_lens that differ from the sequence length.
#include "onnx/context.h"

namespace shoal::onnx {

using graph::Value;

namespace {

struct Rnn {
  std::int64_t seq = 0, batch = 0, in = 0, hidden = 0, dirs = 1;
  int gates = 0;
  bool reverse_only = false;
  Value x;  // [seq, batch, in]
};

// Shapes, direction and the checks every recurrent node shares.
Result<Rnn> read_rnn(Ctx& c, int gates, const std::vector<std::string>& default_acts) {
  auto& b = c.b();
  Rnn r;
  r.gates = gates;
  SHOAL_ASSIGN_OR_RETURN(r.x, c.in(0));
  Shape xs = b.shape(r.x);
  if (xs.size() != 3) return c.fail("X must be 3-D, not {}", fmt::join(xs, "x"));
  const std::int64_t layout = c.attr_i("layout", 0);
  if (layout != 0 && layout != 1) return c.fail("layout {} is not 0 or 1", layout);
  if (layout == 1) r.x = b.transpose(r.x, {1, 0, 2}), xs = b.shape(r.x);
  r.seq = xs[0], r.batch = xs[1], r.in = xs[2];
  std::string dir = c.attr_s("direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional")
    return c.fail("direction '{}' is not forward, reverse or bidirectional", dir);
  r.dirs = dir == "bidirectional" ? 2 : 1;
  r.reverse_only = dir == "reverse";
  r.hidden = c.attr_i("hidden_size", 0);
  SHOAL_ASSIGN_OR_RETURN(auto ws, c.type(1));
  if (r.hidden <= 0 && ws.shape.size() == 3) r.hidden = ws.shape[1] / gates;
  const Shape want_w = {r.dirs, gates * r.hidden, r.in};
  if (ws.shape != want_w)
    return c.fail("W is {}; {} directions of {} gates of hidden size {} over {} inputs need {}",
                  fmt::join(ws.shape, "x"), r.dirs, gates, r.hidden, r.in, fmt::join(want_w, "x"));
  if (c.has_attr("clip")) return c.fail("the clip attribute is not supported");
  if (c.attr_i("input_forget", 0) != 0) return c.fail("input_forget is not supported");
  if (c.has_attr("activations")) {
    const auto* a = c.attr("activations");
    for (int i = 0; i < a->strings_size(); ++i)
      if (a->strings(i) != default_acts[static_cast<std::size_t>(i) % default_acts.size()])
        return c.fail("activation '{}' is not supported (only the defaults: {})", a->strings(i),
                      fmt::join(default_acts, ", "));
  }
  if (c.has_input(4)) {
    const Tensor* lens = c.known(4);
    if (!lens) return c.fail("sequence_lens must be known at import");
    for (std::int64_t i = 0; i < lens->numel(); ++i)
      if (static_cast<std::int64_t>(lens->get(i)) != r.seq)
        return c.fail("sequence_lens[{}] = {}: sequences shorter than X ({}) are not supported", i,
                      lens->get(i), r.seq);
  }
  return r;
}

// Direction d's slice of a [dirs, ...] input, without the leading axis.
Value dir_of(graph::Builder& b, Value v, std::int64_t d) {
  Shape s = b.shape(v);
  Value one = s[0] == 1 ? v : b.slice(v, 0, d, d + 1);
  return b.reshape(one, Shape(s.begin() + 1, s.end()));
}

// Input i's direction d ([rows, cols]) or zeros of `like` when omitted.
Result<Value> dir_input(Ctx& c, int i, std::int64_t d, const Shape& like) {
  if (!c.has_input(i)) return c.b().constant(Tensor::zeros(like, DType::kF32));
  SHOAL_ASSIGN_OR_RETURN(Value v, c.in(i));
  return dir_of(c.b(), v, d);
}

struct Dir {
  Value w, r, wb, rb;  // [G*H, in], [G*H, H], [G*H], [G*H]
};

Result<Dir> weights(Ctx& c, const Rnn& n, std::int64_t d) {
  auto& b = c.b();
  Dir out;
  const std::int64_t gh = n.gates * n.hidden;
  SHOAL_ASSIGN_OR_RETURN(Value w, c.in(1));
  SHOAL_ASSIGN_OR_RETURN(Value r, c.in(2));
  out.w = dir_of(b, w, d);
  out.r = dir_of(b, r, d);
  if (b.shape(out.r) != Shape{gh, n.hidden})
    return c.fail("R is {}, not {}x{}x{}", fmt::join(b.shape(r), "x"), n.dirs, gh, n.hidden);
  SHOAL_ASSIGN_OR_RETURN(Value bias, dir_input(c, 3, d, {2 * gh}));
  out.wb = b.slice(bias, 0, 0, gh);
  out.rb = b.slice(bias, 0, gh, 2 * gh);
  return out;
}

// Step t's input projection: X[t] W^T + Wb, [batch, G*H].
Value project(graph::Builder& b, const Rnn& n, const Dir& w, std::int64_t t) {
  Value xt = b.reshape(b.slice(n.x, 0, t, t + 1), {n.batch, n.in});
  return b.add(b.matmul(xt, w.w, false, true), w.wb);
}

Value gate(graph::Builder& b, Value v, const Rnn& n, int k) {
  return b.slice(v, 1, k * n.hidden, (k + 1) * n.hidden);
}

// The per-direction outputs, stacked as ONNX lays them out: Y [seq, dirs,
// batch, H] (or [batch, seq, dirs, H] under layout 1), Y_h [dirs, batch, H].
void emit_outputs(Ctx& c, const Rnn& n, const std::vector<std::vector<Value>>& ys,
                  const std::vector<Value>& last_h, const std::vector<Value>& last_c) {
  auto& b = c.b();
  const bool layout1 = c.attr_i("layout", 0) == 1;
  auto stack_dirs = [&](const std::vector<Value>& per_dir) {
    std::vector<Value> parts;
    for (Value v : per_dir) parts.push_back(b.reshape(v, {1, n.batch, n.hidden}));
    Value s = parts.size() == 1 ? parts[0] : b.concat(parts, 0);
    return layout1 ? b.transpose(s, {1, 0, 2}) : s;
  };
  if (c.wants_output(0)) {
    std::vector<Value> steps;
    for (std::int64_t t = 0; t < n.seq; ++t) {
      std::vector<Value> at;
      for (const auto& y : ys) at.push_back(y[static_cast<std::size_t>(t)]);
      steps.push_back(b.reshape(stack_dirs(at), layout1 ? Shape{n.batch, 1, n.dirs, n.hidden}
                                                        : Shape{1, n.dirs, n.batch, n.hidden}));
    }
    c.out(0, steps.size() == 1 ? steps[0] : b.concat(steps, layout1 ? 1 : 0));
  }
  if (c.wants_output(1)) c.out(1, stack_dirs(last_h));
  if (!last_c.empty() && c.wants_output(2)) c.out(2, stack_dirs(last_c));
}

// Step order of direction d: forward, or backward for "reverse" and the
// second direction of "bidirectional".
std::vector<std::int64_t> order(const Rnn& n, std::int64_t d) {
  std::vector<std::int64_t> ts;
  const bool back = n.reverse_only || d == 1;
  for (std::int64_t i = 0; i < n.seq; ++i) ts.push_back(back ? n.seq - 1 - i : i);
  return ts;
}

// Elman: ht = tanh(X[t] W^T + h(t-1) R^T + Wb + Rb).
Status rnn(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Rnn n, read_rnn(c, 1, {"Tanh"}));
  std::vector<std::vector<Value>> ys;
  std::vector<Value> last_h;
  for (std::int64_t d = 0; d < n.dirs; ++d) {
    SHOAL_ASSIGN_OR_RETURN(Dir w, weights(c, n, d));
    SHOAL_ASSIGN_OR_RETURN(Value h, dir_input(c, 5, d, {n.batch, n.hidden}));
    std::vector<Value> y(static_cast<std::size_t>(n.seq));
    for (std::int64_t t : order(n, d)) {
      h = b.tanh(b.add(project(b, n, w, t), b.add(b.matmul(h, w.r, false, true), w.rb)));
      y[static_cast<std::size_t>(t)] = h;
    }
    ys.push_back(std::move(y));
    last_h.push_back(h);
  }
  emit_outputs(c, n, ys, last_h, {});
  return b.ok() ? ok_status() : c.fail("{}", b.status().to_string());
}

// ht = (1 - z) * h~ + z * h(t-1) with linear_before_reset choosing where R's
// candidate bias and the reset gate apply.
Status gru(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Rnn n, read_rnn(c, 3, {"Sigmoid", "Tanh"}));
  const bool before_reset = c.attr_i("linear_before_reset", 0) != 0;
  std::vector<std::vector<Value>> ys;
  std::vector<Value> last_h;
  for (std::int64_t d = 0; d < n.dirs; ++d) {
    SHOAL_ASSIGN_OR_RETURN(Dir w, weights(c, n, d));
    SHOAL_ASSIGN_OR_RETURN(Value h, dir_input(c, 5, d, {n.batch, n.hidden}));
    Value r_zr = b.slice(w.r, 0, 0, 2 * n.hidden),
          r_h = b.slice(w.r, 0, 2 * n.hidden, 3 * n.hidden);
    Value rb_zr = b.slice(w.rb, 0, 0, 2 * n.hidden),
          rb_h = b.slice(w.rb, 0, 2 * n.hidden, 3 * n.hidden);
    std::vector<Value> y(static_cast<std::size_t>(n.seq));
    for (std::int64_t t : order(n, d)) {
      Value xw = project(b, n, w, t);
      Value zr = b.sigmoid(
          b.add(b.slice(xw, 1, 0, 2 * n.hidden), b.add(b.matmul(h, r_zr, false, true), rb_zr)));
      Value z = gate(b, zr, n, 0), r = gate(b, zr, n, 1);
      Value cand = before_reset ? b.mul(r, b.add(b.matmul(h, r_h, false, true), rb_h))
                                : b.add(b.matmul(b.mul(r, h), r_h, false, true), rb_h);
      Value hc = b.tanh(b.add(gate(b, xw, n, 2), cand));
      h = b.add(hc, b.mul(z, b.sub(h, hc)));
      y[static_cast<std::size_t>(t)] = h;
    }
    ys.push_back(std::move(y));
    last_h.push_back(h);
  }
  emit_outputs(c, n, ys, last_h, {});
  return b.ok() ? ok_status() : c.fail("{}", b.status().to_string());
}

// Ct = f * C(t-1) + i * c~, Ht = o * tanh(Ct), peepholes P = [Pi, Po, Pf].
Status lstm(Ctx& c) {
  auto& b = c.b();
  SHOAL_ASSIGN_OR_RETURN(Rnn n, read_rnn(c, 4, {"Sigmoid", "Tanh", "Tanh"}));
  std::vector<std::vector<Value>> ys;
  std::vector<Value> last_h, last_c;
  for (std::int64_t d = 0; d < n.dirs; ++d) {
    SHOAL_ASSIGN_OR_RETURN(Dir w, weights(c, n, d));
    SHOAL_ASSIGN_OR_RETURN(Value h, dir_input(c, 5, d, {n.batch, n.hidden}));
    SHOAL_ASSIGN_OR_RETURN(Value cell, dir_input(c, 6, d, {n.batch, n.hidden}));
    Value pi, po, pf;
    if (c.has_input(7)) {
      SHOAL_ASSIGN_OR_RETURN(Value p, dir_input(c, 7, d, {3 * n.hidden}));
      pi = b.slice(p, 0, 0, n.hidden), po = b.slice(p, 0, n.hidden, 2 * n.hidden);
      pf = b.slice(p, 0, 2 * n.hidden, 3 * n.hidden);
    }
    std::vector<Value> y(static_cast<std::size_t>(n.seq));
    for (std::int64_t t : order(n, d)) {
      Value a = b.add(project(b, n, w, t), b.add(b.matmul(h, w.r, false, true), w.rb));
      Value ai = gate(b, a, n, 0), ao = gate(b, a, n, 1), af = gate(b, a, n, 2);
      if (pi.valid()) ai = b.add(ai, b.mul(pi, cell)), af = b.add(af, b.mul(pf, cell));
      Value i = b.sigmoid(ai), f = b.sigmoid(af), g = b.tanh(gate(b, a, n, 3));
      cell = b.add(b.mul(f, cell), b.mul(i, g));
      if (po.valid()) ao = b.add(ao, b.mul(po, cell));
      h = b.mul(b.sigmoid(ao), b.tanh(cell));
      y[static_cast<std::size_t>(t)] = h;
    }
    ys.push_back(std::move(y));
    last_h.push_back(h);
    last_c.push_back(cell);
  }
  emit_outputs(c, n, ys, last_h, last_c);
  return b.ok() ? ok_status() : c.fail("{}", b.status().to_string());
}

}  // namespace

void add_rnn_ops(std::map<std::string, Converter>& t) {
  t["RNN"] = rnn;
  t["GRU"] = gru;
  t["LSTM"] = lstm;
}

}  // namespace shoal::onnx
