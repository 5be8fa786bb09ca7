// Tensor parallelism in the trainer: the forward-graph hook and the slices'
// cut and gather (mp/tensor_parallel.h).
#include <algorithm>
#include <cstring>

#include "shoal/collective/registry.h"
#include "shoal/comm/communicator.h"
#include "shoal/core/logging.h"
#include "shoal/mp/tensor_parallel.h"

namespace shoal::mp {

namespace {

// The whole tensor from every rank's slice along s.axis. Slices may differ
// in length (a vocabulary's rows, heads that T does not divide): a shorter
// one is sent padded to the longest, and the pieces go back by each rank's
// range.
Result<Tensor> gather_whole(comm::Communicator* c, const TpShard& s, const Tensor& mine) {
  const int size = c->size();
  const std::int64_t rows = s.full[0], width = s.full.size() > 1 ? s.full[1] : 1;
  const std::int64_t across = s.axis == 0 ? width : rows;  // elements per unit of the axis
  std::int64_t most = 0;
  for (int r = 0; r < size; ++r) {
    const auto [b, e] = tp_range(s, r, size);
    most = std::max(most, (e - b) * across);
  }
  Tensor send = mine.contiguous();
  if (send.numel() != most) {
    Tensor padded = Tensor::zeros({most}, DType::kF32);
    std::memcpy(padded.raw_data(), send.raw_data(), send.nbytes());
    send = padded;
  }
  Tensor all = Tensor::empty({most * size}, DType::kF32);
  SHOAL_RETURN_IF_ERROR(
      c->allgather(send.raw_data(), all.raw_data(), static_cast<std::size_t>(most), DType::kF32)
          .with_context("gathering a tensor-parallel parameter"));
  Tensor whole = Tensor::empty(s.full, DType::kF32);
  float* w = whole.data<float>();
  for (int r = 0; r < size; ++r) {
    const auto [b, e] = tp_range(s, r, size);
    const float* from = all.data<float>() + r * most;
    if (s.axis == 0) {
      std::memcpy(w + b * width, from, static_cast<std::size_t>((e - b) * width) * sizeof(float));
      continue;
    }
    for (std::int64_t i = 0; i < rows; ++i)
      std::memcpy(w + i * width + b, from + i * (e - b),
                  static_cast<std::size_t>(e - b) * sizeof(float));
  }
  return whole;
}

}  // namespace

Status attach_tensor_parallel(train::TrainOptions& o, std::int64_t comm_id, bool sequence_parallel,
                              bool in_pipeline) {
  comm::Communicator* c = collective::communicator(comm_id);
  if (!c) return failed_precondition("--tp: no communicator registered as id {}", comm_id);
  const int rank = c->rank(), size = c->size();
  o.data_rank = 0;  // every rank of the group sees the whole batch
  o.data_world = 1;
  auto logged = std::make_shared<bool>(false);
  o.forward_pass = [c, comm_id, rank, size, logged, sequence_parallel,
                    in_pipeline](graph::Graph& g) -> Result<train::TrainOptions::ParamSlices> {
    SHOAL_ASSIGN_OR_RETURN(TpPlan plan, plan_tensor_parallel(g, size));
    if (plan.regions.empty())
      return invalid_argument(
          "--tp {}: the model has no pair of linears to split (a linear whose output reaches "
          "another linear through reshapes, transposes, matmuls and elementwise ops only)",
          size);
    SHOAL_RETURN_IF_ERROR(shard_tensor_parallel(g, plan, comm_id, !in_pipeline));
    int seq = 0;
    std::vector<std::string> refused;
    if (sequence_parallel) {
      SHOAL_ASSIGN_OR_RETURN(seq, shard_sequence(g, comm_id, &refused, !in_pipeline));
    }
    if (rank == 0 && !*logged) {
      SHOAL_LOG_INFO("tensor parallel over {} ranks: {} regions, {} tensors split\n{}", size,
                     plan.regions.size(), plan.shards.size(), plan.str());
      std::size_t summed = 0;  // parameters read by the rows, their gradients summed at once
      for (const graph::Node& n : g.nodes())
        if (n.alive && n.op == "tp_copy_bucket") summed += n.inputs.size();
      if (sequence_parallel)
        SHOAL_LOG_INFO(
            "sequence parallel: {} region(s) of row-wise ops on 1/{} of the rows{}{}{}", seq, size,
            summed ? fmt::format("; {} parameters' gradients summed in one all-reduce", summed)
                   : "",
            refused.empty() ? "" : "; left whole: ", fmt::join(refused, "; "));
      *logged = true;
    }
    auto by_param = std::make_shared<std::map<std::string, TpShard>>();
    train::TrainOptions::ParamSlices ps;
    for (const auto& s : plan.shards) {
      const std::string name = s.input.substr(std::string("param/").size());
      (*by_param)[name] = s;
      ps.names.insert(name);
    }
    ps.slice = [by_param, rank, size](const std::string& p, const Tensor& whole) {
      return tp_slice(whole, by_param->at(p), rank, size);
    };
    ps.gather = [by_param, c](const std::string& p, const Tensor& mine) {
      return gather_whole(c, by_param->at(p), mine);
    };
    for (const graph::Node& n : g.nodes())
      if (n.alive && n.op == "vocab_parallel_cross_entropy") ps.correct = graph::Value{n.id, 2};
    return ps;
  };
  return ok_status();
}

}  // namespace shoal::mp
