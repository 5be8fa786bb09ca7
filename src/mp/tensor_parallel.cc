// Tensor parallelism: finding column/row linear regions in a forward graph
// and rewriting them for one rank of the group (mp/tensor_parallel.h).
#include "shoal/mp/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "shoal/collective/registry.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/graph.h"

namespace shoal::mp {

using graph::Graph;
using graph::Node;
using graph::Value;

namespace {

const std::set<std::string> kRegionOps = {"reshape", "transpose", "matmul",  "add",  "sub",
                                          "mul",     "div",       "softmax", "gelu", "relu",
                                          "tanh",    "sigmoid",   "neg",     "exp"};

// The parameter input feeding node n's input i, or "".
std::string param_input(const Graph& g, const Node& n, std::size_t i) {
  if (i >= n.inputs.size()) return "";
  const Node& p = g.node(n.inputs[i].node);
  return p.op == "input" && p.name.starts_with("param/") ? p.name : "";
}

bool param_linear(const Graph& g, const Node& n) {
  return n.alive && n.op == "linear" && !param_input(g, n, 1).empty();
}

// An output head: a matmul of activations [.., D] with a parameter [V, D]
// transposed (input 1), giving logits [.., V].
bool is_head(const Graph& g, const Node& n, std::size_t input) {
  return n.alive && n.op == "matmul" && input == 1 && n.attrs.get_int_or("transpose_b", 0) == 1 &&
         n.attrs.get_int_or("transpose_a", 0) == 0 && !param_input(g, n, 1).empty() &&
         g.type(n.inputs[1]).shape.size() == 2;
}

using Users = std::map<int, std::vector<std::pair<int, std::size_t>>>;  // node -> (user, input)

Users users_of(const Graph& g) {
  Users u;
  for (const Node& n : g.nodes())
    if (n.alive)
      for (std::size_t i = 0; i < n.inputs.size(); ++i) u[n.inputs[i].node].push_back({n.id, i});
  return u;
}

struct Flood {
  std::set<int> region, rows;
  bool ok = true;
};

// Everything downstream of column `c` up to the row linears' inputs.
Flood flood(const Graph& g, const Users& users, int c, const std::set<int>& outputs) {
  Flood f;
  std::vector<int> stack = {c};
  std::set<int> seen = {c};
  while (!stack.empty() && f.ok) {
    const int v = stack.back();
    stack.pop_back();
    if (outputs.count(v)) f.ok = false;  // a graph output cannot be a shard
    auto it = users.find(v);
    if (it == users.end()) continue;
    for (const auto& [u, idx] : it->second) {
      const Node& n = g.node(u);
      if (param_linear(g, n) && idx == 0) {
        // A fused activation would act on the partial sums.
        if (!n.attrs.get_string_or("activation", "").empty()) f.ok = false;
        f.rows.insert(u);
      } else if (kRegionOps.count(n.op) && n.outputs.size() == 1) {
        if (seen.insert(u).second) {
          f.region.insert(u);
          stack.push_back(u);
        }
      } else {
        f.ok = false;
      }
    }
  }
  return f;
}

// The linear with a parameter weight that `v` comes from through reshapes
// and transposes only, when `v` is not already in the region; else -1.
int chain_source(const Graph& g, Value v, const std::set<int>& region) {
  for (int hops = 0; hops < 8 && !region.count(v.node); ++hops) {
    const Node& n = g.node(v.node);
    if (param_linear(g, n)) return n.id;
    if (n.op != "reshape" && n.op != "transpose") return -1;
    v = n.inputs[0];
  }
  return -1;
}

// The sharded axis of every region value, on the graph's whole shapes; the
// reshapes' axes to divide. An error names the node that cannot be sharded.
struct Axes {
  std::map<int, int> of;          // node id (single output) -> sharded axis
  std::map<int, int> reshape_at;  // reshape node -> output axis divided by T
  std::int64_t units = 0;         // attention heads: the reshapes' split axis, 0 if none
};

Status propagate(const Graph& g, const std::vector<int>& order, const std::set<int>& columns,
                 const std::set<int>& region, int size, Axes& ax) {
  auto shape = [&](Value v) -> const Shape& { return g.type(v).shape; };
  for (int id : order) {
    const Node& n = g.node(id);
    if (columns.count(id)) {
      ax.of[id] = 1;
      continue;
    }
    if (!region.count(id)) continue;
    const Shape& out = n.outputs[0].shape;
    std::vector<int> in_axes;  // -1: not in the region
    for (const Value& v : n.inputs) in_axes.push_back(ax.of.count(v.node) ? ax.of[v.node] : -1);
    const int a = *std::max_element(in_axes.begin(), in_axes.end());
    if (n.op == "reshape") {
      const Shape& s = shape(n.inputs[0]);
      std::int64_t prefix = 1, p = 1;
      for (int i = 0; i < a; ++i) prefix *= s[static_cast<std::size_t>(i)];
      int k = 0;
      while (k < static_cast<int>(out.size()) && p < prefix)
        p *= out[static_cast<std::size_t>(k++)];
      if (p != prefix || k >= static_cast<int>(out.size()))
        return invalid_argument("{}: the sharded axis {} of {} does not survive as an axis of {}",
                                n.label(), a, shape_str(s), shape_str(out));
      // The first reshape fixes the units (heads); later ones (back to
      // [.., D]) must be whole multiples of them.
      const std::int64_t extent = out[static_cast<std::size_t>(k)];
      if (ax.units == 0) ax.units = extent;
      if (extent % ax.units != 0 || ax.units < size)
        return failed_precondition(
            "tensor parallelism over {} ranks: {} splits the sharded axis {} of {} into {}: "
            "{} units that {}",
            size, n.label(), a, shape_str(s), shape_str(out), ax.units,
            ax.units < size ? "are fewer than the ranks" : "do not divide it");
      ax.of[id] = ax.reshape_at[id] = k;
    } else if (n.op == "transpose") {
      auto perm = n.attrs.get_ints_or("perm", {});
      auto j = std::find(perm.begin(), perm.end(), a) - perm.begin();
      ax.of[id] = static_cast<int>(j);
    } else if (n.op == "matmul") {
      if (in_axes[0] != in_axes[1] || a >= static_cast<int>(out.size()) - 2)
        return invalid_argument("{}: a matmul over a sharded dimension (axes {} and {})", n.label(),
                                in_axes[0], in_axes[1]);
      ax.of[id] = a;
    } else {
      // Elementwise and softmax: a whole operand must broadcast along the axis.
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        if (in_axes[i] >= 0) {
          if (in_axes[i] != a)
            return invalid_argument("{}: operands sharded on axes {} and {}", n.label(), in_axes[i],
                                    a);
          continue;
        }
        const Shape& s = shape(n.inputs[i]);
        const auto at = static_cast<std::int64_t>(a) - static_cast<std::int64_t>(out.size()) +
                        static_cast<std::int64_t>(s.size());
        if (at >= 0 && s[static_cast<std::size_t>(at)] != 1)
          return invalid_argument("{}: operand {} {} is whole along the sharded axis {}", n.label(),
                                  i, shape_str(s), a);
      }
      if (n.op == "softmax") {
        std::int64_t sa = n.attrs.get_int_or("axis", -1);
        if (sa < 0) sa += static_cast<std::int64_t>(out.size());
        if (sa == a) return invalid_argument("{}: softmax over the sharded axis", n.label());
      }
      ax.of[id] = a;
    }
  }
  return ok_status();
}

// An output head's logits: this rank's columns [lo, hi) (its rows of the
// table) placed among zeros and summed over the group, so every rank holds
// the whole logits. Node `id` becomes that sum, so its users (the loss, the
// trainer's logits, an evaluation graph's output) are unchanged. The sum's
// gradient is the identity: each rank's columns get their share of the
// loss's gradient, and tp_copy sums the input's over the group. With
// parallel_loss, a cross-entropy of those logits becomes a
// vocab_parallel_cross_entropy of this rank's columns (the whole logits are
// then left to other readers: the trainer's count of right answers reads
// the new op's instead, and a training graph drops them as dead code).
Status shard_head(Graph& g, int id, std::int64_t lo, std::int64_t hi, std::int64_t vocab,
                  const graph::Attrs& comm_attr, bool parallel_loss) {
  const Node orig = g.node(id);
  const Shape out = orig.outputs[0].shape;
  SHOAL_ASSIGN_OR_RETURN(Value x, g.add("tp_copy", {orig.inputs[0]}, comm_attr));
  SHOAL_ASSIGN_OR_RETURN(Value part, g.add("matmul", {x, orig.inputs[1]}, orig.attrs, orig.name));
  auto zeros = [&](std::int64_t n) {
    Shape s = out;
    s.back() = n;
    return g.constant(Tensor::zeros(s, orig.outputs[0].dtype));
  };
  std::vector<Value> pieces;
  if (lo > 0) pieces.push_back(zeros(lo));
  pieces.push_back(part);
  if (hi < vocab) pieces.push_back(zeros(vocab - hi));
  Value cat = part;
  if (pieces.size() > 1) {
    SHOAL_ASSIGN_OR_RETURN(
        cat, g.add("concat", pieces, {{"axis", static_cast<std::int64_t>(out.size()) - 1}}));
  }
  Node& n = g.mutable_node(id);
  n.op = "tp_allreduce";
  n.inputs = {cat};
  n.attrs = comm_attr;
  if (!parallel_loss || out.size() != 2) return ok_status();
  for (int i = 0; i < g.num_nodes(); ++i) {
    Node& ce = g.mutable_node(i);
    if (!ce.alive || ce.op != "cross_entropy" || ce.inputs[0] != Value{id, 0}) continue;
    ce.op = "vocab_parallel_cross_entropy";
    ce.inputs[0] = part;
    ce.attrs = comm_attr;
    ce.attrs.set("offset", lo);
    ce.attrs.set("vocab", vocab);
  }
  return ok_status();
}

// Each vocabulary-parallel table's lookup reads this rank's rows (zeros
// for ids another rank holds), summed over the group by a tp_allreduce;
// each output head reading it computes this rank's columns of the logits.
Status shard_vocabulary(Graph& g, const TpPlan& plan, int rank, int size,
                        const graph::Attrs& comm_attr, bool parallel_loss) {
  for (const std::string& t : plan.heads) {
    SHOAL_ASSIGN_OR_RETURN(Value p, g.find_input(t));
    const std::int64_t vocab = g.type(p).shape[0];
    std::vector<int> heads;
    for (const Node& n : g.nodes())
      for (std::size_t i = 0; i < n.inputs.size(); ++i)
        if (n.inputs[i] == p && is_head(g, n, i)) heads.push_back(n.id);
    for (int id : heads)
      SHOAL_RETURN_IF_ERROR(shard_head(g, id, split_at(vocab, rank, size),
                                       split_at(vocab, rank + 1, size), vocab, comm_attr,
                                       parallel_loss));
  }
  for (const std::string& t : plan.tables) {
    int id = -1;  // (a tied table's head was rewritten above)
    for (const Node& n : g.nodes())
      if (n.alive && n.op == "embedding" && param_input(g, n, 0) == t) id = n.id;
    if (id < 0) return not_found("tensor parallelism: no embedding reads the table {}", t);
    const std::int64_t vocab = g.type(g.node(id).inputs[0]).shape[0];
    Node& e = g.mutable_node(id);
    e.attrs.set("offset", split_at(vocab, rank, size));
    e.attrs.set("vocab", vocab);
    const Value y{id, 0};
    SHOAL_ASSIGN_OR_RETURN(Value sum, g.add("tp_allreduce", {y}, comm_attr));
    g.replace_all_uses(y, sum);
    g.mutable_node(sum.node).inputs[0] = y;  // replace_all_uses redirected it too
  }
  return ok_status();
}

// A shard's axis must hold whole units, and at least one per rank.
Status check_divides(const Graph& g, const TpShard& sh, int size) {
  SHOAL_ASSIGN_OR_RETURN(Value v, g.find_input(sh.input));
  const Shape& s = g.type(v).shape;
  const std::int64_t n = s[static_cast<std::size_t>(sh.axis)];
  const std::int64_t u = sh.units > 0 ? sh.units : size;
  if (n % u != 0 || u < size)
    return invalid_argument(
        "tensor parallelism over {} ranks: {} {} does not split into {} whole units along axis {}",
        size, sh.input, shape_str(s), u, sh.axis);
  return ok_status();
}

}  // namespace

