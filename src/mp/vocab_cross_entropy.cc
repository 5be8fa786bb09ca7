// Megatron's vocabulary-parallel cross-entropy (mp/tensor_parallel.h): the
// loss of logits split by columns over a tensor group, without ever forming
// the whole logits. Each rank holds columns [offset, offset + V_r) of
// logits [N, V]. Per row: the group's max (one all-reduce of N floats),
// then the sums of exp(x - max) and the label's logit (the rank holding the
// label contributes it, the others 0: one all-reduce of 2N floats). The
// loss is mean(max + log(sum) - x[label]), the same on every rank; the
// gradient of this rank's columns is (softmax - one_hot) / N, from the
// row's log-sum-exp kept by the forward: no communication backward.
//
// Outputs: the loss [], each row's log-sum-exp [N], and how many rows'
// label logit equals the row's max (the training accuracy's count, as an
// argmax over whole logits would give it but for exact ties).
#include <cmath>
#include <limits>

#include "collective/op_group.h"
#include "shoal/comm/communicator.h"
#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/mp/tensor_parallel.h"
#include "shoal/runtime/kernel.h"

namespace shoal::mp {
namespace {

std::int64_t label_at(const Tensor& labels, std::int64_t i) {
  return labels.dtype() == DType::kI64 ? labels.data<std::int64_t>()[i]
                                       : labels.data<std::int32_t>()[i];
}

Status check_label(const std::string& node, std::int64_t row, std::int64_t label,
                   std::int64_t vocab) {
  if (label < 0 || label >= vocab)
    return invalid_argument("{}: row {} has label {}, outside the vocabulary [0, {})", node, row,
                            label, vocab);
  return ok_status();
}

class LossKernel final : public runtime::Kernel {
 public:
  LossKernel(const graph::Node& n, comm::Communicator* c)
      : label_(n.label()),
        c_(c),
        offset_(n.attrs.get_int_or("offset", 0)),
        vocab_(n.attrs.get_int_or("vocab", 0)) {}

  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    const Tensor x = in[0].contiguous(), labels = in[1].contiguous();
    const std::int64_t rows = x.shape()[0], cols = x.shape()[1];
    const float* px = x.data<float>();
    std::vector<float> mx(static_cast<std::size_t>(rows), -std::numeric_limits<float>::infinity());
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) mx[i] = std::max(mx[i], px[i * cols + j]);
    SHOAL_RETURN_IF_ERROR(
        c_->allreduce(mx.data(), mx.data(), mx.size(), DType::kF32, comm::ReduceOp::kMax)
            .with_context(label_));
    // [sum of exp(x - max) for each row, then the label's logit for each row]
    std::vector<float> sz(2 * static_cast<std::size_t>(rows), 0.0f);
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* row = px + i * cols;
      double s = 0;
      for (std::int64_t j = 0; j < cols; ++j) s += std::exp(static_cast<double>(row[j] - mx[i]));
      sz[i] = static_cast<float>(s);
      const std::int64_t label = label_at(labels, i);
      SHOAL_RETURN_IF_ERROR(check_label(label_, i, label, vocab_));
      if (label >= offset_ && label < offset_ + cols) sz[rows + i] = row[label - offset_];
    }
    SHOAL_RETURN_IF_ERROR(
        c_->allreduce(sz.data(), sz.data(), sz.size(), DType::kF32, comm::ReduceOp::kSum)
            .with_context(label_));
    float* lse = out[1].data<float>();
    double loss = 0, hits = 0;
    for (std::int64_t i = 0; i < rows; ++i) {
      lse[i] = mx[i] + std::log(sz[i]);
      loss += static_cast<double>(lse[i]) - sz[rows + i];
      hits += sz[rows + i] >= mx[i] ? 1 : 0;
    }
    out[0].data<float>()[0] =
        static_cast<float>(loss / static_cast<double>(std::max<std::int64_t>(rows, 1)));
    out[2].data<float>()[0] = static_cast<float>(hits);
    return ok_status();
  }
  const char* impl() const override { return "comm"; }

 private:
  std::string label_;  // the node's, for errors
  comm::Communicator* c_;
  std::int64_t offset_, vocab_;
};

