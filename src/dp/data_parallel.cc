#include "shoal/dp/data_parallel.h"

#include "shoal/core/logging.h"

namespace shoal::dp {
namespace {

class CommPeers final : public train::Peers {
 public:
  explicit CommPeers(comm::Communicator& c) : c_(c) {}

  Status agree(const std::string& what, std::uint64_t value) override {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(c_.size()));
    SHOAL_RETURN_IF_ERROR(
        c_.allgather(&value, all.data(), 1, DType::kI64).with_context("agreeing on " + what));
    for (int r = 1; r < c_.size(); ++r)
      if (all[static_cast<std::size_t>(r)] != all[0])
        return failed_precondition(
            "the ranks of this job disagree on the {}: rank 0 has {:016x}, rank {} has {:016x} "
            "(every rank must run the same shoal build with the same model and options)",
            what, all[0], r, all[static_cast<std::size_t>(r)]);
    return ok_status();
  }
  Status broadcast(Tensor& t) override {
    return c_.broadcast(t.raw_data(), static_cast<std::size_t>(t.numel()), t.dtype(), 0);
  }
  Status sum(std::vector<double>& v) override {
    return c_.allreduce(v.data(), v.data(), v.size(), DType::kF64, comm::ReduceOp::kSum);
  }
  Status average(Tensor& t) override {
    return c_.allreduce(t.raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()), t.dtype(),
                        comm::ReduceOp::kAvg);
  }

 private:
  comm::Communicator& c_;
};

}  // namespace

Status attach(train::TrainOptions& o, comm::Communicator& c, const DpOptions& d) {
  SHOAL_RETURN_IF_ERROR(validate(d));
  o.rank = c.rank();
  o.world = c.size();
  if (c.size() == 1) return ok_status();  // one process: nothing to synchronize
  std::int64_t id = register_communicator(&c);
  const bool lead = c.rank() == 0;
  o.grad_pass = [id, d, lead](graph::Graph& g, std::vector<train::ParamRef>& params) -> Status {
    SHOAL_ASSIGN_OR_RETURN(BucketPlan plan, inject_allreduce(g, params, id, d));
    if (lead) {
      std::vector<std::int64_t> sizes;
      for (const auto& b : plan.buckets) sizes.push_back(b.elements);
      SHOAL_LOG_INFO("data parallel: {} gradient buckets of {} elements, wire {}",
                     plan.buckets.size(), fmt::join(sizes, "+"), dtype_name(d.wire));
      SHOAL_LOG_DEBUG("{}", plan.str());
    }
    return ok_status();
  };
  o.peers = std::make_shared<CommPeers>(c);
  return ok_status();
}

}  // namespace shoal::dp
