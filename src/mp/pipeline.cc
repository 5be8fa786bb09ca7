// One pipeline stage's step graph from the forward of one micro-batch
// (mp/pipeline.h): the stage's nodes copied once per micro-batch, the
// boundary sends and receives, autodiff per micro-batch, the gradients
// summed, and every node given the slot of its micro-batch's forward or
// backward in the schedule.
#include "shoal/mp/pipeline.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "shoal/collective/ops.h"
#include "shoal/graph/passes.h"

namespace shoal::mp {
namespace {

using graph::Graph;
using graph::TensorType;
using graph::Value;

// Copies the stage's part of the template into a new graph, one
// micro-batch at a time. Inputs "x" and "labels" of the template are rows
// [i·b, (i+1)·b) of the new graph's whole-batch inputs; parameters and
// constants are shared by all micro-batches.
class StageCopier {
 public:
  StageCopier(const Graph& t, Graph& g, const PipelinePlan& plan, const StageOptions& o)
      : t_(t), g_(g), b_(g), plan_(plan), o_(o) {}

  // Micro-batch i's forward of `piece` (this rank's chunk c is piece
  // c·stages + stage): its output (the value crossing the next cut, or the
  // template's `finals` on the last piece).
  Result<std::vector<Value>> forward(int piece, int i, Value after,
                                     const std::vector<Value>& finals) {
    micro_ = i;
    local_.clear();
    const auto [first, last] = plan_.range(piece);
    if (piece > 0) {
      const Value cut = plan_.candidates[plan_.cuts[static_cast<std::size_t>(piece) - 1]].value;
      local_[cut] = pp_recv(b_, after, t_.type(cut).shape, link(piece - 1, piece - 1));
    }
    for (std::size_t k = first; k < last; ++k) {
      const graph::Node& n = t_.node(plan_.order[k]);
      std::vector<Value> in;
      for (const Value& v : n.inputs) {
        SHOAL_ASSIGN_OR_RETURN(Value x, value(v));
        in.push_back(x);
      }
      auto outs = g_.add_node(n.op, in, n.attrs, n.name);
      if (!outs.ok()) return outs.status().with_context(fmt::format("pipeline stage {}", o_.stage));
      for (std::size_t j = 0; j < outs->size(); ++j)
        local_[Value{n.id, static_cast<int>(j)}] = (*outs)[j];
    }
    std::vector<Value> out;
    if (piece + 1 < o_.stages * o_.chunks) {
      const Value cut = plan_.candidates[plan_.cuts[static_cast<std::size_t>(piece)]].value;
      SHOAL_ASSIGN_OR_RETURN(Value y, value(cut));
      out.push_back(pp_send(b_, y, link(piece + 1, piece)));
      return out;
    }
    for (const Value& f : finals) {
      SHOAL_ASSIGN_OR_RETURN(Value y, value(f));
      out.push_back(y);
    }
    return out;
  }
  const std::map<std::string, Value>& params() const { return params_; }
  // From now on the template's input `name` reads `v` (the running
  // statistics a micro-batch before wrote).
  void chain(const std::string& name, Value v) { chained_[name] = v; }

 private:
  // The link to the rank holding `piece` across cut `cut`.
  PipeLink link(int piece, int cut) const {
    return {o_.fwd_comm, o_.bwd_comm, piece % o_.stages, pipe_tag(cut, micro_)};
  }
  Result<Value> value(Value v) {
    if (auto it = local_.find(v); it != local_.end()) return it->second;
    const graph::Node& n = t_.node(v.node);
    if (n.op == "constant") {
      auto [it, fresh] = constants_.emplace(v, Value{});
      if (fresh) it->second = g_.constant(n.constant, n.name);
      return it->second;
    }
    if (n.op != "input" && from_inputs_only(t_, v.node)) {  // computed where it is read
      std::vector<Value> in;
      for (const Value& u : n.inputs) {
        SHOAL_ASSIGN_OR_RETURN(Value x, value(u));
        in.push_back(x);
      }
      SHOAL_ASSIGN_OR_RETURN(auto outs, g_.add_node(n.op, in, n.attrs, n.name));
      for (std::size_t j = 0; j < outs.size(); ++j)
        local_[Value{n.id, static_cast<int>(j)}] = outs[j];
      return local_.at(v);
    }
    if (n.op != "input")
      return internal_error("pipeline stage {}: {} is computed on an earlier stage", o_.stage,
                            n.label());
    const TensorType& type = n.outputs[0];
    if (n.name == "x" || n.name == "labels") {
      auto [it, fresh] = inputs_.emplace(n.name, Value{});
      if (fresh) {
        TensorType whole = type;
        whole.shape[0] *= o_.micro_batches;
        it->second = g_.input(n.name, whole);
      }
      const std::int64_t rows = type.shape[0];
      return b_.slice(it->second, 0, micro_ * rows, (micro_ + 1) * rows);
    }
    if (auto c = chained_.find(n.name); c != chained_.end()) return c->second;
    auto [it, fresh] = inputs_.emplace(n.name, Value{});
    if (fresh) {
      it->second = g_.input(n.name, type);
      if (n.name.starts_with("param/")) params_[n.name.substr(6)] = it->second;
    }
    return it->second;
  }

