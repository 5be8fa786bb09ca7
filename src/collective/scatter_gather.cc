// scatter and gather as graph ops (collective/ops.h; named comm_scatter and
// comm_gather): the root's rows dealt out by rank (`sizes`, uneven allowed),
// and every rank's rows collected on the root. Each is the other's
// gradient: d/dx_root of scatter is every rank's dy gathered on the root
// (zero elsewhere: the other ranks' x are ignored), and d/dx_r of gather is
// rank r's block of the root's dy (scatter from the root; the other ranks'
// outputs are zeros, so their dy does not count).
//
// Transport: the communicator's gather and scatter take equal counts, so
// uneven blocks travel as an all-gather (gather) and a broadcast of the
// root's rows (scatter). Correct for any sizes; not the fewest bytes.
#include <cstring>
#include <mutex>

#include "collective/op_group.h"
#include "shoal/collective/ops.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/op_registry.h"
#include "shoal/runtime/kernel.h"

namespace shoal::collective {
namespace {

struct Dealt {
  comm::Communicator* c;
  int root;
  std::vector<std::int64_t> sizes;
  std::int64_t total = 0, first = 0;  // all rows; this rank's first row
};

Result<Dealt> dealt(const graph::Node& n) {
  SHOAL_ASSIGN_OR_RETURN(comm::Communicator * c, detail::communicator_of(n));
  SHOAL_ASSIGN_OR_RETURN(int root, detail::root_of(n, *c));
  SHOAL_ASSIGN_OR_RETURN(detail::Rows r, detail::rows_of(n, *c));
  return Dealt{c, root, r.sizes, r.total, r.first};
}

Result<std::vector<graph::TensorType>> infer(const graph::Node& n,
                                             const std::vector<graph::TensorType>& in,
                                             bool gather) {
  SHOAL_ASSIGN_OR_RETURN(comm::Communicator * c, detail::communicator_of(n));
  SHOAL_RETURN_IF_ERROR(detail::root_of(n, *c).status());
  SHOAL_ASSIGN_OR_RETURN(detail::Rows r, detail::rows_of(n, *c));
  return detail::infer_rows(n, in[0], *c, r, gather);
}

class DealtKernel final : public runtime::Kernel {
 public:
  DealtKernel(Dealt d, bool gather, std::int64_t row)
      : d_(std::move(d)), gather_(gather), row_(row) {
    for (std::int64_t s : d_.sizes) counts_.push_back(static_cast<std::size_t>(s * row));
  }
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    const Tensor x = in[0].contiguous();
    Tensor& y = out[0];
    const bool root = d_.c->rank() == d_.root;
    if (gather_) {
      SHOAL_RETURN_IF_ERROR(d_.c->allgatherv(x.raw_data(), y.raw_data(), counts_, DType::kF32));
      if (!root) std::memset(y.raw_data(), 0, y.nbytes());  // only the root holds the rows
      return ok_status();
    }
    // Every rank receives the root's rows, then keeps its own block.
    if (all_.numel() != x.numel()) all_ = Tensor::empty(x.shape(), DType::kF32);
    if (root) std::memcpy(all_.raw_data(), x.raw_data(), x.nbytes());
    SHOAL_RETURN_IF_ERROR(d_.c->broadcast(all_.raw_data(), static_cast<std::size_t>(all_.numel()),
                                          DType::kF32, d_.root));
    std::memcpy(y.raw_data(), all_.data<float>() + d_.first * row_, y.nbytes());
    return ok_status();
  }
  const char* impl() const override { return "comm"; }

 private:
  Dealt d_;
  bool gather_;
  std::int64_t row_;
  std::vector<std::size_t> counts_;
  Tensor all_;  // scatter: the root's rows, received whole
};

void add(const char* name, const char* grad_name, bool gather) {
  detail::add_paired_op(
      name, grad_name, {"comm", "root", "sizes"},
      [gather](const graph::Node& n, const std::vector<graph::TensorType>& in) {
        return infer(n, in, gather);
      },
      [gather](const graph::Node& n, const std::vector<graph::TensorType>& in)
          -> Result<std::unique_ptr<runtime::Kernel>> {
        SHOAL_ASSIGN_OR_RETURN(Dealt dd, dealt(n));
        const std::int64_t row = num_elements(Shape(in[0].shape.begin() + 1, in[0].shape.end()));
        return std::unique_ptr<runtime::Kernel>(
            std::make_unique<DealtKernel>(std::move(dd), gather, row));
      });
}

}  // namespace

void detail::register_scatter_gather() {
  static std::once_flag once;
  std::call_once(once, [] {
    add("comm_scatter", "comm_gather", false);
    add("comm_gather", "comm_scatter", true);
  });
}

graph::Value scatter(graph::Builder& b, graph::Value x, std::int64_t comm, int root,
                     const std::vector<std::int64_t>& sizes) {
  register_ops();
  return b.op("comm_scatter", {x},
              {{"comm", comm}, {"root", std::int64_t{root}}, {"sizes", sizes}});
}

graph::Value gather(graph::Builder& b, graph::Value x, std::int64_t comm, int root,
                    const std::vector<std::int64_t>& sizes) {
  register_ops();
  return b.op("comm_gather", {x}, {{"comm", comm}, {"root", std::int64_t{root}}, {"sizes", sizes}});
}

}  // namespace shoal::collective
