// Gradient accumulation: `shoal train --micro-batches M` without --pp.
//
// Each step runs the forward and backward of M micro-batches of batch / M
// rows in turn, sums their gradients and makes one update: the step of the
// whole batch (each micro-batch's loss weighted 1/M; equal up to the order
// of the sums), with one micro-batch's activations alive at a time. It is
// the one-stage case of the pipeline's 1F1B (mp/pipeline.h): the same step
// builder, no cut and nothing sent. What HF Trainer calls
// gradient_accumulation_steps and DeepSpeed gradient_accumulation_steps,
// except that the batch stays the batch: --batch 64 --micro-batches 4 trains
// on 64 samples per update, 16 at a time.
//
// Composes with data parallelism and ZeRO-1/2 (their passes see the summed
// gradients: one all-reduce or reduce-scatter per step, not per
// micro-batch) and with tensor parallelism (its rewrite of the forward, an
// installed forward_pass, runs first; the step then copies the split
// forward per micro-batch). Not with ZeRO-3 (refused by dist::validate).
// Batch norm normalizes each micro-batch by its own statistics (as
// PyTorch's accumulation loop does, and as data-parallel ranks without
// synchronized batch norm do), and its running statistics pass through the
// micro-batches in turn.
#pragma once

#include "shoal/core/status.h"
#include "shoal/train/trainer.h"

namespace shoal::mp {

// Makes `o` run each step as `micro_batches` (> 1) micro-batches.
Status attach_accumulation(train::TrainOptions& o, int micro_batches);

}  // namespace shoal::mp
