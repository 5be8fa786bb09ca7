// ZeRO-1 and 2: reduce-scatter gradients, update a shard, all-gather parameters.
#include "shoal/dp/sharded.h"

#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "shoal/collective/ops.h"
#include "shoal/collective/registry.h"
#include "shoal/comm/communicator.h"
#include "shoal/dp/allreduce.h"

namespace shoal::dp {

using graph::Builder;
using graph::Value;

namespace {

// One reduce-scattered unit: its parameters flattened in order, split over
// the ranks. ZeRO-1 has one for all parameters; ZeRO-2 one per bucket.
struct Part {
  std::string ref;  // the ParamRef name of this rank's shard ("zero", "zero.<k>")
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::int64_t> offsets;  // of each parameter in the part
  std::int64_t total = 0;
  std::vector<std::int64_t> sizes;  // each rank's shard
  std::int64_t begin = 0;           // this rank's first element
};

// "opt/zero/<slot>" -> "<slot>"
std::string slot_of(const std::string& state_name) {
  return state_name.substr(state_name.rfind('/') + 1);
}

std::string logical_name(const std::string& param, const std::string& slot) {
  return "opt/" + param + "/" + slot;
}

std::shared_ptr<train::OptimizerGraph::Layout> layout_of(const std::vector<Part>& parts, int rank,
                                                         comm::Communicator* c,
                                                         const train::OptimizerGraph& og) {
  auto l = std::make_shared<train::OptimizerGraph::Layout>();
  std::set<std::string> slot_set;
  for (const auto& s : og.state) slot_set.insert(slot_of(s.name));
  std::vector<std::string> slots(slot_set.begin(), slot_set.end());
  for (const auto& slot : slots)
    for (const Part& f : parts)
      for (std::size_t i = 0; i < f.names.size(); ++i)
        l->logical[logical_name(f.names[i], slot)] = f.shapes[i];
  l->gather = [parts, c, slots](const std::map<std::string, Tensor>& state,
                                const std::function<bool(const std::string&)>& keep,
                                std::map<std::string, Tensor>& logical) -> Status {
    for (const Part& f : parts) {
      Tensor full = Tensor::empty({f.total}, DType::kF32);
      std::vector<std::size_t> counts(f.sizes.begin(), f.sizes.end());
      for (const auto& slot : slots) {
        const Tensor& mine = state.at(logical_name(f.ref, slot));
        SHOAL_RETURN_IF_ERROR(c->allgatherv(mine.raw_data(), full.raw_data(), counts, DType::kF32)
                                  .with_context("gathering the sharded optimizer state"));
        for (std::size_t i = 0; i < f.names.size(); ++i) {
          const std::string name = logical_name(f.names[i], slot);
          if (!keep(name)) continue;
          Tensor t = Tensor::empty(f.shapes[i], DType::kF32);
          std::memcpy(t.raw_data(), full.data<float>() + f.offsets[i], t.nbytes());
          logical[name] = t;
        }
      }
    }
    return ok_status();
  };
  l->scatter = [parts, slots, rank](const std::map<std::string, Tensor>& logical,
                                    std::map<std::string, Tensor>& state) -> Status {
    for (const Part& f : parts) {
      const std::int64_t end = f.begin + f.sizes[static_cast<std::size_t>(rank)];
      for (const auto& slot : slots) {
        float* dst = state.at(logical_name(f.ref, slot)).data<float>();
        for (std::size_t i = 0; i < f.names.size(); ++i) {
          const std::int64_t lo = std::max(f.begin, f.offsets[i]);
          const std::int64_t hi = std::min(end, f.offsets[i] + num_elements(f.shapes[i]));
          if (lo >= hi) continue;
          const Tensor& src = logical.at(logical_name(f.names[i], slot));
          std::memcpy(dst + (lo - f.begin), src.data<float>() + (lo - f.offsets[i]),
                      static_cast<std::size_t>(hi - lo) * sizeof(float));
        }
      }
    }
    return ok_status();
  };
  return l;
}

// The parts: one of every parameter (ZeRO-1), or buckets in the order the
// backward pass produces the gradients (ZeRO-2): up to bucket_elements each.
std::vector<std::vector<std::size_t>> group(Builder& b, const std::vector<train::ParamRef>& params,
                                            std::int64_t bucket_elements) {
  if (bucket_elements > 0)
    return group_in_backward_order(b.graph(), params, bucket_elements, bucket_elements,
                                   std::numeric_limits<std::int64_t>::max());
  std::vector<std::size_t> all(params.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  return {all};
}

// This rank's range of the part's flattened weights, from the pieces of
// the parameters that overlap it (not a slice of all of them concatenated:
// for ZeRO-1's one part, that copy was every parameter, 101 MB on an 8x512
// GPT, alive in the step's arena).
Value shard_of_weights(Builder& b, const std::vector<train::ParamRef>& params,
                       const std::vector<std::size_t>& members, const Part& f, int rank) {
  const std::int64_t end = f.begin + f.sizes[static_cast<std::size_t>(rank)];
  std::vector<Value> pieces;
  for (std::size_t k = 0; k < members.size(); ++k) {
    const std::int64_t n = num_elements(f.shapes[k]);
    const std::int64_t lo = std::max(f.begin, f.offsets[k]), hi = std::min(end, f.offsets[k] + n);
    if (lo >= hi) continue;
    Value flat = b.reshape(params[members[k]].param, {n});
    pieces.push_back(lo - f.offsets[k] == 0 && hi - f.offsets[k] == n
                         ? flat
                         : b.slice(flat, 0, lo - f.offsets[k], hi - f.offsets[k], 1));
  }
  if (pieces.empty()) {  // a rank with no elements of this part
    Value first = b.reshape(params[members[0]].param, {num_elements(f.shapes[0])});
    return b.slice(first, 0, 0, 0, 1);
  }
  return pieces.size() == 1 ? pieces[0] : b.concat(pieces, 0);
}

}  // namespace

std::vector<std::int64_t> shard_sizes(std::int64_t total, int world) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(world), total / world);
  for (std::int64_t r = 0; r < total % world; ++r) ++s[static_cast<std::size_t>(r)];
  return s;
}