std::string TpPlan::str() const {
  std::string s;
  for (const auto& r : regions)
    s += fmt::format("columns [{}] -> rows [{}]\n", fmt::join(r.columns, ", "),
                     fmt::join(r.rows, ", "));
  for (const auto& t : tables) s += fmt::format("vocabulary-parallel embedding {}\n", t);
  for (const auto& t : heads) s += fmt::format("vocabulary-parallel output head {}\n", t);
  return s;
}

namespace {

// The columns that feed one region: from column linear `id`, every other
// column linear whose output meets the region (q, k and v meet in
// attention, each through its own reshape and transpose), to a fixed
// point. False when one of them cannot be sharded.
bool grow_columns(const Graph& g, const Users& users, const std::set<int>& outputs, int id,
                  Flood& f, std::set<int>& cols) {
  cols = {id};
  bool ok = true;
  for (bool grew = true; grew && ok;) {
    grew = false;
    for (int r : std::set<int>(f.region))
      for (const Value& v : g.node(r).inputs) {
        const int src = chain_source(g, v, f.region);
        if (src < 0 || cols.count(src)) continue;
        Flood o = flood(g, users, src, outputs);
        ok = ok && o.ok;
        cols.insert(src);
        f.region.insert(o.region.begin(), o.region.end());
        f.rows.insert(o.rows.begin(), o.rows.end());
        grew = true;
      }
  }
  return ok;
}

// Adds a region's shards to the plan: column weights (and biases) split by
// output features, row weights by input features, in `units` (heads, or
// the columns' output features).
void add_region(const Graph& g, const std::set<int>& cols, const std::set<int>& rows,
                std::int64_t units, TpPlan& plan) {
  TpPlan::Region reg;
  for (int c : cols) {
    reg.columns.push_back(param_input(g, g.node(c), 1));
    plan.shards.push_back({reg.columns.back(), 0, g.type(g.node(c).inputs[1]).shape, false, units});
    if (g.node(c).inputs.size() == 3 && !param_input(g, g.node(c), 2).empty())
      plan.shards.push_back(
          {param_input(g, g.node(c), 2), 0, g.type(g.node(c).inputs[2]).shape, false, units});
  }
  for (int r : rows) {
    reg.rows.push_back(param_input(g, g.node(r), 1));
    plan.shards.push_back({reg.rows.back(), 1, g.type(g.node(r).inputs[1]).shape, false, units});
  }
  plan.regions.push_back(std::move(reg));
}

// Vocabulary-parallel tables (Megatron's VocabParallelEmbedding and its
// parallel output head): a parameter [V, D] with at least a row per rank,
// read only by embedding lookups (as the table) and by output heads (tied
// to the table, or its own).
void add_vocabulary_tables(const Graph& g, const Users& users, const std::vector<int>& order,
                           int size, TpPlan& plan) {
  for (int id : order) {
    const Node& p = g.node(id);
    if (!p.alive || p.op != "input" || !p.name.starts_with("param/")) continue;
    const Shape& full = p.outputs[0].shape;
    auto u = users.find(id);
    if (full.size() != 2 || full[0] < size || u == users.end()) continue;
    bool lookup = false, head = false, other = false;
    for (const auto& [user, input] : u->second) {
      const Node& n = g.node(user);
      if (n.op == "embedding" && input == 0 && n.attrs.get_int_or("vocab", 0) == 0)
        lookup = true;
      else if (is_head(g, n, input))
        head = true;
      else
        other = true;
    }
    if (other || (!lookup && !head)) continue;
    if (lookup) plan.tables.push_back(p.name);
    if (head) plan.heads.push_back(p.name);
    plan.shards.push_back({p.name, 0, full, true});
  }
}

}  // namespace

