// ZeRO-1: reduce-scatter gradients, update a shard, all-gather parameters.
#include "shoal/dp/sharded.h"

#include <cstring>

#include "shoal/comm/communicator.h"
#include "shoal/dp/allreduce.h"
#include "shoal/mp/collectives.h"

namespace shoal::dp {

using graph::Builder;
using graph::Value;

namespace {

constexpr const char* kShard = "zero";  // the ParamRef name of this rank's flat shard

struct Flat {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::int64_t> offsets;  // of each parameter in the flat vector
  std::int64_t total = 0;
  std::vector<std::int64_t> sizes;  // each rank's shard
  std::int64_t begin = 0;           // this rank's first element
  int rank = 0;
};

// "opt/zero/<slot>" -> "<slot>"
std::string slot_of(const std::string& state_name) {
  return state_name.substr(state_name.rfind('/') + 1);
}

std::string logical_name(const std::string& param, const std::string& slot) {
  return "opt/" + param + "/" + slot;
}

std::shared_ptr<train::OptimizerGraph::Layout> layout_of(const Flat& f, comm::Communicator* c,
                                                         const train::OptimizerGraph& og) {
  auto l = std::make_shared<train::OptimizerGraph::Layout>();
  std::vector<std::string> slots;
  for (const auto& s : og.state) slots.push_back(slot_of(s.name));
  for (const auto& slot : slots)
    for (std::size_t i = 0; i < f.names.size(); ++i)
      l->logical[logical_name(f.names[i], slot)] = f.shapes[i];
  std::vector<std::size_t> counts(f.sizes.begin(), f.sizes.end());
  l->gather = [f, c, slots, counts](const std::map<std::string, Tensor>& state,
                                    std::map<std::string, Tensor>& logical) -> Status {
    Tensor full = Tensor::empty({f.total}, DType::kF32);
    for (const auto& slot : slots) {
      const Tensor& mine = state.at(logical_name(kShard, slot));
      SHOAL_RETURN_IF_ERROR(c->allgatherv(mine.raw_data(), full.raw_data(), counts, DType::kF32)
                                .with_context("gathering the sharded optimizer state"));
      for (std::size_t i = 0; i < f.names.size(); ++i) {
        Tensor t = Tensor::empty(f.shapes[i], DType::kF32);
        std::memcpy(t.raw_data(), full.data<float>() + f.offsets[i], t.nbytes());
        logical[logical_name(f.names[i], slot)] = t;
      }
    }
    return ok_status();
  };
  l->scatter = [f, slots](const std::map<std::string, Tensor>& logical,
                          std::map<std::string, Tensor>& state) -> Status {
    const std::int64_t end = f.begin + f.sizes[static_cast<std::size_t>(f.rank)];
    for (const auto& slot : slots) {
      float* dst = state.at(logical_name(kShard, slot)).data<float>();
      for (std::size_t i = 0; i < f.names.size(); ++i) {
        const std::int64_t lo = std::max(f.begin, f.offsets[i]);
        const std::int64_t hi = std::min(end, f.offsets[i] + num_elements(f.shapes[i]));
        if (lo >= hi) continue;
        const Tensor& src = logical.at(logical_name(f.names[i], slot));
        std::memcpy(dst + (lo - f.begin), src.data<float>() + (lo - f.offsets[i]),
                    static_cast<std::size_t>(hi - lo) * sizeof(float));
      }
    }
    return ok_status();
  };
  return l;
}

}  // namespace

std::vector<std::int64_t> shard_sizes(std::int64_t total, int world) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(world), total / world);
  for (std::int64_t r = 0; r < total % world; ++r) ++s[static_cast<std::size_t>(r)];
  return s;
}

Result<train::OptimizerGraph> inject_sharded(Builder& b, const std::vector<train::ParamRef>& params,
                                             const train::OptimizerOptions& o,
                                             std::int64_t comm_id) {
  if (o.name == "lars" || o.name == "lamb")
    return invalid_argument(
        "--zero needs an element-wise optimizer (sgd, momentum, nesterov, adam, adamw): {} "
        "scales each layer by norms of the whole layer, which a shard does not hold",
        o.name);
  comm::Communicator* c = communicator(comm_id);
  if (!c) return failed_precondition("--zero: no communicator registered as id {}", comm_id);
  if (params.empty()) return invalid_argument("--zero: the model has no parameters");
  Flat f;
  f.rank = c->rank();
  std::vector<Value> grads, weights;
  for (const auto& p : params) {
    f.names.push_back(p.name);
    f.shapes.push_back(b.shape(p.param));
    f.offsets.push_back(f.total);
    const std::int64_t n = num_elements(f.shapes.back());
    f.total += n;
    grads.push_back(b.reshape(p.grad, {n}));
    weights.push_back(b.reshape(p.param, {n}));
  }
  f.sizes = shard_sizes(f.total, c->size());
  for (int r = 0; r < f.rank; ++r) f.begin += f.sizes[static_cast<std::size_t>(r)];
  const std::int64_t mine = f.sizes[static_cast<std::size_t>(f.rank)];
  // The gradient of the global batch's mean loss: the ranks' sum / N.
  Value g =
      mp::reduce_scatter(b, grads.size() == 1 ? grads[0] : b.concat(grads, 0), comm_id, f.sizes);
  g = b.mul(g, b.scalar(1.0 / c->size()));
  Value flat_w = weights.size() == 1 ? weights[0] : b.concat(weights, 0);
  Value w = b.slice(flat_w, 0, f.begin, f.begin + mine, 1);
  SHOAL_ASSIGN_OR_RETURN(train::OptimizerGraph og,
                         train::append_optimizer(b, o, {train::ParamRef{kShard, w, g}}));
  Value all = mp::allgather(b, og.new_params[0], comm_id, f.sizes);
  og.new_params.clear();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::int64_t n = num_elements(f.shapes[i]);
    og.new_params.push_back(
        b.reshape(b.slice(all, 0, f.offsets[i], f.offsets[i] + n, 1), f.shapes[i]));
  }
  if (!b.ok()) return b.status().with_context("building the sharded (ZeRO) update");
  og.layout = layout_of(f, c, og);
  return og;
}

}  // namespace shoal::dp
