// pp_send and pp_recv (mp/pipeline.h): the ops at a pipeline's cuts.
//
//   pp_send(x)      sends x to `peer` over `comm` and yields a scalar token
//                   (0). Its gradient is dx = pp_recv from the same peer over
//                   `grad_comm` (the reverse direction), times the token's dy.
//   pp_recv(after)  receives a tensor of `shape` from `peer` over `comm`.
//                   `after` is a scalar whose value is unused (it places the
//                   receive in the graph); its gradient is pp_send of the
//                   received value's dy back to the peer over `grad_comm`,
//                   whose token is that gradient.
// So autodiff of a stage whose objective is its send's token builds the
// stage's backward: receive dy from the next stage, back-propagate, send dx
// to the previous one. `tag` (the cut and the micro-batch, pipe_tag) travels in every frame's
// fingerprint, so stages that disagree on the schedule get an error naming
// both calls instead of each other's tensors.
//
// A send copies x into the node's own buffer and returns while the
// communicator's progress thread sends it: a stage never waits for its
// successor to be ready. The node's previous send is waited for (with the
// communicator's deadline) before the buffer is reused.
#include <cstring>
#include <mutex>

#include "collective/op_group.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/mp/pipeline.h"
#include "shoal/runtime/kernel.h"

namespace shoal::mp {
namespace {

struct Link {
  comm::Communicator* c;
  int peer;
  int tag;
};

Result<Link> link_of(const graph::Node& n) {
  SHOAL_ASSIGN_OR_RETURN(comm::Communicator * c, collective::detail::communicator_of(n));
  const std::int64_t peer = n.attrs.get_int_or("peer", -1);
  if (peer < 0 || peer >= c->size() || peer == c->rank())
    return invalid_argument("{}: peer {} is not another rank of a group of {} (this is rank {})",
                            n.label(), peer, c->size(), c->rank());
  const std::int64_t tag = n.attrs.get_int_or("tag", 0);
  if (tag < 0 || tag > 0x7fffffff)
    return invalid_argument("{}: tag {} out of range", n.label(), tag);
  return Link{c, static_cast<int>(peer), static_cast<int>(tag)};
}

class SendKernel final : public runtime::Kernel {
 public:
  explicit SendKernel(Link l) : l_(l) {}
  ~SendKernel() override {
    if (work_) (void)work_->wait(l_.c->deadline());
  }
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    if (work_) {  // the last step's send of this buffer
      Status st = work_->wait(l_.c->deadline());
      work_.reset();
      if (!st.ok()) return st.with_context(fmt::format("sending to pipeline rank {}", l_.peer));
    }
    const Tensor x = in[0].contiguous();
    if (!buf_.defined() || buf_.numel() != x.numel()) buf_ = Tensor::empty(x.shape(), DType::kF32);
    std::memcpy(buf_.raw_data(), x.raw_data(), x.nbytes());
    work_ = l_.c->send_async(buf_.raw_data(), static_cast<std::size_t>(x.numel()), DType::kF32,
                             l_.peer, l_.tag);
    out[0].data<float>()[0] = 0.0f;
    return ok_status();
  }
  const char* impl() const override { return "comm"; }

 private:
  Link l_;
  Tensor buf_;
  comm::WorkPtr work_;
};

class RecvKernel final : public runtime::Kernel {
 public:
  explicit RecvKernel(Link l) : l_(l) {}
  Status run(const runtime::KernelContext&, std::span<const Tensor>,
             std::span<Tensor> out) override {
    Tensor& y = out[0];
    return l_.c
        ->recv(y.raw_data(), static_cast<std::size_t>(y.numel()), DType::kF32, l_.peer, l_.tag)
        .with_context(fmt::format("receiving micro-batch {} across cut {} from pipeline rank {}",
                                  l_.tag % kMaxMicroBatches, l_.tag / kMaxMicroBatches, l_.peer));
  }
  const char* impl() const override { return "comm"; }