Result<TpPlan> plan_tensor_parallel(const Graph& g, int size) {
  if (size < 1) return invalid_argument("tensor parallelism over {} ranks", size);
  const Users users = users_of(g);
  std::set<int> outputs;
  for (const Value& v : g.outputs()) outputs.insert(v.node);
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> order, g.topo_order());
  TpPlan plan;
  std::set<int> rows_taken, cols_taken;
  for (int id : order) {
    if (!param_linear(g, g.node(id)) || rows_taken.count(id) || cols_taken.count(id)) continue;
    Flood f = flood(g, users, id, outputs);
    if (!f.ok || f.rows.empty()) continue;
    std::set<int> cols;
    bool ok = grow_columns(g, users, outputs, id, f, cols);
    for (int c : cols) ok = ok && !rows_taken.count(c) && !f.rows.count(c);
    if (!ok) continue;
    Axes ax;
    if (Status st = propagate(g, order, cols, f.region, size, ax); !st.ok()) {
      if (st.code() == StatusCode::kFailedPrecondition) return st;  // the right shape, uneven
      continue;  // not a region this rewrite can shard
    }
    const std::int64_t units =
        ax.units > 0 ? ax.units : g.type(g.node(*cols.begin()).inputs[1]).shape[0];
    add_region(g, cols, f.rows, units, plan);
    cols_taken.insert(cols.begin(), cols.end());
    rows_taken.insert(f.rows.begin(), f.rows.end());
  }
  add_vocabulary_tables(g, users, order, size, plan);
  for (const auto& s : plan.shards)
    if (!s.uneven) SHOAL_RETURN_IF_ERROR(check_divides(g, s, size));
  return plan;
}

