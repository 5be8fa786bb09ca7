#include <mutex>
#include <numeric>

#include "collective/op_group.h"
#include "shoal/collective/ops.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/kernel.h"

namespace shoal::collective {
namespace {

struct Group {
  comm::Communicator* c;
  std::vector<std::int64_t> sizes;
  std::int64_t total;
};

// The node's communicator and sizes, checked against each other and x.
Result<Group> group_of(const graph::Node& n) {
  SHOAL_ASSIGN_OR_RETURN(comm::Communicator * c, detail::communicator_of(n));
  SHOAL_ASSIGN_OR_RETURN(detail::Rows r, detail::rows_of(n, *c));
  return Group{c, r.sizes, r.total};
}

Result<std::vector<graph::TensorType>> infer(const graph::Node& n,
                                             const std::vector<graph::TensorType>& in,
                                             bool gather) {
  SHOAL_ASSIGN_OR_RETURN(comm::Communicator * c, detail::communicator_of(n));
  SHOAL_ASSIGN_OR_RETURN(detail::Rows r, detail::rows_of(n, *c));
  return detail::infer_rows(n, in[0], *c, r, gather, /*halves=*/true);
}

class CollectiveKernel final : public runtime::Kernel {
 public:
  CollectiveKernel(Group g, bool gather, std::int64_t row) : g_(std::move(g)), gather_(gather) {
    for (std::int64_t s : g_.sizes) counts_.push_back(static_cast<std::size_t>(s * row));
  }
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    const Tensor x = in[0].contiguous();
    if (gather_) return g_.c->allgatherv(x.raw_data(), out[0].raw_data(), counts_, x.dtype());
    return g_.c->reduce_scatter(x.raw_data(), out[0].raw_data(), counts_, x.dtype(),
                                comm::ReduceOp::kSum);
  }
  const char* impl() const override { return "comm"; }

 private:
  Group g_;
  bool gather_;
  std::vector<std::size_t> counts_;
};

void add(const char* name, const char* grad_name, bool gather) {
  detail::add_paired_op(
      name, grad_name, {"comm", "sizes"},
      [gather](const graph::Node& n, const std::vector<graph::TensorType>& in) {
        return infer(n, in, gather);
      },
      [gather](const graph::Node& n, const std::vector<graph::TensorType>& in)
          -> Result<std::unique_ptr<runtime::Kernel>> {
        SHOAL_ASSIGN_OR_RETURN(Group g, group_of(n));
        // Elements per row (a rank may hold no rows: not numel / rows).
        const std::int64_t row = num_elements(Shape(in[0].shape.begin() + 1, in[0].shape.end()));
        return std::unique_ptr<runtime::Kernel>(
            std::make_unique<CollectiveKernel>(std::move(g), gather, row));
      });
}

}  // namespace

void detail::register_allgather_reduce_scatter() {
  static std::once_flag once;
  std::call_once(once, [] {
    add("allgather", "reduce_scatter", true);
    add("reduce_scatter", "allgather", false);
  });
}

graph::Value allgather(graph::Builder& b, graph::Value x, std::int64_t comm,
                       const std::vector<std::int64_t>& sizes) {
  register_ops();
  return b.op("allgather", {x}, {{"comm", comm}, {"sizes", sizes}});
}

graph::Value reduce_scatter(graph::Builder& b, graph::Value x, std::int64_t comm,
                            const std::vector<std::int64_t>& sizes) {
  register_ops();
  return b.op("reduce_scatter", {x}, {{"comm", comm}, {"sizes", sizes}});
}

}  // namespace shoal::collective
