#include "shoal/cluster/extender.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

namespace shoal::cluster {

using json = nlohmann::json;

Result<double> parse_quantity(std::string_view q) {
  static const std::pair<std::string_view, double> kSuffixes[] = {
      {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
      {"m", 1e-3},    {"k", 1e3},        {"M", 1e6},           {"G", 1e9},
      {"T", 1e12}};
  double scale = 1;
  std::string_view num = q;
  for (const auto& [suffix, s] : kSuffixes)
    if (q.size() > suffix.size() && q.ends_with(suffix)) {
      num = q.substr(0, q.size() - suffix.size());
      scale = s;
      break;
    }
  double v = 0;
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (ec != std::errc() || p != num.data() + num.size() || v < 0 || !std::isfinite(v))
    return invalid_argument("`{}` is not a Kubernetes quantity (e.g. 500m, 2, 4Gi, 8000M)", q);
  return v * scale;
}

namespace {

// Go's encoding/json matches field names without regard to case, and
// kube-scheduler's types have no JSON tags ("Pod", "NodeNames"): so do we.
const json* field(const json& o, std::string_view name) {
  if (!o.is_object()) return nullptr;
  for (auto it = o.begin(); it != o.end(); ++it) {
    const std::string& k = it.key();
    if (k.size() == name.size() && std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        }))
      return &*it;
  }
  return nullptr;
}

std::string text_at(const json& o, std::initializer_list<std::string_view> path) {
  const json* v = &o;
  for (std::string_view k : path)
    if (!(v = field(*v, k))) return "";
  return v->is_string() ? v->get<std::string>() : "";
}

// A label's exact key (labels are not case-folded).
std::string label(const json& meta, const char* section, const std::string& key) {
  const json* m = field(meta, section);
  if (!m || !m->is_object() || !m->contains(key) || !(*m)[key].is_string()) return "";
  return (*m)[key].get<std::string>();
}

Result<int> small_int(const std::string& s, const std::string& what) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 0 || v > (1 << 20))
    return invalid_argument("{} `{}` is not a whole number", what, s);
  return v;
}

// One rank's needs: the sum of its containers' requests.
Status add_requests(const json& spec, JobSpec* j) {
  double cpu = 0, mem = 0, gpu = 0;
  const json* cs = field(spec, "containers");
  for (const json& c : cs && cs->is_array() ? *cs : json::array()) {
    const json* req = field(c, "resources");
    req = req ? field(*req, "requests") : nullptr;
    if (!req || !req->is_object()) continue;
    for (const auto& [k, v] : req->items()) {
      if (!v.is_string()) continue;
      auto q = parse_quantity(v.get<std::string>());
      if (!q.ok())
        return invalid_argument("pod.spec.containers[].resources.requests.{}: {}", k,
                                q.status().message());
      if (k == "cpu") cpu += *q;
      if (k == "memory") mem += *q;
      if (k == "nvidia.com/gpu") gpu += *q;
    }
  }
  // A pod asks for at most what a node could hold; beyond that the counts
  // would not fit in the placer's integers (and no node would take it).
  constexpr double kMaxCount = 1 << 20, kMaxBytes = 1e18;  // cores/GPUs; 1 EB
  if (!(cpu <= kMaxCount) || !(gpu <= kMaxCount) || !(mem <= kMaxBytes))
    return invalid_argument(
        "pod.spec.containers[].resources.requests: cpu {}, memory {} B, nvidia.com/gpu {} is "
        "more than any node holds (at most {} cores or GPUs, {} bytes)",
        cpu, mem, gpu, kMaxCount, kMaxBytes);
  j->cpus_per_rank = std::max(1, static_cast<int>(std::ceil(cpu - 1e-9)));
  j->mem_mb_per_rank = static_cast<std::int64_t>(std::ceil(mem / 1e6));
  j->accels_per_rank = static_cast<int>(std::ceil(gpu - 1e-9));
  return ok_status();
}

}  // namespace

// One call's question: which pod, which rank of which job, on which nodes.
struct SchedulerExtender::Ask {
  json args;
  std::vector<std::string> offered;
  bool node_list = false;  // Nodes (full objects) rather than NodeNames
  std::string pod, key;    // namespace/name; namespace/job ("" = not Shoal's)
  JobSpec job;
  int rank = 0;
};

