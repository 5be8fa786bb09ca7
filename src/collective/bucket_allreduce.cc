// The "allreduce_bucket" graph op (collective/ops.h): several tensors
// all-reduced as one buffer, asynchronously when the communicator was
// registered with overlap. dp::inject_allreduce groups the gradients into
// these; tensor parallelism uses it for the gradient of tp_copy.
#include <sched.h>

#include <mutex>

#include "collective/op_group.h"
#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/core/env.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/kernel.h"

namespace shoal::collective {
namespace {

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

void register_bucket_allreduce() {
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
          const std::int64_t id = n.attrs.get_int_or("comm", -1);
          comm::Communicator* c = communicator(id);
          if (!c)
            return failed_precondition("{}: no communicator registered as id {}", n.label(), id);
          SHOAL_ASSIGN_OR_RETURN(comm::ReduceOp op, reduce_op_attr(n));
          SHOAL_ASSIGN_OR_RETURN(DType wire, parse_dtype(n.attrs.get_string_or("wire", "f32")));
          SHOAL_ASSIGN_OR_RETURN(bool yield, env::get_bool("SHOAL_DP_YIELD", true));
          return std::unique_ptr<runtime::Kernel>(
              std::make_unique<BucketKernel>(c, op, wire, yield, overlapped(id), in));
        });
  });
}

void register_ops() {
  register_bucket_allreduce();
  detail::register_allgather_reduce_scatter();
  detail::register_broadcast_reduce();
  detail::register_scatter_gather();
}

}  // namespace shoal::collective
