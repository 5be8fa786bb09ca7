#include "shoal/dp/allreduce.h"

#include <sched.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <optional>

#include "shoal/core/env.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/kernel.h"

namespace shoal::dp {
namespace {

struct Registered {
  comm::Communicator* c;
  bool overlap;
};
std::mutex g_mu;
std::vector<Registered>& comms() {
  static std::vector<Registered> v;
  return v;
}

std::optional<Registered> lookup(std::int64_t id) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (id < 0 || id >= static_cast<std::int64_t>(comms().size())) return std::nullopt;
  return comms()[static_cast<std::size_t>(id)];
}

Result<comm::ReduceOp> reduce_op_attr(const graph::Node& n) {
  std::string op = n.attrs.get_string_or("op", "avg");
  if (op == "avg") return comm::ReduceOp::kAvg;
  if (op == "sum") return comm::ReduceOp::kSum;
  return invalid_argument("{}: op '{}' is not avg or sum", n.label(), op);
}

// Packs its inputs into one buffer of the wire dtype, all-reduces it on
// the communicator's progress thread, and unpacks into its outputs when
// the executor waits. Packing and unpacking are Tensor::copy_from between
// the tensors and views into the buffer (it converts f32 <-> f16/bf16).
// Without overlap the same steps run at once on the calling thread.
class BucketKernel final : public runtime::Kernel {
 public:
  BucketKernel(comm::Communicator* c, comm::ReduceOp op, DType wire, bool yield, bool overlap,
               const std::vector<graph::TensorType>& in)
      : c_(c), op_(op), wire_(wire), yield_(yield), overlap_(overlap) {
    for (const auto& t : in) elements_ += num_elements(t.shape);
    if (in.size() == 1 && wire == DType::kF32) return;  // direct: no buffer
    auto buf = Storage::allocate(static_cast<std::size_t>(elements_) * dtype_size(wire));
    std::int64_t off = 0;
    for (const auto& t : in) {
      views_.push_back(Tensor::from_storage(buf, t.shape, wire, off));
      off += num_elements(t.shape);
    }
  }

  // f32 buckets: the executor places the gradients back to back with the
  // outputs over them, and the all-reduce runs in place on that span: no
  // packing copy in, no unpacking copy out. A bucket of one gradient asks
  // too: out of place the collective first copies it into the output (1.6
  // MB per step for the MLP's fc1).
  bool wants_packed_inputs() const override { return wire_ == DType::kF32; }

  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    packed_ = wants_packed_inputs() && packed(in, out);
    // What to all-reduce: the packed span in place; or, for one f32 tensor
    // the planner could not place under its output, from the gradient into
    // the output (the executor keeps the input untouched until the wait);
    // or the kernel's own wire buffer, unpacked into the outputs afterwards.
    const void* send;
    void* recv;
    out_.clear();
    if (packed_) {
      send = recv = out[0].raw_data();
    } else if (views_.empty()) {
      send = in[0].raw_data();
      recv = out[0].raw_data();
    } else {
      for (std::size_t i = 0; i < in.size(); ++i) SHOAL_RETURN_IF_ERROR(views_[i].copy_from(in[i]));
      send = recv = views_[0].raw_data();
      out_.assign(out.begin(), out.end());
    }
    const auto count = static_cast<std::size_t>(elements_);
    if (!overlap_) {  // the whole bucket on this thread: no hand-off
      SHOAL_RETURN_IF_ERROR(c_->allreduce(send, recv, count, wire_, op_));
      return unpack();
    }
    work_ = c_->allreduce_async(send, recv, count, wire_, op_);
    return started();
  }
  bool is_async() const override { return overlap_; }
  Status wait(Deadline dl) override {
    if (!work_) return ok_status();
    Status st = work_->wait(dl);
    if (!st.ok()) return st;
    start_ = work_->started();
    end_ = work_->finished();
    work_.reset();
    return unpack();
  }
  bool work_interval(std::chrono::steady_clock::time_point* s,
                     std::chrono::steady_clock::time_point* e) const override {
    if (start_ == std::chrono::steady_clock::time_point{}) return false;
    *s = start_;
    *e = end_;
    return true;
  }
  const char* impl() const override { return packed_ ? "comm, in place" : "comm"; }

