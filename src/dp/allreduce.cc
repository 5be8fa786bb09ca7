#include "shoal/dp/allreduce.h"

#include <algorithm>
#include <limits>

#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/graph/builder.h"

namespace shoal::dp {

Result<DpOptions::Overlap> parse_overlap(const std::string& s) {
  if (s == "auto") return DpOptions::Overlap::kAuto;
  if (s == "on") return DpOptions::Overlap::kOn;
  if (s == "off") return DpOptions::Overlap::kOff;
  return invalid_argument("--overlap {} is not one of auto, on, off", s);
}

Result<DType> wire_for(const std::string& flag, const std::string& precision, int zero) {
  if (!flag.empty()) return parse_dtype(flag);
  return precision == "bf16" && zero < 3 ? DType::kBF16 : DType::kF32;
}

Status validate(const DpOptions& o) {
  if (!(o.bucket_mb > 0)) return invalid_argument("--bucket-mb {} must be > 0", o.bucket_mb);
  if (!(o.first_bucket_mb > 0))
    return invalid_argument("--first-bucket-mb {} must be > 0", o.first_bucket_mb);
  if (o.wire != DType::kF32 && o.wire != DType::kF16 && o.wire != DType::kBF16)
    return invalid_argument("--wire {} is not one of f32, f16, bf16", dtype_name(o.wire));
  if (o.zero < 0 || o.zero > 3)
    return invalid_argument(
        "--zero {} is not a ZeRO stage: 1 shards the optimizer state, 2 the gradients too, 3 "
        "the parameters too",
        o.zero);
  // ZeRO-1/2 reduce-scatter the gradients in the wire type (dp/sharded.h);
  // ZeRO-3's gathers and reduce-scatters carry f32: a narrower wire asked
  // for would be ignored without a word.
  if (o.zero == 3 && o.wire != DType::kF32)
    return invalid_argument(
        "--wire {} with --zero 3: ZeRO-3's all-gathers and reduce-scatters carry f32; --wire "
        "narrows the gradients of plain data parallelism and of ZeRO-1 and 2",
        dtype_name(o.wire));
  if (!(o.zero_bucket_mb > 0))
    return invalid_argument("--zero-bucket-mb {} must be > 0", o.zero_bucket_mb);
  return ok_status();
}

std::string BucketPlan::str() const {
  std::string s;
  for (std::size_t i = 0; i < buckets.size(); ++i)
    s += fmt::format("{}bucket {}: {} tensors, {} elements ({})", i ? "\n" : "", i,
                     buckets[i].params.size(), buckets[i].elements,
                     fmt::join(buckets[i].params, " "));
  return s;
}

std::int64_t f32_elements(double mib) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(mib * (1 << 20) / 4));
}

std::vector<std::vector<std::size_t>> group_in_backward_order(
    const graph::Graph& g, const std::vector<train::ParamRef>& params, std::int64_t first_cap,
    std::int64_t cap, std::int64_t close_at) {
  // Autodiff appends the last layers' gradients first, and the executor
  // runs by node id.
  std::vector<std::size_t> order(params.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t c) {
    return params[a].grad.node < params[c].grad.node;
  });
  std::vector<std::vector<std::size_t>> out;
  std::int64_t filled = 0;
  bool closed = true;
  for (std::size_t i : order) {
    const std::int64_t n = num_elements(g.type(params[i].grad).shape);
    if (closed || filled + n > (out.size() == 1 ? first_cap : cap)) {
      out.emplace_back();
      filled = 0;
    }
    out.back().push_back(i);
    filled += n;
    // A big gradient closes its bucket: the gradients after it come later
    // in the backward pass, and waiting for them would delay sending it.
    closed = n >= close_at;
  }
  return out;
}

Result<BucketPlan> inject_allreduce(graph::Graph& g, std::vector<train::ParamRef>& params,
                                    std::int64_t comm_id, const DpOptions& o) {
  collective::register_bucket_allreduce();
  SHOAL_RETURN_IF_ERROR(validate(o));
  if (!collective::communicator(comm_id))
    return failed_precondition("inject_allreduce: no communicator registered as id {}", comm_id);
  // Without overlap nothing is sent before the backward pass ends, so the
  // small first bucket and the closing rule buy nothing: every bucket fills
  // to bucket_mb. Fewer buckets are fewer points where ranks wait for the
  // slowest (each absorbs the jitter since the previous one).
  const bool overlap = o.overlap != DpOptions::Overlap::kOff;
  // Overlapped, no bucket holds more than a quarter of the gradients (nor
  // less than the first bucket's cap): with DDP's 25 MiB cap a small
  // model's whole backward fed one last bucket, sent only once the backward
  // pass ended. The base GPT (3.2 MB of gradients) across 4 hosts at 1
  // Gbit/s: 33 ms of its 52 ms of communication exposed at 25 MiB, 14.5 of
  // 64 at 1 MiB (the step 274 -> 254 ms).
  std::int64_t total = 0;
  for (const auto& p : params) total += num_elements(g.type(p.grad).shape);
  const std::int64_t cap =
      overlap ? std::min(f32_elements(o.bucket_mb),
                         std::max(f32_elements(o.first_bucket_mb), total / 4))
              : f32_elements(o.bucket_mb);
  const std::vector<std::vector<std::size_t>> members = group_in_backward_order(
      g, params, f32_elements(overlap ? o.first_bucket_mb : o.bucket_mb), cap,
      overlap ? f32_elements(o.first_bucket_mb) : std::numeric_limits<std::int64_t>::max());
  BucketPlan plan;
  for (const auto& m : members) {
    Bucket& b = plan.buckets.emplace_back();
    for (std::size_t i : m) {
      b.params.push_back(params[i].name);
      b.elements += num_elements(g.type(params[i].grad).shape);
    }
  }
  graph::Builder b(g);
  for (std::size_t k = 0; k < members.size(); ++k) {
    std::vector<graph::Value> in;
    for (std::size_t i : members[k]) in.push_back(params[i].grad);
    graph::Value v = b.op(
        "allreduce_bucket", in,
        {{"comm", comm_id}, {"op", std::string("avg")}, {"wire", std::string(dtype_name(o.wire))}},
        fmt::format("allreduce/bucket{}", k));
    if (!b.ok()) return b.status().with_context(fmt::format("all-reduce of bucket {}", k));
    for (std::size_t j = 0; j < members[k].size(); ++j)
      params[members[k][j]].grad = graph::Value{v.node, static_cast<int>(j)};
  }
  return plan;
}

}  // namespace shoal::dp