namespace {

// The column and row linears of a plan's regions, and the reshapes inside
// them that carry a share of the split axis.
struct Regions {
  std::map<int, std::pair<int, std::int64_t>> reshape_at;  // node -> (axis, units)
  std::vector<int> cols, rows;
};

// The linear each weight input feeds.
std::map<std::string, int> linears_by_weight(const Graph& g) {
  std::map<std::string, int> linear_of;
  for (const Node& n : g.nodes())
    if (param_linear(g, n)) linear_of[param_input(g, n, 1)] = n.id;
  return linear_of;
}

Result<Regions> find_regions(const Graph& g, const TpPlan& plan, int size,
                             const std::map<std::string, int>& linear_of) {
  auto node_of = [&](const std::string& w) -> Result<int> {
    auto it = linear_of.find(w);
    if (it == linear_of.end())
      return not_found("tensor parallelism: no linear takes the weight {}", w);
    return it->second;
  };
  const Users users = users_of(g);
  std::set<int> outputs;
  for (const Value& v : g.outputs()) outputs.insert(v.node);
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> order, g.topo_order());
  Regions out;
  for (const auto& reg : plan.regions) {
    std::set<int> cols, region, rows;
    for (const auto& w : reg.columns) {
      SHOAL_ASSIGN_OR_RETURN(int id, node_of(w));
      Flood f = flood(g, users, id, outputs);
      if (!f.ok)
        return invalid_argument("tensor parallelism: {} feeds ops that cannot be sharded", w);
      cols.insert(id);
      region.insert(f.region.begin(), f.region.end());
      rows.insert(f.rows.begin(), f.rows.end());
    }
    for (const auto& w : reg.rows) {
      SHOAL_ASSIGN_OR_RETURN(int id, node_of(w));
      if (!rows.erase(id))
        return invalid_argument("tensor parallelism: {} does not read the columns' region", w);
      out.rows.push_back(id);
    }
    if (!rows.empty())
      return invalid_argument(
          "tensor parallelism: the region of {} also feeds {} (not in the plan)", reg.columns[0],
          g.node(*rows.begin()).label());
    Axes ax;
    SHOAL_RETURN_IF_ERROR(propagate(g, order, cols, region, size, ax));
    for (const auto& [id, k] : ax.reshape_at) out.reshape_at[id] = {k, ax.units};
    out.cols.insert(out.cols.end(), cols.begin(), cols.end());
  }
  return out;
}