Result<SchedulerExtender::Ask> SchedulerExtender::read(std::string_view body, double now_s) {
  Ask a;
  try {
    a.args = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e999
    return invalid_argument("the body is not JSON: {}", e.what());
  }
  const json* pod = field(a.args, "Pod");
  if (!pod || !pod->is_object())
    return invalid_argument("the body is not kube-scheduler's ExtenderArgs: it has no Pod object");
  const json* nodes = field(a.args, "Nodes");
  const json* names = field(a.args, "NodeNames");
  if (nodes && nodes->is_object()) {
    a.node_list = true;
    const json* items = field(*nodes, "items");
    for (const json& n : items && items->is_array() ? *items : json::array())
      a.offered.push_back(text_at(n, {"metadata", "name"}));
  } else if (names && names->is_array()) {
    for (const json& n : *names)
      if (n.is_string()) a.offered.push_back(n.get<std::string>());
  } else {
    return invalid_argument("ExtenderArgs has neither Nodes nor NodeNames");
  }
  const json* meta = field(*pod, "metadata");
  std::string ns = meta ? text_at(*meta, {"namespace"}) : "";
  a.pod = (ns.empty() ? "default" : ns) + "/" + (meta ? text_at(*meta, {"name"}) : "");
  std::string job = meta ? label(*meta, "labels", "shoal.dev/job") : "";
  if (job.empty()) return a;  // not Shoal's
  a.key = (ns.empty() ? "default" : ns) + "/" + job;
  a.job.name = a.key;
  SHOAL_ASSIGN_OR_RETURN(a.job.ranks, small_int(label(*meta, "labels", "shoal.dev/ranks"),
                                                "pod " + a.pod + " label shoal.dev/ranks"));
  std::string links = label(*meta, "labels", "shoal.dev/links");
  a.job.links = links == "ring"   ? LinkNeed::kRing
                : links == "mesh" ? LinkNeed::kMesh
                                  : LinkNeed::kNone;
  if (!links.empty() && links != "ring" && links != "mesh" && links != "none")
    return invalid_argument("pod {} label shoal.dev/links is `{}`, not ring, mesh or none", a.pod,
                            links);
  if (a.job.links == LinkNeed::kMesh) {
    std::string wh = label(*meta, "labels", "shoal.dev/mesh");
    std::size_t x = wh.find('x');
    SHOAL_ASSIGN_OR_RETURN(a.job.mesh_w,
                           small_int(wh.substr(0, x), "pod " + a.pod + " label shoal.dev/mesh"));
    SHOAL_ASSIGN_OR_RETURN(a.job.mesh_h, small_int(x == std::string::npos ? "" : wh.substr(x + 1),
                                                   "pod " + a.pod + " label shoal.dev/mesh"));
  }
  const json* spec = field(*pod, "spec");
  SHOAL_RETURN_IF_ERROR(add_requests(spec ? *spec : json::object(), &a.job));
  std::string index = label(*meta, "annotations", "batch.kubernetes.io/job-completion-index");
  if (index.empty()) index = label(*meta, "labels", "batch.kubernetes.io/job-completion-index");
  if (index.empty()) index = label(*meta, "labels", "training.kubeflow.org/replica-index");
  SHOAL_ASSIGN_OR_RETURN(a.rank, small_int(index, "pod " + a.pod + " completion index"));
  if (a.rank >= a.job.ranks)
    return invalid_argument("pod {} is rank {} of job {}, which has {} ranks", a.pod, a.rank, a.key,
                            a.job.ranks);
  SHOAL_RETURN_IF_ERROR(validate(a.job));
  for (auto it = plans_.begin(); it != plans_.end();)  // plans nobody asked about lately
    it = now_s - it->second.last_seen > o_.hold_seconds ? plans_.erase(it) : std::next(it);
  return a;
}

SchedulerExtender::SchedulerExtender(Topology t, ExtenderOptions o) : t_(std::move(t)), o_(o) {}

ClusterState SchedulerExtender::held_except(const std::string& job) const {
  ClusterState s(t_);
  for (const auto& [k, plan] : plans_)
    if (k != job) (void)s.take(plan.job, plan.p.ranks);
  return s;
}

