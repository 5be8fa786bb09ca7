// The composition of dist/layout.h: which passes run, over which groups of
// ranks, in which order, for --dp x --tp x --pp with --zero and
// --micro-batches.
#include <mutex>

#include "dist/layout_binding.h"
#include "shoal/collective/registry.h"
#include "shoal/core/logging.h"
#include "shoal/dist/layout.h"
#include "shoal/dp/data_parallel.h"
#include "shoal/mp/accumulate.h"
#include "shoal/mp/pipeline.h"
#include "shoal/mp/tensor_parallel.h"

namespace shoal::dist {
namespace {

using ForwardPass = std::function<Result<train::TrainOptions::ParamSlices>(graph::Graph&)>;

// Sub-communicators live as long as the process (the trainers built over
// them hold their ids).
comm::Communicator* keep(std::unique_ptr<comm::Communicator> c) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<comm::Communicator>> kept;
  std::lock_guard<std::mutex> lk(mu);
  kept.push_back(std::move(c));
  return kept.back().get();
}

// Two forward passes, one after the other: `inner` slices the parameters,
// `outer` splits the slices again (ZeRO-3's row blocks of tensor-parallel
// slices). A rank's piece is outer's of inner's; the whole tensor is
// inner's gather of outer's.
train::TrainOptions::ParamSlices compose(train::TrainOptions::ParamSlices inner,
                                         train::TrainOptions::ParamSlices outer) {
  train::TrainOptions::ParamSlices ps = outer;
  ps.names.insert(inner.names.begin(), inner.names.end());
  ps.reports = inner.reports && outer.reports;
  ps.eval_in_lockstep = inner.eval_in_lockstep || outer.eval_in_lockstep;
  if (!ps.correct.valid()) ps.correct = inner.correct;  // TP's vocabulary-parallel loss
  ps.slice = [inner, outer](const std::string& p, const Tensor& whole) {
    const Tensor mid = inner.names.count(p) ? inner.slice(p, whole) : whole;
    return outer.names.count(p) ? outer.slice(p, mid) : mid;
  };
  ps.gather = [inner, outer](const std::string& p, const Tensor& mine) -> Result<Tensor> {
    Tensor mid = mine;
    if (outer.names.count(p)) {
      SHOAL_ASSIGN_OR_RETURN(mid, outer.gather(p, mine));
    }
    if (!inner.names.count(p)) return mid;
    return inner.gather(p, mid);
  };
  return ps;
}

// ZeRO-3 over tensor-parallel slices: `inner` (tensor parallelism's
// forward pass) slices the parameters, the ZeRO-3 pass attach_group just
// installed splits the slices into row blocks gathered where the step uses
// them.
void compose_forward(train::TrainOptions& o, ForwardPass inner) {
  ForwardPass z3_pass = o.forward_pass;
  o.forward_pass = [inner, z3_pass](graph::Graph& g) -> Result<train::TrainOptions::ParamSlices> {
    SHOAL_ASSIGN_OR_RETURN(auto tp, inner(g));
    SHOAL_ASSIGN_OR_RETURN(auto z3, z3_pass(g));
    return compose(std::move(tp), std::move(z3));
  };
}

// Tensor parallelism over groups of T consecutive ranks; with more ranks
// than T, data parallelism across the groups (each gradient, sliced or
// whole, all-reduced among the ranks holding the same slice).
Status attach_tp(train::TrainOptions& o, comm::Communicator& c, const Layout& l,
                 const dp::DpOptions& d) {
  if (d.zero > 0 && c.size() == l.tp)
    return invalid_argument(
        "--zero {} with --tp {} on {} ranks: no data-parallel group to shard over (run D x {} "
        "ranks, D > 1)",
        d.zero, l.tp, c.size(), l.tp);
  o.peers = dp::peers(c);
  const bool copied = micro_batches(l) > 1;  // per micro-batch by gradient accumulation
  if (c.size() == l.tp)
    return mp::attach_tensor_parallel(o, collective::register_communicator(&c, false),
                                      l.sequence_parallel, copied);
  SHOAL_ASSIGN_OR_RETURN(auto tp, c.split(c.rank() / l.tp, c.rank()));
  SHOAL_ASSIGN_OR_RETURN(auto dp, c.split(c.rank() % l.tp, c.rank()));
  comm::Communicator* tpc = keep(std::move(tp));
  comm::Communicator* dpc = keep(std::move(dp));
  SHOAL_RETURN_IF_ERROR(mp::attach_tensor_parallel(o, collective::register_communicator(tpc, false),
                                                   l.sequence_parallel, copied));
  const bool lead = c.rank() == 0;
  if (lead) SHOAL_LOG_INFO("{} data-parallel groups x {} tensor-parallel ranks", dpc->size(), l.tp);
  // ZeRO over each slice's data-parallel group: the ranks holding the same
  // slices shard its gradients and state among them (3: the slices too).
  const ForwardPass tp_pass = o.forward_pass;
  SHOAL_RETURN_IF_ERROR(dp::attach_group(o, *dpc, d, lead));
  if (d.zero == 3) compose_forward(o, tp_pass);
  return ok_status();
}

// Pipeline stages over groups of P consecutive ranks; with more ranks than
// P, data parallelism across the groups (each stage's gradients all-reduced
// among the ranks holding that stage).
Status attach_pp(train::TrainOptions& o, comm::Communicator& c, const Layout& l,
                 const dp::DpOptions& d) {
  const int m = micro_batches(l);
  // ZeRO-3 would gather every parameter before each micro-batch's forward
  // and backward: m times its traffic per step, where a stage holds few
  // parameters anyway. DeepSpeed's pipeline engine refuses ZeRO-2 and 3.
  if (d.zero == 3)
    return invalid_argument(
        "--pp {} with --zero 3: a stage would gather each parameter again for every one of "
        "its --micro-batches {} (forward and backward); shard the optimizer state and "
        "gradients with --zero 1 or 2, or split the layers further with --tp",
        l.pp, m);
  if (d.zero > 0 && c.size() == l.pp * l.tp)
    return invalid_argument(
        "--zero {} with --pp {}{} on {} ranks: no data-parallel group to shard over (run D x {} "
        "ranks, D > 1)",
        d.zero, l.pp, l.tp > 1 ? fmt::format(" --tp {}", l.tp) : "", c.size(), l.pp * l.tp);
  o.peers = dp::peers(c);
  mp::PipelineOptions po;
  po.stages = l.pp;
  po.micro_batches = m;
  SHOAL_ASSIGN_OR_RETURN(po.schedule, mp::parse_schedule(l.pp_schedule));
  po.cuts = l.pp_cuts;
  po.chunks = l.pp_virtual;
  const int T = l.tp, P = l.pp, r = c.rank();
  const LayoutPlace at = place_in_layout(r, T, P);
  if (T > 1) {  // each stage's T ranks split its layers
    SHOAL_ASSIGN_OR_RETURN(auto tp, c.split(r / T, r));
    SHOAL_RETURN_IF_ERROR(
        mp::attach_tensor_parallel(o, collective::register_communicator(keep(std::move(tp)), false),
                                   l.sequence_parallel, true));
  }
  comm::Communicator* ppc = &c;
  if (c.size() != P) {
    SHOAL_ASSIGN_OR_RETURN(auto pp, c.split(at.group * T + at.tensor, r));
    ppc = keep(std::move(pp));
  }
  o.data_rank = 0;
  o.data_world = 1;
  SHOAL_RETURN_IF_ERROR(mp::attach_pipeline(o, *ppc, po));
  if (c.size() == P * T) return ok_status();
  // The ranks holding the same stage and slice all-reduce its gradients.
  SHOAL_ASSIGN_OR_RETURN(auto dp, c.split(r % (P * T), r));
  comm::Communicator* dpc = keep(std::move(dp));
  if (r == 0)
    SHOAL_LOG_INFO("{} data-parallel groups x {} pipeline stages{}", dpc->size(), P,
                   T > 1 ? fmt::format(" x {} tensor-parallel ranks", T) : "");
  return dp::attach_group(o, *dpc, d, r == 0);
}

}  // namespace