 private:
  Link l_;
};

// The reverse op's attributes: same peer and tag, the directions swapped.
graph::Attrs reversed(const graph::Attrs& a) {
  graph::Attrs r = a;
  r.set("comm", a.get_int_or("grad_comm", -1));
  r.set("grad_comm", a.get_int_or("comm", -1));
  return r;
}

void add_send() {
  graph::OpDef d;
  d.name = "pp_send";
  d.attrs = {"comm", "grad_comm", "peer", "tag"};
  d.random = true;
  d.infer = [](const graph::Node& n,
               const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
    SHOAL_RETURN_IF_ERROR(link_of(n).status());
    if (in[0].dtype != DType::kF32)
      return invalid_argument("{}: sends f32 tensors, got {}", n.label(), in[0].str());
    return std::vector<graph::TensorType>{{DType::kF32, {}}};
  };
  d.grad = [](graph::GradInputs& g) -> std::vector<graph::Value> {
    graph::Attrs a = reversed(g.node.attrs);
    a.set("shape", g.b.shape(g.node.inputs[0]));
    graph::Value dx = g.b.op("pp_recv", {g.output_grads[0]}, a);
    return {g.b.mul(dx, g.output_grads[0])};
  };
  graph::OpRegistry::global().add(d);
  runtime::KernelRegistry::cpu().add(
      "pp_send",
      [](const graph::Node& n,
         const std::vector<graph::TensorType>&) -> Result<std::unique_ptr<runtime::Kernel>> {
        SHOAL_ASSIGN_OR_RETURN(Link l, link_of(n));
        return std::unique_ptr<runtime::Kernel>(std::make_unique<SendKernel>(l));
      });
}

void add_recv() {
  graph::OpDef d;
  d.name = "pp_recv";
  d.attrs = {"comm", "grad_comm", "peer", "tag", "shape"};
  d.random = true;
  d.infer = [](const graph::Node& n,
               const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
    SHOAL_RETURN_IF_ERROR(link_of(n).status());
    if (!in[0].shape.empty())
      return invalid_argument("{}: its input is a scalar that orders it, got {}", n.label(),
                              in[0].str());
    SHOAL_ASSIGN_OR_RETURN(std::vector<std::int64_t> shape, n.attrs.get_ints("shape"));
    return std::vector<graph::TensorType>{{DType::kF32, shape}};
  };
  d.grad = [](graph::GradInputs& g) -> std::vector<graph::Value> {
    const graph::Attrs a = reversed(g.node.attrs);
    graph::Attrs s;  // pp_send's attributes: all but the shape
    for (const char* k : {"comm", "grad_comm", "peer", "tag"}) s.set(k, a.all().at(k));
    return {g.b.op("pp_send", {g.output_grads[0]}, s)};
  };
  graph::OpRegistry::global().add(d);
  runtime::KernelRegistry::cpu().add(
      "pp_recv",
      [](const graph::Node& n,
         const std::vector<graph::TensorType>&) -> Result<std::unique_ptr<runtime::Kernel>> {
        SHOAL_ASSIGN_OR_RETURN(Link l, link_of(n));
        return std::unique_ptr<runtime::Kernel>(std::make_unique<RecvKernel>(l));
      });
}

}  // namespace

void register_pipeline_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    add_send();
    add_recv();
  });
}

graph::Value pp_send(graph::Builder& b, graph::Value x, const PipeLink& l) {
  register_pipeline_ops();
  return b.op("pp_send", {x},
              {{"comm", l.comm}, {"grad_comm", l.grad_comm}, {"peer", l.peer}, {"tag", l.tag}});
}

graph::Value pp_recv(graph::Builder& b, graph::Value after, const Shape& shape, const PipeLink& l) {
  register_pipeline_ops();
  return b.op("pp_recv", {after},
              {{"comm", l.comm},
               {"grad_comm", l.grad_comm},
               {"peer", l.peer},
               {"tag", l.tag},
               {"shape", shape}});
}

}  // namespace shoal::mp
