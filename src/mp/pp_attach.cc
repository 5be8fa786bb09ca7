// Pipeline parallelism in the trainer (mp/pipeline.h): the step pass that
// builds this rank's stage, the evaluation graphs cut the same way, and
// the parameters each stage holds (the others' are empty; checkpoints
// hold every tensor, broadcast from the stage that holds it).
#include <algorithm>
#include <memory>
#include <optional>

#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/core/logging.h"
#include "shoal/mp/pipeline.h"
#include "shoal/mp/tensor_parallel.h"

namespace shoal::mp {
namespace {

// What the step pass learns and the evaluation graphs reuse.
struct Shared {
  PipelinePlan plan;
  std::vector<std::vector<std::string>> owners;  // per piece (a stage's chunk)
  std::map<std::string, int> stage_of;           // the first stage that holds it
  std::map<std::string, std::vector<int>> holders;
  std::map<std::string, Shape> shape_of;                   // whole
  std::vector<std::unique_ptr<comm::Communicator>> comms;  // the two directions
  // Slices within a stage (tensor parallelism inside each stage), from the
  // forward pass this pipeline wraps.
  std::optional<train::TrainOptions::ParamSlices> inner;
  bool inner_has(const std::string& p) const { return inner && inner->names.count(p); }
};

train::TrainOptions::ParamSlices placement(std::shared_ptr<Shared> sh, comm::Communicator* pipe) {
  train::TrainOptions::ParamSlices ps;
  const int stage = pipe->rank();
  for (const auto& [name, s] : sh->stage_of) ps.names.insert(name);
  ps.reports = stage + 1 == pipe->size();
  ps.slice = [sh, stage](const std::string& p, const Tensor& whole) {
    const auto& h = sh->holders.at(p);
    if (std::find(h.begin(), h.end(), stage) == h.end()) return Tensor::empty({0}, DType::kF32);
    return sh->inner_has(p) ? sh->inner->slice(p, whole) : whole;
  };
  // The owning stage's ranks first gather their slices (collective within
  // the stage), then the owner's whole tensor is broadcast along the pipeline.
  ps.gather = [sh, pipe, stage](const std::string& p, const Tensor& mine) -> Result<Tensor> {
    const int owner = sh->stage_of.at(p);
    Tensor whole = Tensor::zeros(sh->shape_of.at(p), DType::kF32);
    if (owner == stage && sh->inner_has(p)) {
      SHOAL_ASSIGN_OR_RETURN(whole, sh->inner->gather(p, mine));
    } else if (owner == stage) {
      whole = mine.clone();
    }
    SHOAL_RETURN_IF_ERROR(
        pipe->broadcast(whole.raw_data(), static_cast<std::size_t>(whole.numel()), DType::kF32,
                        owner)
            .with_context(fmt::format("gathering '{}' from pipeline stage {}", p, owner)));
    return whole;
  };
  return ps;
}

// Parameters several stages hold (a tied embedding and output head): each
// holder's gradient becomes the sum over the holders, so all apply the same
// update to the same values. One communicator per set of holders, split in
// the same order on every stage; the sums run last in the step, after the
// loss's broadcast, in the same order on every holder.
Status tie_shared(Shared& sh, comm::Communicator& pipe, graph::Graph& g,
                  std::vector<train::ParamRef>& params) {
  std::map<std::vector<int>, std::int64_t> comm_of;
  for (const auto& [name, h] : sh.holders)
    if (h.size() > 1) comm_of.emplace(h, -1);
  const int stage = pipe.rank();
  int color = 0;
  for (auto& [h, id] : comm_of) {
    const bool member = std::find(h.begin(), h.end(), stage) != h.end();
    SHOAL_ASSIGN_OR_RETURN(auto c, pipe.split(member ? color : -1, stage));
    ++color;
    if (!c) continue;
    id = collective::register_communicator(c.get(), false);
    sh.comms.push_back(std::move(c));
  }
  std::int64_t last_slot = 0;
  for (int n = 0; n < g.num_nodes(); ++n) last_slot = std::max(last_slot, g.node(n).slot);
  graph::Builder b(g);
  const int from = g.num_nodes();
  for (auto& r : params) {
    const auto& h = sh.holders.at(r.name);
    if (h.size() < 2) continue;
    // tp_allreduce: a plain sum over the group (allreduce_bucket would ask
    // the planner to pack it in place, and so would the data-parallel bucket
    // that reads it).
    r.grad = b.op("tp_allreduce", {r.grad}, {{"comm", comm_of.at(h)}}, "pipeline/tied/" + r.name);
  }
  for (int n = from; n < g.num_nodes(); ++n) g.mutable_node(n).slot = last_slot;
  return b.status().with_context("summing the gradients of parameters several stages hold");
}

using ForwardPass = std::function<Result<train::TrainOptions::ParamSlices>(graph::Graph&)>;

// Cuts the training graph into pieces and records which stage holds which
// parameter (a parameter used by several pieces is held by each of their
// stages, its gradient summed over them).
Status cut_and_place(Shared& sh, const StageOptions& so, const PipelineOptions& po, graph::Graph& g,
                     const train::TrainOptions::Step& st) {
  SHOAL_ASSIGN_OR_RETURN(sh.plan, plan_pipeline(g, {st.loss, st.logits}, so.stages * so.chunks,
                                                po.cuts, Interleave{so.stages, so.micro_batches}));
  SHOAL_ASSIGN_OR_RETURN(sh.owners, stage_params(g, sh.plan));
  for (int s = 0; s < so.stages; ++s)  // stage s holds pieces s, s + stages, ...
    for (std::size_t k = static_cast<std::size_t>(s); k < sh.owners.size(); k += so.stages)
      for (const auto& p : sh.owners[k]) {
        sh.stage_of.try_emplace(p, s);
        auto& h = sh.holders[p];
        if (std::find(h.begin(), h.end(), s) == h.end()) h.push_back(s);
      }
  for (const auto& r : st.params)
    if (!sh.stage_of.count(r.name))
      return invalid_argument("pipeline: no stage uses parameter '{}'", r.name);
  return ok_status();
}

// The step pass: this rank's stage of the whole step, every micro-batch's
// forward and backward in the schedule's order.
Result<train::TrainOptions::ParamSlices> stage_step(const std::shared_ptr<Shared>& sh,
                                                    const StageOptions& so,
                                                    const PipelineOptions& po,
                                                    comm::Communicator* c, bool lead,
                                                    const ForwardPass& inner, graph::Graph& g,
                                                    train::TrainOptions::Step& st) {
  if (!st.buffers.empty())
    return invalid_argument(
        "--pp {}: the model keeps running statistics (batch norm: {} buffers, the first '{}'), "
        "which a pipeline's stages do not carry yet",
        so.stages, st.buffers.size(), st.buffers.front().first);
  for (const auto& r : st.params) sh->shape_of[r.name] = g.type(r.param).shape;
  if (inner) {
    SHOAL_ASSIGN_OR_RETURN(sh->inner, inner(g));
  }
  SHOAL_RETURN_IF_ERROR(cut_and_place(*sh, so, po, g, st));
  if (lead)
    SHOAL_LOG_INFO("pipeline of {} stages{}, {} micro-batches per batch, schedule {}:\n{}",
                   so.stages,
                   so.chunks > 1 ? fmt::format(" of {} interleaved chunks each", so.chunks) : "",
                   so.micro_batches, so.schedule == Schedule::kGPipe ? "gpipe" : "1f1b",
                   sh->plan.str(g, so.stages));
  SHOAL_ASSIGN_OR_RETURN(StageStep step, build_stage_step(g, st.loss, st.logits, sh->plan, so));
  SHOAL_RETURN_IF_ERROR(tie_shared(*sh, *c, g, step.params));
  for (const auto& [p, h] : sh->holders)
    if (h.size() > 1 && lead)
      SHOAL_LOG_INFO("pipeline: '{}' is held by stages {}, its gradient summed over them", p,
                     fmt::join(h, ", "));
  st.loss = step.loss;
  st.logits = step.logits;
  st.params = std::move(step.params);
  return placement(sh, c);
}

// The forward pass of the evaluation graphs: cut where the training graph
// was, each rank running its stage's forward.
Result<train::TrainOptions::ParamSlices> stage_forward(const std::shared_ptr<Shared>& sh,
                                                       const StageOptions& so,
                                                       comm::Communicator* c,
                                                       const ForwardPass& inner, graph::Graph& g) {
  if (inner) SHOAL_RETURN_IF_ERROR(inner(g).status());
  if (g.outputs().size() != 1)
    return invalid_argument("pipeline: an evaluation graph has one output, not {}",
                            g.outputs().size());
  SHOAL_ASSIGN_OR_RETURN(PipelinePlan plan,
                         plan_pipeline(g, {g.outputs()[0]}, so.stages * so.chunks, sh->plan.cuts));
  SHOAL_ASSIGN_OR_RETURN(auto owners, stage_params(g, plan));
  if (owners != sh->owners)
    return internal_error(
        "pipeline: the evaluation graph's cuts place the parameters differently from the "
        "training graph's");
  SHOAL_RETURN_IF_ERROR(build_stage_forward(g, plan, so));
  return placement(sh, c);
}

}  // namespace

Status attach_pipeline(train::TrainOptions& o, comm::Communicator& pipe,
                       const PipelineOptions& po) {
  if (pipe.size() != po.stages)
    return invalid_argument("--pp {}: the pipeline group has {} ranks", po.stages, pipe.size());
  register_pipeline_ops();
  collective::register_ops();
  register_tensor_parallel_ops();  // tp_allreduce: the sums of tied parameters' gradients
  auto sh = std::make_shared<Shared>();
  for (int k = 0; k < 2; ++k) {
    SHOAL_ASSIGN_OR_RETURN(auto c, pipe.split(0, pipe.rank()));
    sh->comms.push_back(std::move(c));
  }
  StageOptions so;
  so.stage = pipe.rank();
  so.stages = pipe.size();
  so.micro_batches = po.micro_batches;
  so.schedule = po.schedule;
  so.chunks = po.chunks;
  so.fwd_comm = collective::register_communicator(sh->comms[0].get(), false);
  so.bwd_comm = collective::register_communicator(sh->comms[1].get(), false);
  so.loss_comm = collective::register_communicator(&pipe, false);
  o.micro_batches = po.micro_batches;
  if (o.data_world <= 0) {  // every stage sees the same batches
    o.data_rank = 0;
    o.data_world = 1;
  }
  comm::Communicator* c = &pipe;
  const bool lead = o.rank == 0;
  // A forward pass already installed (tensor parallelism) rewrites each
  // stage's graphs first; its slices live inside the stage that owns them.
  ForwardPass inner = o.forward_pass;
  o.step_pass = [sh, so, c, po, lead, inner](graph::Graph& g, train::TrainOptions::Step& st) {
    return stage_step(sh, so, po, c, lead, inner, g, st);
  };
  o.forward_pass = [sh, so, c, inner](graph::Graph& g) {
    return stage_forward(sh, so, c, inner, g);
  };
  return ok_status();
}

}  // namespace shoal::mp