// The job's plan, placed now if it has none or its rank's node is no
// longer offered; null with `why` when the gang does not fit.
SchedulerExtender::Plan* SchedulerExtender::plan_for(const Ask& a, std::string* why, bool* ever) {
  auto it = plans_.find(a.key);
  if (it != plans_.end() && it->second.job.ranks == a.job.ranks) {
    const std::string& node = t_.nodes[it->second.p.ranks[a.rank].node].name;
    if (std::find(a.offered.begin(), a.offered.end(), node) != a.offered.end()) return &it->second;
  }
  if (it != plans_.end()) plans_.erase(it);
  ClusterState s = held_except(a.key);
  std::set<std::string> offered(a.offered.begin(), a.offered.end());
  for (int n = 0; n < static_cast<int>(t_.nodes.size()); ++n)
    if (!offered.count(t_.nodes[n].name)) s.set_up(n, false);
  Fit f = fit(s, a.job);
  if (!f.p) {
    *ever = f.ever;  // judged on the empty cluster, every node up
    *why = f.why;
    return nullptr;
  }
  if (static_cast<int>(plans_.size()) >= o_.max_plans) {
    auto oldest = std::min_element(plans_.begin(), plans_.end(), [](const auto& x, const auto& y) {
      return x.second.last_seen < y.second.last_seen;
    });
    plans_.erase(oldest);
  }
  return &(plans_[a.key] = Plan{a.job, *f.p, 0});
}

Result<std::string> SchedulerExtender::filter(std::string_view args, double now_s) {
  SHOAL_ASSIGN_OR_RETURN(Ask a, read(args, now_s));
  json failed = json::object(), unresolvable = json::object();
  std::set<std::string> pass;
  if (a.key.empty()) {
    pass.insert(a.offered.begin(), a.offered.end());
  } else {
    std::string why;
    bool ever = true;
    Plan* plan = plan_for(a, &why, &ever);
    std::string node = plan ? t_.nodes[plan->p.ranks[a.rank].node].name : "";
    if (plan) {
      plan->last_seen = now_s;
      pass.insert(node);
    }
    for (const std::string& n : a.offered) {
      if (n == node) continue;
      if (t_.find_node(n) < 0)
        failed[n] = fmt::format("{} is not in Shoal's cluster model", n);
      else if (plan)
        failed[n] =
            fmt::format("Shoal places rank {} of job {} ({} ranks{}) on {}", a.rank, a.key,
                        a.job.ranks, a.job.links == LinkNeed::kRing ? ", a ring" : "", node);
      else
        (ever ? failed : unresolvable)[n] =
            fmt::format("job {} ({} ranks) {}: {}", a.key, a.job.ranks,
                        ever ? "does not fit now" : "can never fit this cluster", why);
    }
  }
  json out = {{"FailedNodes", failed}, {"FailedAndUnresolvableNodes", unresolvable}, {"Error", ""}};
  if (a.node_list) {
    json items = json::array();
    const json* list = field(*field(a.args, "Nodes"), "items");
    for (const json& n : list && list->is_array() ? *list : json::array())
      if (pass.count(text_at(n, {"metadata", "name"}))) items.push_back(n);
    out["Nodes"] = {{"items", items}};
    out["NodeNames"] = nullptr;
  } else {
    json names = json::array();
    for (const std::string& n : a.offered)
      if (pass.count(n)) names.push_back(n);
    out["NodeNames"] = names;
    out["Nodes"] = nullptr;
  }
  return out.dump();
}

Result<std::string> SchedulerExtender::prioritize(std::string_view args, double now_s) {
  SHOAL_ASSIGN_OR_RETURN(Ask a, read(args, now_s));
  json out = json::array();
  if (a.key.empty()) {  // not Shoal's: every node alike, and nothing to compute
    for (const std::string& name : a.offered) out.push_back({{"Host", name}, {"Score", 0}});
    return out.dump();
  }
  auto it = plans_.find(a.key);
  std::set<int> leaves;
  int mine = -1;
  if (it != plans_.end() && it->second.job.ranks == a.job.ranks) {
    it->second.last_seen = now_s;
    mine = it->second.p.ranks[a.rank].node;
    for (const RankSlot& r : it->second.p.ranks) leaves.insert(t_.nodes[r.node].leaf);
  }
  ClusterState held = held_except(a.key);
  for (const std::string& name : a.offered) {
    int n = t_.find_node(name), score = 0;
    if (n >= 0) {
      if (n == mine) {
        score = 10;
      } else if (leaves.count(t_.nodes[n].leaf)) {
        score = 5;
      } else {
        // Best fit: the fuller a node already is, the better it takes a
        // rank (whole nodes stay free for the jobs that need them).
        const Node& node = t_.nodes[n];
        double used = node.accels > 0
                          ? 1.0 - std::popcount(held.free_accels(n)) / double(node.accels)
                          : 1.0 - held.free_cpus(n) / double(std::max(1, node.cpus));
        score = static_cast<int>(std::lround(4 * used));
      }
    }
    out.push_back({{"Host", name}, {"Score", score}});
  }
  return out.dump();
}

}  // namespace shoal::cluster