 private:
  // Copies the wire buffer into the outputs when run() packed into it.
  Status unpack() {
    for (std::size_t i = 0; i < out_.size(); ++i)
      SHOAL_RETURN_IF_ERROR(out_[i].copy_from(views_[i]));
    out_.clear();
    return ok_status();
  }
  // After starting the collective the compute thread yields its core once.
  // When every core computes (2 ranks x 1 thread on 2 cores) the progress
  // thread just woken for the bucket otherwise waited for the compute
  // thread's next block: a 2-rank MLP trace showed the first bucket's
  // all-reduce start 0.5 ms late, after the whole fc1 weight-gradient
  // matmul, then run serially with the last bucket. Yielding lets it run
  // its exchange now and sleep. Measured, 6 interleaved pairs each: MLP 2
  // ranks 43.7k -> 48.8k img/s, CNN 3,934 -> 4,278. With a spare core the
  // call returns at once. SHOAL_DP_YIELD=0 turns it off.
  Status started() const {
    if (yield_) sched_yield();
    return ok_status();
  }
  // Inputs back to back in order, each output over its input.
  static bool packed(std::span<const Tensor> in, std::span<Tensor> out) {
    auto* next = static_cast<const std::uint8_t*>(in[0].raw_data());
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (in[i].raw_data() != next || out[i].raw_data() != in[i].raw_data()) return false;
      next += static_cast<std::size_t>(in[i].numel()) * dtype_size(in[i].dtype());
    }
    return true;
  }
  bool packed_ = false;
  comm::Communicator* c_;
  comm::ReduceOp op_;
  DType wire_;
  bool yield_;
  bool overlap_;
  std::int64_t elements_ = 0;
  std::vector<Tensor> views_;  // into one buffer of the wire dtype
  std::vector<Tensor> out_;
  comm::WorkPtr work_;
  std::chrono::steady_clock::time_point start_{}, end_{};
};

}  // namespace

std::int64_t register_communicator(comm::Communicator* c, bool overlap) {
  std::lock_guard<std::mutex> lk(g_mu);
  comms().push_back(Registered{c, overlap});
  return static_cast<std::int64_t>(comms().size()) - 1;
}

comm::Communicator* communicator(std::int64_t id) {
  std::optional<Registered> r = lookup(id);
  return r ? r->c : nullptr;
}

Result<DpOptions::Overlap> parse_overlap(const std::string& s) {
  if (s == "auto") return DpOptions::Overlap::kAuto;
  if (s == "on") return DpOptions::Overlap::kOn;
  if (s == "off") return DpOptions::Overlap::kOff;
  return invalid_argument("--overlap {} is not one of auto, on, off", s);
}

