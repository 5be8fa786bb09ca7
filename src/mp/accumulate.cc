// Gradient accumulation (mp/accumulate.h): the pipeline's step builder with
// one stage.
#include "shoal/mp/accumulate.h"

#include "shoal/core/logging.h"
#include "shoal/mp/pipeline.h"

namespace shoal::mp {

Status attach_accumulation(train::TrainOptions& o, int micro_batches) {
  if (micro_batches < 2) return ok_status();
  if (o.step_pass)
    return failed_precondition(
        "--micro-batches {}: another pass (a pipeline) already builds the step", micro_batches);
  o.micro_batches = micro_batches;
  if (o.rank == 0)
    SHOAL_LOG_INFO("gradient accumulation: each batch of {} as {} micro-batches of {}", o.batch,
                   micro_batches, o.batch / micro_batches);
  // A forward pass already installed (tensor parallelism) rewrites the
  // micro-batch's forward first; it still rewrites the evaluation graphs.
  auto inner = o.forward_pass;
  o.step_pass = [micro_batches, inner](
                    graph::Graph& g,
                    train::TrainOptions::Step& st) -> Result<train::TrainOptions::ParamSlices> {
    train::TrainOptions::ParamSlices slices;  // none: every parameter whole
    if (inner) {
      SHOAL_ASSIGN_OR_RETURN(slices, inner(g));
    }
    std::vector<graph::Value> outputs = {st.loss, st.logits};
    for (const auto& [name, v] : st.buffers) outputs.push_back(v);  // batch norm's statistics
    SHOAL_ASSIGN_OR_RETURN(PipelinePlan plan, plan_pipeline(g, outputs, 1));
    StageOptions so;  // stage 0 of 1: no cut, nothing sent, the loss not broadcast
    so.micro_batches = micro_batches;
    so.schedule = Schedule::k1F1B;  // forward, backward, forward, ...: one alive at a time
    SHOAL_ASSIGN_OR_RETURN(StageStep step,
                           build_stage_step(g, st.loss, st.logits, plan, so, st.buffers));
    st.loss = step.loss;
    st.logits = step.logits;
    st.params = std::move(step.params);
    st.buffers = std::move(step.buffers);
    return slices;
  };
  return ok_status();
}

}  // namespace shoal::mp