// Parameter inputs take rank r's slices; the regions' reshapes its share.
Status resize_to_slices(Graph& g, const TpPlan& plan, const Regions& regions, int r, int size) {
  for (const auto& s : plan.shards) {
    SHOAL_ASSIGN_OR_RETURN(Value v, g.find_input(s.input));
    auto& dim = g.mutable_node(v.node).outputs[0].shape[static_cast<std::size_t>(s.axis)];
    const auto [begin, end] = tp_range(s, r, size);
    dim = end - begin;
  }
  for (const auto& [id, at] : regions.reshape_at) {
    const auto [k, units] = at;
    Node& n = g.mutable_node(id);
    auto dims = n.attrs.get_ints_or("shape", {});
    auto& d = dims[static_cast<std::size_t>(k)];
    d = d / units * (split_at(units, r + 1, size) - split_at(units, r, size));
    n.attrs.set("shape", dims);
  }
  return ok_status();
}

// Megatron's f and g: a tp_copy before the column linears (identity
// forward, summed gradient), a tp_allreduce after the row linears.
Status insert_copies_and_sums(Graph& g, const Regions& regions, const graph::Attrs& comm_attr) {
  // f: one tp_copy per distinct input of the column linears.
  std::map<Value, Value> copies;
  for (int id : regions.cols) {
    const Value x = g.node(id).inputs[0];
    if (!copies.count(x)) {
      SHOAL_ASSIGN_OR_RETURN(copies[x], g.add("tp_copy", {x}, comm_attr));
    }
    g.mutable_node(id).inputs[0] = copies[x];
  }
  // g: each row linear's partial product summed over the group, then its bias.
  for (int id : regions.rows) {
    const Value y{id, 0};
    Value bias;
    if (g.node(id).inputs.size() == 3) {
      bias = g.node(id).inputs[2];
      g.mutable_node(id).inputs.resize(2);
    }
    SHOAL_ASSIGN_OR_RETURN(Value sum, g.add("tp_allreduce", {y}, comm_attr));
    Value out = sum;
    if (bias.valid()) {
      SHOAL_ASSIGN_OR_RETURN(out, g.add("add", {sum, bias}));
    }
    g.replace_all_uses(y, out);
    g.mutable_node(sum.node).inputs[0] = y;  // replace_all_uses redirected it too
  }
  return ok_status();
}

}  // namespace