Status validate(const DpOptions& o) {
  if (!(o.bucket_mb > 0)) return invalid_argument("--bucket-mb {} must be > 0", o.bucket_mb);
  if (!(o.first_bucket_mb > 0))
    return invalid_argument("--first-bucket-mb {} must be > 0", o.first_bucket_mb);
  if (o.wire != DType::kF32 && o.wire != DType::kF16 && o.wire != DType::kBF16)
    return invalid_argument("--wire {} is not one of f32, f16, bf16", dtype_name(o.wire));
  if (o.tp < 1 || o.dp < 0 || o.pp < 1)
    return invalid_argument("--tp {} / --dp {} / --pp {} out of range", o.tp, o.dp, o.pp);
  if (o.zero < 0 || o.zero > 3)
    return invalid_argument(
        "--zero {} is not a ZeRO stage: 1 shards the optimizer state, 2 the gradients too, 3 "
        "the parameters too",
        o.zero);
  if (o.sequence_parallel && o.tp < 2)
    return invalid_argument(
        "--sequence-parallel splits what tensor-parallel ranks repeat: it needs --tp > 1, got "
        "--tp {}",
        o.tp);
  if (!(o.zero_bucket_mb > 0))
    return invalid_argument("--zero-bucket-mb {} must be > 0", o.zero_bucket_mb);
  if (o.micro_batches < 1)
    return invalid_argument("--micro-batches {} must be >= 1", o.micro_batches);
  // Without --pp, micro-batches accumulate gradients (mp/accumulate.h).
  if (o.micro_batches > 1 && o.pp == 1 && o.zero == 3)
    return invalid_argument(
        "--micro-batches {} with --zero 3 would gather every parameter again for each "
        "micro-batch (forward and backward): accumulate with --zero 1 or 2",
        o.micro_batches);
  if (o.pp < 2 && !o.pp_cuts.empty())
    return invalid_argument("--pp-cuts {} places a pipeline's cuts: it needs --pp > 1, got --pp {}",
                            fmt::join(o.pp_cuts, ","), o.pp);
  if (o.pp < 2 && o.pp_schedule != "1f1b")
    return invalid_argument(
        "--pp-schedule {} orders a pipeline's micro-batches: it needs --pp > 1, got --pp {} "
        "(gradient accumulation runs one micro-batch's forward and backward at a time)",
        o.pp_schedule, o.pp);
  if (o.pp_virtual < 1 || (o.pp_virtual > 1 && o.pp < 2))
    return invalid_argument(
        "--pp-virtual {} interleaves a pipeline's stages: it needs --pp > 1, "
        "got --pp {}",
        o.pp_virtual, o.pp);
  if (o.pp_virtual > 1 && o.micro_batches % o.pp != 0)
    return invalid_argument(
        "--pp-virtual {} takes micro-batches in groups of --pp {}: --micro-batches {} is not a "
        "multiple of it",
        o.pp_virtual, o.pp, o.micro_batches);
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

void register_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    graph::OpDef d;
    d.name = "allreduce_bucket";
    d.max_inputs = -1;
    d.attrs = {"comm", "op", "wire"};
    d.random = true;  // never constant-folded: its value depends on other ranks
    d.infer =
        [](const graph::Node& n,
           const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
      SHOAL_RETURN_IF_ERROR(reduce_op_attr(n).status());
      SHOAL_ASSIGN_OR_RETURN(DType wire, parse_dtype(n.attrs.get_string_or("wire", "f32")));
      if (wire != DType::kF32 && wire != DType::kF16 && wire != DType::kBF16)
        return invalid_argument("{}: wire dtype {} is not f32, f16 or bf16", n.label(),
                                dtype_name(wire));
      if (in.empty()) return invalid_argument("{}: a bucket needs at least one tensor", n.label());
      for (const auto& t : in)
        if (t.dtype != DType::kF32)
          return invalid_argument("{}: gradients must be f32, got {}", n.label(), t.str());
      return in;
    };
    // Linear in each input: the gradient is the same all-reduce of dy.
    d.grad = [](graph::GradInputs& g) -> std::vector<graph::Value> {
      graph::Value v = g.b.op("allreduce_bucket", g.output_grads, g.node.attrs);
      std::vector<graph::Value> r;
      for (std::size_t i = 0; i < g.output_grads.size(); ++i)
        r.push_back(graph::Value{v.node, static_cast<int>(i)});
      return r;
    };
    graph::OpRegistry::global().add(d);
    runtime::KernelRegistry::cpu().add(
        "allreduce_bucket",
        [](const graph::Node& n,
           const std::vector<graph::TensorType>& in) -> Result<std::unique_ptr<runtime::Kernel>> {
          std::int64_t id = n.attrs.get_int_or("comm", -1);
          std::optional<Registered> reg = lookup(id);
          if (!reg)
            return failed_precondition("{}: no communicator registered as id {}", n.label(), id);
          SHOAL_ASSIGN_OR_RETURN(comm::ReduceOp op, reduce_op_attr(n));
          SHOAL_ASSIGN_OR_RETURN(DType wire, parse_dtype(n.attrs.get_string_or("wire", "f32")));
          SHOAL_ASSIGN_OR_RETURN(bool yield, env::get_bool("SHOAL_DP_YIELD", true));
          return std::unique_ptr<runtime::Kernel>(
              std::make_unique<BucketKernel>(reg->c, op, wire, yield, reg->overlap, in));
        });
  });
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
  register_ops();
  SHOAL_RETURN_IF_ERROR(validate(o));
  if (!lookup(comm_id))
    return failed_precondition("inject_allreduce: no communicator registered as id {}", comm_id);
  // Without overlap nothing is sent before the backward pass ends, so the
  // small first bucket and the closing rule buy nothing: every bucket fills
  // to bucket_mb. Fewer buckets are fewer points where ranks wait for the
  // slowest (each absorbs the jitter since the previous one).
  const bool overlap = o.overlap != DpOptions::Overlap::kOff;
  const std::vector<std::vector<std::size_t>> members = group_in_backward_order(
      g, params, f32_elements(overlap ? o.first_bucket_mb : o.bucket_mb), f32_elements(o.bucket_mb),
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