int micro_batches(const Layout& l) {
  return l.micro_batches > 0 ? l.micro_batches : l.pp > 1 ? 4 : 1;
}

Status validate(const Layout& l, const dp::DpOptions& d) {
  SHOAL_RETURN_IF_ERROR(dp::validate(d));
  if (l.tp < 1 || l.dp < 0 || l.pp < 1)
    return invalid_argument("--tp {} / --dp {} / --pp {} out of range", l.tp, l.dp, l.pp);
  if (l.sequence_parallel && l.tp < 2)
    return invalid_argument(
        "--sequence-parallel splits what tensor-parallel ranks repeat: it needs --tp > 1, got "
        "--tp {}",
        l.tp);
  if (l.micro_batches < 0)
    return invalid_argument("--micro-batches {} must be >= 1", l.micro_batches);
  const int m = micro_batches(l);
  // Without --pp, micro-batches accumulate gradients (mp/accumulate.h).
  if (m > 1 && l.pp == 1 && d.zero == 3)
    return invalid_argument(
        "--micro-batches {} with --zero 3 would gather every parameter again for each "
        "micro-batch (forward and backward): accumulate with --zero 1 or 2",
        m);
  if (l.pp < 2 && !l.pp_cuts.empty())
    return invalid_argument("--pp-cuts {} places a pipeline's cuts: it needs --pp > 1, got --pp {}",
                            fmt::join(l.pp_cuts, ","), l.pp);
  if (l.pp < 2 && l.pp_schedule != "1f1b")
    return invalid_argument(
        "--pp-schedule {} orders a pipeline's micro-batches: it needs --pp > 1, got --pp {} "
        "(gradient accumulation runs one micro-batch's forward and backward at a time)",
        l.pp_schedule, l.pp);
  if (l.pp_virtual < 1 || (l.pp_virtual > 1 && l.pp < 2))
    return invalid_argument(
        "--pp-virtual {} interleaves a pipeline's stages: it needs --pp > 1, got --pp {}",
        l.pp_virtual, l.pp);
  if (l.pp_virtual > 1 && m % l.pp != 0)
    return invalid_argument(
        "--pp-virtual {} takes micro-batches in groups of --pp {}: --micro-batches {} is not a "
        "multiple of it",
        l.pp_virtual, l.pp, m);
  return ok_status();
}

