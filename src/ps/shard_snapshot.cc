// Shard snapshots: the checkpoint format (safetensors, CRC-32 over every
// tensor, atomic write), holding values, optimizer state, the open sync
// rounds, versions, members, steps and sequence marks.
#include <sstream>

#include "ps/shard_key.h"
#include "shoal/ps/shard.h"
#include "shoal/train/checkpoint.h"

namespace shoal::ps {
namespace {

std::string join_ints(const std::set<int>& s) {
  std::string out;
  for (int v : s) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

template <typename M>
std::string join_map(const M& m) {
  std::string out;
  for (const auto& [k, v] : m) out += (out.empty() ? "" : ",") + fmt::format("{}:{}", k, v);
  return out;
}

// "1,2,3" or "1:7,2:9" back into values; false on anything else.
bool split_list(const std::string& s, std::vector<std::pair<long long, unsigned long long>>* out,
                bool pairs) {
  std::istringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    long long a = 0;
    unsigned long long b = 0;
    char extra = 0;
    const int n = pairs ? std::sscanf(item.c_str(), "%lld:%llu%c", &a, &b, &extra)
                        : std::sscanf(item.c_str(), "%lld%c", &a, &extra);
    if (n != (pairs ? 2 : 1)) return false;
    out->emplace_back(a, b);
  }
  return true;
}

}  // namespace

Status Shard::snapshot(const std::string& path) const {
  return train::save_checkpoint(path, capture());
}

train::CheckpointState Shard::capture() const {
  train::CheckpointState s;
  s.meta["ps_mode"] = mode_name(o_.mode);
  s.meta["optimizer"] = o_.optimizer.name;
  s.meta["workers"] = join_ints(live_);
  s.meta["marks"] = join_map(mark_);
  s.meta["steps"] = join_map(step_);
  for (const auto& [name, k] : keys_) {
    s.tensors["value/" + name] = k->value.clone();
    for (const auto& [n, t] : k->state) s.tensors[n] = t.clone();
    s.meta["version/" + name] = std::to_string(k->version);
    if (!k->pushed.empty()) {
      s.tensors["sum/" + name] = k->sum.clone();
      s.meta["pushed/" + name] = join_ints(k->pushed);
      s.meta["waits/" + name] = join_ints(k->waits_for);
    }
  }
  return s;
}

Status Shard::restore(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(train::CheckpointState s, train::load_checkpoint(path));
  return restore(s, path);
}

Status Shard::restore(const train::CheckpointState& s, const std::string& path) {
  auto meta = [&](const std::string& key) {
    auto it = s.meta.find(key);
    return it == s.meta.end() ? std::string() : it->second;
  };
  if (meta("ps_mode") != mode_name(o_.mode) || meta("optimizer") != o_.optimizer.name)
    return failed_precondition(
        "{}: a snapshot of a {} server with optimizer '{}'; this server is {} with '{}'", path,
        meta("ps_mode"), meta("optimizer"), mode_name(o_.mode), o_.optimizer.name);
  std::vector<std::pair<long long, unsigned long long>> workers, marks, steps;
  if (!split_list(meta("workers"), &workers, false) || !split_list(meta("marks"), &marks, true) ||
      !split_list(meta("steps"), &steps, true))
    return data_loss("{}: malformed workers/marks/steps metadata", path);
  // A restarted server learns its keys from the snapshot itself.
  for (const auto& [n, t] : s.tensors)
    if (n.rfind("value/", 0) == 0 && !keys_.count(n.substr(6)))
      SHOAL_RETURN_IF_ERROR(init(n.substr(6), t).with_context(path));
  for (auto& [name, k] : keys_) {
    auto v = s.tensors.find("value/" + name);
    if (v == s.tensors.end()) return data_loss("{}: no value for key '{}'", path, name);
    if (v->second.shape() != k->value.shape())
      return data_loss("{}: key '{}' is {}, this server holds it as {}", path, name,
                       shape_str(v->second.shape()), shape_str(k->value.shape()));
    SHOAL_RETURN_IF_ERROR(k->value.copy_from(v->second));
    for (auto& [n, t] : k->state) {
      auto st = s.tensors.find(n);
      if (st == s.tensors.end()) return data_loss("{}: no optimizer state '{}'", path, n);
      SHOAL_RETURN_IF_ERROR(t.copy_from(st->second));
    }
    k->version = static_cast<std::uint64_t>(s.get_int("version/" + name, 0));
    k->pushed.clear();
    k->waits_for.clear();
    if (auto sum = s.tensors.find("sum/" + name); sum != s.tensors.end()) {
      std::vector<std::pair<long long, unsigned long long>> p, w;
      if (!split_list(meta("pushed/" + name), &p, false) ||
          !split_list(meta("waits/" + name), &w, false))
        return data_loss("{}: malformed open round of key '{}'", path, name);
      if (sum->second.shape() != k->sum.shape())
        return data_loss("{}: the open round of key '{}' is {}, the key {}", path, name,
                         shape_str(sum->second.shape()), shape_str(k->sum.shape()));
      SHOAL_RETURN_IF_ERROR(k->sum.copy_from(sum->second));
      for (auto& [x, unused] : p) k->pushed.insert(static_cast<int>(x));
      for (auto& [x, unused] : w) k->waits_for.insert(static_cast<int>(x));
    }
  }
  live_.clear();
  mark_.clear();
  step_.clear();
  for (auto& [w, unused] : workers) live_.insert(static_cast<int>(w));
  for (auto& [w, m] : marks) mark_[static_cast<int>(w)] = m;
  for (auto& [w, st] : steps) step_[static_cast<int>(w)] = static_cast<std::int64_t>(st);
  return ok_status();
}

}  // namespace shoal::ps
