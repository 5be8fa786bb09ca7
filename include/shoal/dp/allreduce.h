// Data parallelism as a graph pass, the nGraph way. inject_allreduce() runs
// between autodiff and the optimizer update: it groups the gradients into
// buckets in the order the backward pass produces them (the last layers'
// first), and replaces each bucket by one "allreduce_bucket" node whose
// async kernel packs the bucket's gradients into one buffer, starts
// Communicator::allreduce_async(avg) on it and, when the executor waits
// (before the first update that reads a gradient of that bucket), unpacks
// the averaged values. The executor starts async nodes as soon as their
// inputs exist, so each bucket's all-reduce overlaps the rest of the
// backward pass.
//
// Buckets: the first is small (first_bucket_mb) so communication starts
// early; the others fill up to bucket_mb, as PyTorch DDP does, except that
// a gradient of at least first_bucket_mb closes its bucket (what comes
// after it is produced later, and would hold it back: on the CNN this lets
// the 1.6 MB fc1 gradient travel while the conv layers' backward runs,
// where DDP's rule waits for the whole backward pass). An f32 bucket asks
// the memory planner to place its gradients back to back with the outputs
// over them and is all-reduced in place; where the planner refuses (or the
// wire is f16/bf16) the kernel copies into a buffer of its own and back.
//
// Wire dtype f16/bf16: each gradient is rounded to half precision when
// packed, the collective accumulates every hop in f32 and rounds its
// result to the wire type, and unpacking widens back to f32.
#pragma once

#include <string>
#include <vector>

#include "shoal/graph/graph.h"
#include "shoal/train/optim.h"

namespace shoal::dp {

struct DpOptions {
  double bucket_mb = 25;       // cap per bucket (MiB of f32 gradient)
  double first_bucket_mb = 1;  // cap of the first bucket
  DType wire = DType::kF32;    // f32, f16 or bf16
  // Bucket all-reduces on the progress thread, overlapped with the backward
  // pass (kOn), or on the compute thread (kOff); see
  // collective::register_communicator.
  // kAuto (dp::attach): off when the ranks on this host times the compute
  // threads of each fill every core this process may use.
  enum class Overlap { kAuto, kOn, kOff };
  Overlap overlap = Overlap::kAuto;
  // 1: shard the optimizer state instead of all-reducing; 2: the gradients
  // too, reduce-scattered in buckets of zero_bucket_mb; 3: the parameters
  // too (dp/sharded.h). How ranks split the model besides (--tp, --pp,
  // --micro-batches) is dist::Layout's.
  int zero = 0;
  double zero_bucket_mb = 1;
};
Result<DpOptions::Overlap> parse_overlap(const std::string& s);  // auto, on, off
// The wire a --wire flag asks for: as given, or when empty bf16 if the step
// computes in bf16 (--precision bf16) and ZeRO-3, whose collectives carry
// f32, is off, else f32. The CLI and the Python bindings both read it here.
Result<DType> wire_for(const std::string& flag, const std::string& precision, int zero);
Status validate(const DpOptions& o);

struct Bucket {
  std::vector<std::string> params;  // in packing order
  std::int64_t elements = 0;
};
struct BucketPlan {
  std::vector<Bucket> buckets;
  std::string str() const;  // one line per bucket, for logs
};

// MiB of f32 as a number of elements (at least 1).
std::int64_t f32_elements(double mib);
// The parameters' indices in buckets, in the order the backward pass
// produces their gradients (autodiff's node order): the first bucket holds
// up to first_cap elements, the others up to cap, and a gradient of at
// least close_at elements closes its bucket.
std::vector<std::vector<std::size_t>> group_in_backward_order(
    const graph::Graph& g, const std::vector<train::ParamRef>& params, std::int64_t first_cap,
    std::int64_t cap, std::int64_t close_at);

// Replaces each ParamRef.grad with its averaged value from a bucket
// all-reduce over communicator `comm_id`. Fits train::TrainOptions::grad_pass.
Result<BucketPlan> inject_allreduce(graph::Graph& g, std::vector<train::ParamRef>& params,
                                    std::int64_t comm_id, const DpOptions& o = {});

}  // namespace shoal::dp