Result<train::OptimizerGraph> inject_sharded(Builder& b, const std::vector<train::ParamRef>& params,
                                             const train::OptimizerOptions& o, std::int64_t comm_id,
                                             std::int64_t bucket_elements,
                                             std::vector<std::int64_t>* shard_elements,
                                             DType wire) {
  if (train::is_layerwise(o.name))
    return invalid_argument(
        "--zero needs an element-wise optimizer (sgd, momentum, nesterov, adam, adamw): {} "
        "scales each layer by norms of the whole layer, which a shard does not hold",
        o.name);
  comm::Communicator* c = collective::communicator(comm_id);
  if (!c) return failed_precondition("--zero: no communicator registered as id {}", comm_id);
  if (params.empty()) return invalid_argument("--zero: the model has no parameters");
  const int rank = c->rank();
  std::vector<Part> parts;
  std::vector<train::ParamRef> shards;
  for (const auto& members : group(b, params, bucket_elements)) {
    Part& f = parts.emplace_back();
    f.ref = bucket_elements > 0 ? fmt::format("zero.{}", parts.size() - 1) : "zero";
    std::vector<Value> grads;
    for (std::size_t i : members) {
      f.names.push_back(params[i].name);
      f.shapes.push_back(b.shape(params[i].param));
      f.offsets.push_back(f.total);
      f.total += num_elements(f.shapes.back());
      grads.push_back(b.reshape(params[i].grad, {num_elements(f.shapes.back())}));
    }
    f.sizes = shard_sizes(f.total, c->size());
    for (int r = 0; r < rank; ++r) f.begin += f.sizes[static_cast<std::size_t>(r)];
    // The gradient of the global batch's mean loss: the ranks' sum / N.
    Value flat = grads.size() == 1 ? grads[0] : b.concat(grads, 0);
    if (wire != DType::kF32) flat = b.cast(flat, wire);
    Value gr = collective::reduce_scatter(b, flat, comm_id, f.sizes);
    if (wire != DType::kF32) gr = b.cast(gr, DType::kF32);
    gr = b.mul(gr, b.scalar(1.0 / c->size()));
    shards.push_back(train::ParamRef{f.ref, shard_of_weights(b, params, members, f, rank), gr});
  }
  if (!b.ok()) return b.status().with_context("building the sharded (ZeRO) update");
  SHOAL_ASSIGN_OR_RETURN(train::OptimizerGraph og, train::append_optimizer(b, o, shards));
  std::map<std::string, Value> new_param;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const Part& f = parts[k];
    Value all = collective::allgather(b, og.new_params[k], comm_id, f.sizes);
    for (std::size_t i = 0; i < f.names.size(); ++i)
      new_param[f.names[i]] = b.reshape(
          b.slice(all, 0, f.offsets[i], f.offsets[i] + num_elements(f.shapes[i]), 1), f.shapes[i]);
  }
  og.new_params.clear();
  for (const auto& p : params) og.new_params.push_back(new_param.at(p.name));
  if (!b.ok()) return b.status().with_context("building the sharded (ZeRO) update");
  og.layout = layout_of(parts, rank, c, og);
  if (shard_elements)
    for (const Part& f : parts) shard_elements->push_back(f.sizes[static_cast<std::size_t>(rank)]);
  return og;
}

}  // namespace shoal::dp
