// One pipeline stage's step graph from the forward of one micro-batch
// (mp/pipeline.h): the stage's nodes copied once per micro-batch, the
// boundary sends and receives, autodiff per micro-batch, the gradients
// summed, and every node given the slot of its micro-batch's forward or
// backward in the schedule.
#include "shoal/mp/pipeline.h"

#include <map>

#include "shoal/graph/passes.h"
#include "shoal/mp/collectives.h"

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

  // Micro-batch i's forward on this stage: its output (the value crossing
  // the next cut, or the template's `finals` on the last stage).
  Result<std::vector<Value>> forward(int i, Value after, const std::vector<Value>& finals) {
    micro_ = i;
    local_.clear();
    const auto [first, last] = plan_.range(o_.stage);
    if (o_.stage > 0) {
      const Value cut = plan_.candidates[plan_.cuts[static_cast<std::size_t>(o_.stage) - 1]].value;
      local_[cut] =
          pp_recv(b_, after, t_.type(cut).shape, link(o_.stage - 1, o_.fwd_comm, o_.bwd_comm));
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
    if (o_.stage + 1 < o_.stages) {
      const Value cut = plan_.candidates[plan_.cuts[static_cast<std::size_t>(o_.stage)]].value;
      SHOAL_ASSIGN_OR_RETURN(Value y, value(cut));
      out.push_back(pp_send(b_, y, link(o_.stage + 1, o_.fwd_comm, o_.bwd_comm)));
      return out;
    }
    for (const Value& f : finals) {
      SHOAL_ASSIGN_OR_RETURN(Value y, value(f));
      out.push_back(y);
    }
    return out;
  }
  const std::map<std::string, Value>& params() const { return params_; }

 private:
  PipeLink link(int peer, std::int64_t comm, std::int64_t grad_comm) const {
    return {comm, grad_comm, peer, micro_};
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
  std::map<std::string, Value> inputs_, params_;
};

void set_slot(Graph& g, int from, std::int64_t slot) {
  for (int id = from; id < g.num_nodes(); ++id) g.mutable_node(id).slot = slot;
}

Status check(const StageOptions& o) {
  if (o.stage < 0 || o.stage >= o.stages || o.micro_batches < 1)
    return invalid_argument("pipeline: stage {} of {}, {} micro-batches", o.stage, o.stages,
                            o.micro_batches);
  return ok_status();
}

}  // namespace

Result<StageStep> build_stage_step(Graph& t, Value loss, Value logits, const PipelinePlan& plan,
                                   const StageOptions& o) {
  SHOAL_RETURN_IF_ERROR(check(o));
  const bool last = o.stage + 1 == o.stages;
  const int m = o.micro_batches;
  Graph g;
  graph::Builder b(g);
  StageCopier copy(t, g, plan, o);
  const auto order = schedule_order(o.schedule, o.stage, o.stages, m);
  std::map<std::pair<int, bool>, std::int64_t> slot;
  for (std::size_t k = 0; k < order.size(); ++k) slot[order[k]] = static_cast<std::int64_t>(k) + 1;
  const std::int64_t final_slot = static_cast<std::int64_t>(order.size()) + 1;

  // Forwards: each micro-batch's objective (the send's token; loss / m last).
  std::vector<Value> objective(static_cast<std::size_t>(m)), after(objective.size()),
      logits_i(objective.size());
  for (int i = 0; i < m; ++i) {
    const int from = g.num_nodes();
    after[i] = b.scalar(0.0);  // orders the receive; its gradient is the backward send
    SHOAL_ASSIGN_OR_RETURN(auto outs, copy.forward(i, after[i], {loss, logits}));
    objective[i] = last ? b.mul(outs[0], b.scalar(1.0 / m)) : outs[0];
    if (last) logits_i[i] = outs[1];
    SHOAL_RETURN_IF_ERROR(b.status().with_context(fmt::format("pipeline stage {}", o.stage)));
    set_slot(g, from, slot.at({i, true}));
  }
  // Backwards: autodiff of each objective; gradients summed in order.
  StageStep st;
  std::vector<Value> wrt;
  for (const auto& [name, v] : copy.params()) {
    st.params.push_back({name, v, {}});
    wrt.push_back(v);
  }
  for (int i = 0; i < m; ++i) {
    const int from = g.num_nodes();
    std::vector<Value> w = wrt;
    if (o.stage > 0) w.push_back(after[i]);
    SHOAL_ASSIGN_OR_RETURN(std::vector<Value> grads, graph::autodiff(g, objective[i], w));
    for (std::size_t p = 0; p < st.params.size(); ++p)
      st.params[p].grad = i == 0 ? grads[p] : b.add(st.params[p].grad, grads[p]);
    if (o.stage > 0) g.mark_output(grads.back());  // the send of dx to the stage before
    SHOAL_RETURN_IF_ERROR(b.status());
    set_slot(g, from, slot.at({i, false}));
  }
  // The loss, summed on the last stage and broadcast to the others; the
  // earlier stages' sum of tokens (zeros) keeps their sends alive.
  const int from = g.num_nodes();
  Value total = objective[0];
  for (int i = 1; i < m; ++i) total = b.add(total, objective[static_cast<std::size_t>(i)]);
  st.loss = broadcast(b, total, o.loss_comm, o.stages - 1);
  if (last) st.logits = m == 1 ? logits_i[0] : b.concat(logits_i, 0);
  SHOAL_RETURN_IF_ERROR(b.status());
  set_slot(g, from, final_slot);
  t = std::move(g);
  return st;
}

Status build_stage_forward(Graph& t, const PipelinePlan& plan, const StageOptions& o) {
  SHOAL_RETURN_IF_ERROR(check(o));
  if (t.outputs().size() != 1)
    return invalid_argument("pipeline: an evaluation graph has one output (its logits), not {}",
                            t.outputs().size());
  StageOptions one = o;
  one.micro_batches = 1;
  Graph g;
  graph::Builder b(g);
  StageCopier copy(t, g, plan, one);
  SHOAL_ASSIGN_OR_RETURN(auto outs, copy.forward(0, b.scalar(0.0), {t.outputs()[0]}));
  SHOAL_RETURN_IF_ERROR(b.status());
  g.mark_output(outs[0]);
  t = std::move(g);
  return ok_status();
}

}  // namespace shoal::mp
