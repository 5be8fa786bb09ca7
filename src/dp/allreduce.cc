#include "shoal/dp/allreduce.h"

#include <mutex>

#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/kernel.h"

namespace shoal::dp {
namespace {

std::mutex g_mu;
std::vector<comm::Communicator*>& comms() {
  static std::vector<comm::Communicator*> v;
  return v;
}

comm::Communicator* lookup(std::int64_t id) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (id < 0 || id >= static_cast<std::int64_t>(comms().size())) return nullptr;
  return comms()[static_cast<std::size_t>(id)];
}

class AllreduceKernel final : public runtime::Kernel {
 public:
  AllreduceKernel(comm::Communicator* c, comm::ReduceOp op) : c_(c), op_(op) {}
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    if (out[0].raw_data() != in[0].raw_data())
      std::memcpy(out[0].raw_data(), in[0].raw_data(), out[0].nbytes());
    work_ = c_->allreduce_async(out[0].raw_data(), out[0].raw_data(),
                                static_cast<std::size_t>(out[0].numel()), out[0].dtype(), op_);
    return ok_status();
  }
  bool is_async() const override { return true; }
  Status wait(Deadline dl) override {
    if (!work_) return ok_status();
    Status st = work_->wait(dl);
    work_.reset();
    return st;
  }
  const char* impl() const override { return "comm"; }

 private:
  comm::Communicator* c_;
  comm::ReduceOp op_;
  comm::WorkPtr work_;
};

}  // namespace

std::int64_t register_communicator(comm::Communicator* c) {
  std::lock_guard<std::mutex> lk(g_mu);
  comms().push_back(c);
  return static_cast<std::int64_t>(comms().size()) - 1;
}

void register_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    graph::OpDef d;
    d.name = "allreduce";
    d.attrs = {"comm", "op"};
    d.random = true;  // never constant-folded: its value depends on other ranks
    d.infer =
        [](const graph::Node& n,
           const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
      std::string op = n.attrs.get_string_or("op", "avg");
      if (op != "avg" && op != "sum")
        return invalid_argument("allreduce: op '{}' is not avg or sum", op);
      return std::vector<graph::TensorType>{in[0]};
    };
    // Linear in its input: the gradient is the same all-reduce of dy.
    d.grad = [](graph::GradInputs& g) -> std::vector<graph::Value> {
      return {g.b.op("allreduce", {g.output_grads[0]}, g.node.attrs)};
    };
    graph::OpRegistry::global().add(d);
    runtime::KernelRegistry::cpu().add(
        "allreduce",
        [](const graph::Node& n,
           const std::vector<graph::TensorType>&) -> Result<std::unique_ptr<runtime::Kernel>> {
          std::int64_t id = n.attrs.get_int_or("comm", -1);
          comm::Communicator* c = lookup(id);
          if (c == nullptr)
            return failed_precondition("allreduce {}: no communicator registered as id {}",
                                       n.label(), id);
          auto op = n.attrs.get_string_or("op", "avg") == "sum" ? comm::ReduceOp::kSum
                                                                : comm::ReduceOp::kAvg;
          return std::unique_ptr<runtime::Kernel>(std::make_unique<AllreduceKernel>(c, op));
        });
  });
}

Status inject_allreduce(graph::Graph& g, std::vector<train::ParamRef>& params,
                        std::int64_t comm_id) {
  register_ops();
  if (lookup(comm_id) == nullptr)
    return failed_precondition("inject_allreduce: no communicator registered as id {}", comm_id);
  graph::Builder b(g);
  // Latest-produced gradients first: their all-reduce can start earliest.
  std::vector<std::size_t> order(params.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t c) {
    return params[a].grad.node > params[c].grad.node;
  });
  for (std::size_t i : order) {
    auto& p = params[i];
    p.grad = b.op("allreduce", {p.grad}, {{"comm", comm_id}, {"op", std::string("avg")}},
                  "allreduce/" + p.name);
    if (!b.ok()) return b.status().with_context(fmt::format("allreduce of '{}'", p.name));
  }
  return ok_status();
}

}  // namespace shoal::dp
