// Shoal's placement as kube-scheduler's own policy: the `filter` and
// `prioritize` verbs of a scheduler extender (the JSON of
// k8s.io/kube-scheduler/extender/v1: ExtenderArgs in, ExtenderFilterResult
// or HostPriorityList out). kube-scheduler keeps scheduling: it filters
// nodes by resources, taints and affinity and binds the pod; the extender
// adds what it cannot know, that the pods of one training job are a gang
// whose ring must stay on linked chips and under one switch.
//
// The first pod of a job seen (labels shoal.dev/job, shoal.dev/ranks,
// shoal.dev/links, as `shoal submit --engine kubernetes` writes them) has
// the whole gang placed by the same placer as `shoal place`, on the nodes
// kube-scheduler offered and what earlier plans hold; each pod is then
// steered to its rank's node (the Indexed Job's completion index). A plan
// is dropped when its planned node is no longer offered (it is placed
// again) or when no pod of its job was asked about for `hold_seconds`.
// Pods that are not Shoal's pass through unchanged and unscored.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "shoal/cluster/placer.h"

namespace shoal::cluster {

struct ExtenderOptions {
  double hold_seconds = 600;
  // Plans held at most; past it the one asked about longest ago goes (a
  // flood of distinct job labels cannot grow the extender without bound).
  int max_plans = 10000;
};

class SchedulerExtender {
 public:
  explicit SchedulerExtender(Topology t, ExtenderOptions o = {});

  // The body of kube-scheduler's POST to the filter verb (ExtenderArgs) →
  // an ExtenderFilterResult; `now_s` is any monotonic clock in seconds. A
  // body that is not ExtenderArgs is an error naming what is wrong.
  Result<std::string> filter(std::string_view args, double now_s);
  // The prioritize verb: ExtenderArgs → HostPriorityList, scores 0..10.
  Result<std::string> prioritize(std::string_view args, double now_s);

  // Jobs with a plan held.
  int plans() const { return static_cast<int>(plans_.size()); }

 private:
  struct Plan {
    JobSpec job;
    Placement p;
    double last_seen = 0;
  };
  struct Ask;
  Result<Ask> read(std::string_view args, double now_s);
  Plan* plan_for(const Ask& a, std::string* why, bool* ever);
  ClusterState held_except(const std::string& job) const;

  Topology t_;
  ExtenderOptions o_;
  std::map<std::string, Plan> plans_;  // by namespace/job
};

// A Kubernetes resource quantity ("500m", "2", "4Gi", "8000M") in its
// base unit (cores, bytes); an error names the text.
Result<double> parse_quantity(std::string_view q);

}  // namespace shoal::cluster