  const Graph& t_;
  Graph& g_;
  graph::Builder b_;
  const PipelinePlan& plan_;
  const StageOptions& o_;
  int micro_ = 0;
  std::map<Value, Value> local_, constants_;
  std::map<std::string, Value> inputs_, params_, chained_;
};

void set_slot(Graph& g, int from, std::int64_t slot) {
  for (int id = from; id < g.num_nodes(); ++id) g.mutable_node(id).slot = slot;
}

Status check(const StageOptions& o, const PipelinePlan& plan,
             const std::vector<std::pair<std::string, Value>>& buffers = {}) {
  if (o.stage < 0 || o.stage >= o.stages || o.micro_batches < 1 ||
      o.micro_batches >= kMaxMicroBatches || o.chunks < 1)
    return invalid_argument("pipeline: stage {} of {}, {} micro-batches, {} chunks per stage",
                            o.stage, o.stages, o.micro_batches, o.chunks);
  if (o.chunks > 1 && o.micro_batches % o.stages != 0)
    return invalid_argument(
        "pipeline: {} micro-batches with {} chunks per stage: interleaved stages take "
        "micro-batches in groups of the {} stages, so their number must be a multiple of it",
        o.micro_batches, o.chunks, o.stages);
  if (plan.cuts.size() + 1 != static_cast<std::size_t>(o.stages * o.chunks))
    return invalid_argument("pipeline: a plan of {} pieces for {} stages x {} chunks",
                            plan.cuts.size() + 1, o.stages, o.chunks);
  if (!buffers.empty() && o.stages * o.chunks != 1)
    return invalid_argument(
        "pipeline: running statistics ({} buffers, the first '{}') are carried by a step of one "
        "piece only (gradient accumulation), not by {} stages x {} chunks",
        buffers.size(), buffers.front().first, o.stages, o.chunks);
  return ok_status();
}

// The step's mean loss, summed from the last piece's objectives and
// broadcast from the last stage; every other objective (a send's token, 0)
// is kept alive: on other stages in the sum, on the last as an output.
Value step_loss(Graph& g, const std::vector<std::vector<Value>>& objective, const StageOptions& o) {
  graph::Builder b(g);
  const bool last = o.stage + 1 == o.stages;
  std::optional<Value> total;
  for (std::size_t c = 0; c < objective.size(); ++c)
    for (const Value& v : objective[c]) {
      if (last && c + 1 < objective.size()) {
        g.mark_output(v);
        continue;
      }
      total = total ? b.add(*total, v) : v;
    }
  if (o.stages == 1) return *total;  // gradient accumulation (mp/accumulate.h)
  return collective::broadcast(b, *total, o.loss_comm, o.stages - 1);
}

}  // namespace

Result<StageStep> build_stage_step(Graph& t, Value loss, Value logits, const PipelinePlan& plan,
                                   const StageOptions& o,
                                   const std::vector<std::pair<std::string, Value>>& buffers) {
  SHOAL_RETURN_IF_ERROR(check(o, plan, buffers));
  std::vector<Value> finals = {loss, logits};
  for (const auto& [name, v] : buffers) finals.push_back(v);
  std::vector<std::pair<std::string, Value>> stats = buffers;
  const bool last = o.stage + 1 == o.stages;
  const int m = o.micro_batches, chunks = o.chunks;
  Graph g;
  graph::Builder b(g);
  StageCopier copy(t, g, plan, o);
  std::map<std::tuple<int, int, bool>, std::int64_t> slot;
  const auto order = stage_work(o.schedule, o.stage, o.stages, m, chunks);
  for (std::size_t k = 0; k < order.size(); ++k)
    slot[{order[k].chunk, order[k].micro, order[k].forward}] = static_cast<std::int64_t>(k) + 1;
  const std::int64_t final_slot = static_cast<std::int64_t>(order.size()) + 1;

  // Forwards: each chunk's micro-batch objective (the send's token; loss / m
  // on the last piece).
  const auto cm = static_cast<std::size_t>(chunks), mm = static_cast<std::size_t>(m);
  std::vector<std::vector<Value>> objective(cm, std::vector<Value>(mm)), after = objective;
  std::vector<Value> logits_i(mm);
  SHOAL_ASSIGN_OR_RETURN(const auto piece_params, stage_params(t, plan));
  for (int c = 0; c < chunks; ++c) {
    const int piece = c * o.stages + o.stage;
    const bool tail = last && c + 1 == chunks;
    for (int i = 0; i < m; ++i) {
      const int from = g.num_nodes();
      Value& a = after[c][i];
      a = b.scalar(0.0);  // orders the receive; its gradient is the backward send
      SHOAL_ASSIGN_OR_RETURN(auto outs, copy.forward(piece, i, a, finals));
      objective[c][i] = tail ? b.mul(outs[0], b.scalar(1.0 / m)) : outs[0];
      if (tail) logits_i[i] = outs[1];
      for (std::size_t k = 0; tail && k < stats.size(); ++k) {  // the next micro-batch reads them
        stats[k].second = outs[2 + k];
        copy.chain("buf/" + stats[k].first, outs[2 + k]);
      }
      SHOAL_RETURN_IF_ERROR(b.status().with_context(fmt::format("pipeline stage {}", o.stage)));
      set_slot(g, from, slot.at({c, i, true}));
    }
  }
  // Backwards: autodiff of each objective; each parameter's gradients summed
  // in (chunk, micro-batch) order.
  StageStep st;
  for (const auto& [name, v] : copy.params()) st.params.push_back({name, v, {}});
  for (int c = 0; c < chunks; ++c) {
    const int piece = c * o.stages + o.stage;
    const auto& uses = piece_params[static_cast<std::size_t>(piece)];
    std::vector<Value> wrt;  // the chunk's parameters, in st.params' order
    std::vector<std::size_t> which;
    for (std::size_t p = 0; p < st.params.size(); ++p)
      if (std::find(uses.begin(), uses.end(), st.params[p].name) != uses.end()) {
        wrt.push_back(st.params[p].param);
        which.push_back(p);
      }
    for (int i = 0; i < m; ++i) {
      const int from = g.num_nodes();
      std::vector<Value> w = wrt;
      if (piece > 0) w.push_back(after[c][i]);
      SHOAL_ASSIGN_OR_RETURN(std::vector<Value> grads, graph::autodiff(g, objective[c][i], w));
      for (std::size_t k = 0; k < which.size(); ++k) {
        Value& acc = st.params[which[k]].grad;
        acc = acc.valid() ? b.add(acc, grads[k]) : grads[k];
      }
      if (piece > 0) g.mark_output(grads.back());  // the send of dx to the piece before
      SHOAL_RETURN_IF_ERROR(b.status());
      set_slot(g, from, slot.at({c, i, false}));
    }
  }
  const int from = g.num_nodes();
  st.loss = step_loss(g, objective, o);
  if (last) st.logits = m == 1 ? logits_i[0] : b.concat(logits_i, 0);
  st.buffers = std::move(stats);
  SHOAL_RETURN_IF_ERROR(b.status());
  set_slot(g, from, final_slot);
  t = std::move(g);
  return st;
}

Status build_stage_forward(Graph& t, const PipelinePlan& plan, const StageOptions& o) {
  if (t.outputs().size() != 1)
    return invalid_argument("pipeline: an evaluation graph has one output (its logits), not {}",
                            t.outputs().size());
  SHOAL_RETURN_IF_ERROR(check(o, plan));
  StageOptions one = o;
  one.micro_batches = 1;
  Graph g;
  graph::Builder b(g);
  StageCopier copy(t, g, plan, one);
  std::vector<Value> outs;  // each chunk's: a send's token, or the logits
  for (int c = 0; c < o.chunks; ++c) {
    SHOAL_ASSIGN_OR_RETURN(
        auto y, copy.forward(c * o.stages + o.stage, 0, b.scalar(0.0), {t.outputs()[0]}));
    outs.push_back(y[0]);
  }
  SHOAL_RETURN_IF_ERROR(b.status());
  g.mark_output(outs.back());  // output 0: the logits on the last stage
  for (std::size_t c = 0; c + 1 < outs.size(); ++c) g.mark_output(outs[c]);
  t = std::move(g);
  return ok_status();
}

}  // namespace shoal::mp