// dx = (exp(x - lse) - one_hot(label - offset)) * dy / N.
class GradKernel final : public runtime::Kernel {
 public:
  explicit GradKernel(std::int64_t offset) : offset_(offset) {}
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    const Tensor x = in[0].contiguous(), labels = in[1].contiguous(), lse = in[2].contiguous();
    const std::int64_t rows = x.shape()[0], cols = x.shape()[1];
    const float scale =
        in[3].contiguous().data<float>()[0] / static_cast<float>(std::max<std::int64_t>(rows, 1));
    const float *px = x.data<float>(), *pl = lse.data<float>();
    float* dx = out[0].data<float>();
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < cols; ++j)
        dx[i * cols + j] = std::exp(px[i * cols + j] - pl[i]) * scale;
      const std::int64_t k = label_at(labels, i) - offset_;
      if (k >= 0 && k < cols) dx[i * cols + k] -= scale;
    }
    return ok_status();
  }
  const char* impl() const override { return "cpu"; }

 private:
  std::int64_t offset_;
};

Status check_logits(const graph::Node& n, const std::vector<graph::TensorType>& in) {
  if (in[0].dtype != DType::kF32 || in[0].shape.size() != 2)
    return invalid_argument("{}: logits must be f32 [N, V], got {}", n.label(), in[0].str());
  if ((in[1].dtype != DType::kI32 && in[1].dtype != DType::kI64) ||
      in[1].shape != Shape{in[0].shape[0]})
    return invalid_argument("{}: labels must be i32 or i64 [{}], got {}", n.label(), in[0].shape[0],
                            in[1].str());
  const std::int64_t offset = n.attrs.get_int_or("offset", -1),
                     vocab = n.attrs.get_int_or("vocab", -1);
  if (offset < 0 || offset + in[0].shape[1] > vocab)
    return invalid_argument("{}: columns [{}, {}) do not lie in a vocabulary of {}", n.label(),
                            offset, offset + in[0].shape[1], vocab);
  return ok_status();
}

}  // namespace

void register_vocab_cross_entropy() {
  graph::OpDef d;
  d.name = "vocab_parallel_cross_entropy";
  d.min_inputs = d.max_inputs = 2;
  d.attrs = {"comm", "offset", "vocab"};
  d.random = true;  // its value depends on other ranks
  d.infer = [](const graph::Node& n,
               const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
    SHOAL_RETURN_IF_ERROR(collective::detail::communicator_of(n).status());
    SHOAL_RETURN_IF_ERROR(check_logits(n, in));
    return std::vector<graph::TensorType>{
        {DType::kF32, {}}, {DType::kF32, {in[0].shape[0]}}, {DType::kF32, {}}};
  };
  d.grad = [](graph::GradInputs& g) -> std::vector<graph::Value> {
    if (!g.output_grads[0].valid()) return {graph::Value{}, graph::Value{}};
    const graph::Value x = g.node.inputs[0], labels = g.node.inputs[1];
    return {
        g.b.op("vocab_parallel_cross_entropy_grad", {x, labels, g.outputs[1], g.output_grads[0]},
               {{"offset", g.node.attrs.get_int_or("offset", 0)}}),
        graph::Value{}};
  };
  graph::OpRegistry::global().add(d);
  runtime::KernelRegistry::cpu().add(
      d.name,
      [](const graph::Node& n,
         const std::vector<graph::TensorType>&) -> Result<std::unique_ptr<runtime::Kernel>> {
        SHOAL_ASSIGN_OR_RETURN(comm::Communicator * c, collective::detail::communicator_of(n));
        return std::unique_ptr<runtime::Kernel>(std::make_unique<LossKernel>(n, c));
      });

  graph::OpDef gd;
  gd.name = "vocab_parallel_cross_entropy_grad";  // (x, labels, lse, dy) -> dx
  gd.min_inputs = gd.max_inputs = 4;
  gd.attrs = {"offset"};
  gd.infer =
      [](const graph::Node& n,
         const std::vector<graph::TensorType>& in) -> Result<std::vector<graph::TensorType>> {
    if (in[0].dtype != DType::kF32 || in[0].shape.size() != 2 ||
        in[2].shape != Shape{in[0].shape[0]} || !in[3].shape.empty())
      return invalid_argument(
          "{}: needs logits [N, V], labels, log-sum-exp [N] and dy [], got {}, {}, {}, {}",
          n.label(), in[0].str(), in[1].str(), in[2].str(), in[3].str());
    return std::vector<graph::TensorType>{in[0]};
  };
  graph::OpRegistry::global().add(gd);
  runtime::KernelRegistry::cpu().add(
      gd.name,
      [](const graph::Node& n,
         const std::vector<graph::TensorType>&) -> Result<std::unique_ptr<runtime::Kernel>> {
        return std::unique_ptr<runtime::Kernel>(
            std::make_unique<GradKernel>(n.attrs.get_int_or("offset", 0)));
      });
}

}  // namespace shoal::mp