Status check_layout(const Layout& l, const dp::DpOptions& d, int ranks) {
  SHOAL_RETURN_IF_ERROR(validate(l, d));
  // The model's split: "--tp T", "--pp P" or "--tp T x --pp P".
  const std::string split = l.pp == 1   ? fmt::format("--tp {}", l.tp)
                            : l.tp == 1 ? fmt::format("--pp {}", l.pp)
                                        : fmt::format("--tp {} x --pp {}", l.tp, l.pp);
  if (ranks % (l.tp * l.pp) != 0)
    return invalid_argument("{} must divide the job's {} ranks", split, ranks);
  if (l.dp > 0 && l.dp * l.tp * l.pp != ranks)
    return invalid_argument("--dp {} x {} is {} ranks, the job has {}", l.dp, split,
                            l.dp * l.tp * l.pp, ranks);
  return ok_status();
}

Status attach(train::TrainOptions& o, comm::Communicator& c, const Layout& l,
              const dp::DpOptions& d) {
  SHOAL_RETURN_IF_ERROR(check_layout(l, d, c.size()));
  const int m = micro_batches(l);
  o.rank = c.rank();
  o.world = c.size();
  // Gradient accumulation wraps what the other passes did to the forward.
  if (l.pp == 1 && l.tp == 1) SHOAL_RETURN_IF_ERROR(mp::attach_accumulation(o, m));
  if (c.size() == 1) return ok_status();  // one process: nothing to synchronize
  train::Peers::Options named = dp::named_options(d);
  named.insert(named.end(), {{"--tp", std::to_string(l.tp)},
                             {"--sequence-parallel", l.sequence_parallel ? "on" : "off"},
                             {"--pp", std::to_string(l.pp)},
                             {"--micro-batches", std::to_string(m)},
                             {"--pp-schedule", l.pp_schedule},
                             {"--pp-virtual", std::to_string(l.pp_virtual)},
                             {"--pp-cuts", fmt::format("{}", fmt::join(l.pp_cuts, ","))}});
  SHOAL_RETURN_IF_ERROR(dp::agree_options(c, named));
  SHOAL_RETURN_IF_ERROR(bind_to_layout(c.rank(), c.size(), l.tp, l.pp));
  if (l.pp > 1) return attach_pp(o, c, l, d);
  if (l.tp > 1) {
    SHOAL_RETURN_IF_ERROR(attach_tp(o, c, l, d));
    return mp::attach_accumulation(o, m);
  }
  return dp::attach(o, c, d);
}

}  // namespace shoal::dist