Status shard_tensor_parallel(Graph& g, const TpPlan& plan, std::int64_t comm_id,
                             bool parallel_loss) {
  register_tensor_parallel_ops();
  comm::Communicator* c = collective::communicator(comm_id);
  if (!c)
    return failed_precondition("tensor parallelism: no communicator registered as id {}", comm_id);
  const int size = c->size();
  const graph::Attrs comm_attr = {{"comm", comm_id}};
  // Found before the vocabulary is sharded, which rewrites its linear.
  const std::map<std::string, int> linear_of = linears_by_weight(g);
  for (const auto& s : plan.shards)
    if (!s.uneven) SHOAL_RETURN_IF_ERROR(check_divides(g, s, size));
  SHOAL_RETURN_IF_ERROR(shard_vocabulary(g, plan, c->rank(), size, comm_attr, parallel_loss));
  SHOAL_ASSIGN_OR_RETURN(const Regions regions, find_regions(g, plan, size, linear_of));
  SHOAL_RETURN_IF_ERROR(resize_to_slices(g, plan, regions, c->rank(), size));
  SHOAL_RETURN_IF_ERROR(insert_copies_and_sums(g, regions, comm_attr));
  SHOAL_ASSIGN_OR_RETURN(const std::vector<int> order, g.topo_order());
  for (int id : order) SHOAL_RETURN_IF_ERROR(g.reinfer(id).with_context("tensor parallelism"));
  return ok_status();
}

Tensor tp_slice(const Tensor& full, const TpShard& s, int rank, int size) {
  const Shape& f = full.shape();
  const auto [begin, end] = tp_range(s, rank, size);
  Shape part = f;
  part[static_cast<std::size_t>(s.axis)] = end - begin;
  Tensor out = Tensor::empty(part, DType::kF32);
  const Tensor src = full.cast(DType::kF32);
  if (s.axis == 0) {
    const std::int64_t row = f.size() > 1 ? f[1] : 1;
    std::memcpy(out.raw_data(), src.data<float>() + begin * row, out.nbytes());
  } else {
    for (std::int64_t i = 0; i < f[0]; ++i)
      std::memcpy(out.data<float>() + i * part[1], src.data<float>() + i * f[1] + begin,
                  static_cast<std::size_t>(part[1]) * sizeof(float));
  }
  return out;
}

}  // namespace shoal::mp
