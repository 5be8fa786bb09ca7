// kube-scheduler's extender verbs: a gang placed once and each pod steered
// to its rank's node, rings kept under one switch, jobs that never fit told
// apart from jobs that do not fit now, other pods untouched, and a body
// that is not ExtenderArgs refused by name.
#include "shoal/cluster/extender.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace shoal::cluster {
namespace {

using json = nlohmann::json;

// Four nodes of 8 ring-linked GPUs, n1-n2 under s1 and n3-n4 under s2.
Topology four_nodes() {
  auto t = parse_topology(
      "switches: [{name: spine}, {name: s1, parent: spine}, {name: s2, parent: spine}]\n"
      "nodes:\n"
      "  - {name: \"n[1-2]\", cpus: 32, mem_mb: 256000, accels: 8, links: ring, switch: s1}\n"
      "  - {name: \"n[3-4]\", cpus: 32, mem_mb: 256000, accels: 8, links: ring, switch: s2}\n",
      "test");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return *t;
}

// A pod of an Indexed Job as kube-scheduler sends it (the fields read).
json pod(const std::string& job, int index, int ranks, const std::string& links, int gpus) {
  json labels = {{"batch.kubernetes.io/job-completion-index", std::to_string(index)}};
  if (!job.empty())
    labels.update({{"shoal.dev/job", job},
                   {"shoal.dev/ranks", std::to_string(ranks)},
                   {"shoal.dev/links", links}});
  json requests = {{"cpu", "500m"}, {"memory", "2Gi"}};
  if (gpus) requests["nvidia.com/gpu"] = std::to_string(gpus);
  return {
      {"metadata",
       {{"name", (job.empty() ? "web" : job) + "-" + std::to_string(index) + "-x7k2p"},
        {"namespace", "ml"},
        {"labels", labels},
        {"annotations", {{"batch.kubernetes.io/job-completion-index", std::to_string(index)}}}}},
      {"spec",
       {{"schedulerName", "default-scheduler"},
        {"containers", {{{"name", "rank"}, {"resources", {{"requests", requests}}}}}}}}};
}

std::string args(const json& p, std::vector<std::string> names = {"n1", "n2", "n3", "n4"}) {
  return json{{"Pod", p}, {"NodeNames", names}}.dump();
}

json filtered(SchedulerExtender& e, const std::string& body, double now = 0) {
  auto r = e.filter(body, now);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? json::parse(*r) : json();
}

TEST(Extender, ARingGangGoesUnderOneSwitchAndEachPodToItsRanksNode) {
  SchedulerExtender e(four_nodes());
  // A 2-GPU job first: best fit puts it on n1.
  json small = filtered(e, args(pod("small", 0, 1, "none", 2)));
  EXPECT_EQ(small["NodeNames"], json({"n1"}));
  // 16 ranks x 1 GPU as a ring: two whole idle nodes of one switch, n3-n4.
  json r0 = filtered(e, args(pod("ring16", 0, 16, "ring", 1)));
  EXPECT_EQ(r0["NodeNames"], json({"n3"}));
  EXPECT_EQ(r0["FailedNodes"].size(), 3u);
  EXPECT_NE(r0["FailedNodes"]["n1"].get<std::string>().find("rank 0 of job ml/ring16"),
            std::string::npos)
      << r0.dump();
  EXPECT_EQ(filtered(e, args(pod("ring16", 9, 16, "ring", 1)))["NodeNames"], json({"n4"}));
  EXPECT_EQ(e.plans(), 2);
  // Prioritize: its own node 10, its ring's other node 5, the rest less.
  auto pr = e.prioritize(args(pod("ring16", 9, 16, "ring", 1)), 0);
  ASSERT_TRUE(pr.ok());
  json scores = json::parse(*pr);
  ASSERT_EQ(scores.size(), 4u);
  std::map<std::string, int> by;
  for (const json& h : scores) by[h["Host"]] = h["Score"];
  EXPECT_EQ(by["n4"], 10);
  EXPECT_EQ(by["n3"], 5);
  EXPECT_LT(by["n1"], 5);
  EXPECT_GT(by["n1"], by["n2"]) << "best fit: the partly used n1 before the idle n2";
}

TEST(Extender, NeverAndNotNowAreToldApart) {
  SchedulerExtender e(four_nodes());
  json never = filtered(e, args(pod("huge", 0, 40, "none", 1)));
  EXPECT_TRUE(never["NodeNames"].empty());
  EXPECT_EQ(never["FailedAndUnresolvableNodes"].size(), 4u);
  EXPECT_NE(never.dump().find("can never fit"), std::string::npos) << never.dump();
  // 16 ranks of a ring offered only n1 and n3: not now, and said why.
  json later = filtered(e, args(pod("ring16", 0, 16, "ring", 1), {"n1", "n3"}));
  EXPECT_TRUE(later["NodeNames"].empty());
  EXPECT_EQ(later["FailedNodes"].size(), 2u);
  EXPECT_NE(later.dump().find("does not fit now"), std::string::npos) << later.dump();
}

TEST(Extender, APlanWhoseNodeIsNoLongerOfferedIsPlacedAgainAndIdlePlansExpire) {
  SchedulerExtender e(four_nodes(), {.hold_seconds = 60});
  EXPECT_EQ(filtered(e, args(pod("two", 0, 2, "ring", 4)), 0)["NodeNames"], json({"n1"}));
  // kube-scheduler no longer offers n1 (another pod took it): placed again.
  json again = filtered(e, args(pod("two", 1, 2, "ring", 4), {"n2", "n3"}), 1);
  EXPECT_EQ(again["NodeNames"], json({"n2"}));
  EXPECT_EQ(e.plans(), 1);
  filtered(e, args(pod("other", 0, 1, "none", 1)), 100);  // 99 s later: "two" expired
  EXPECT_EQ(e.plans(), 1);
}

TEST(Extender, PlansAreBoundedAndTheLeastRecentGoesFirst) {
  SchedulerExtender e(four_nodes(), {.hold_seconds = 1e9, .max_plans = 3});
  for (int i = 0; i < 5; ++i) filtered(e, args(pod("j" + std::to_string(i), 0, 1, "none", 1)), i);
  EXPECT_EQ(e.plans(), 3);
  // j0 and j1, asked about first, were dropped: no node is theirs (10).
  auto top = [&](const std::string& job) {
    auto r = e.prioritize(args(pod(job, 0, 1, "none", 1)), 10);
    EXPECT_TRUE(r.ok());
    int best = 0;
    for (const json& h : json::parse(*r)) best = std::max(best, h["Score"].get<int>());
    return best;
  };
  EXPECT_LT(top("j0"), 10);
  EXPECT_LT(top("j1"), 10);
  EXPECT_EQ(top("j4"), 10);
}

TEST(Extender, OtherPodsPassUntouchedAndFullNodeObjectsComeBack) {
  SchedulerExtender e(four_nodes());
  json nodes = {{"items", json::array()}};
  for (std::string n : {"n1", "n2", "n3"})
    nodes["items"].push_back({{"metadata", {{"name", n}, {"labels", {{"zone", "a"}}}}},
                              {"status", {{"allocatable", {{"nvidia.com/gpu", "8"}}}}}});
  json web = filtered(e, json{{"Pod", pod("", 0, 1, "", 0)}, {"Nodes", nodes}}.dump());
  EXPECT_EQ(web["Nodes"]["items"].size(), 3u);
  EXPECT_TRUE(web["FailedNodes"].empty());
  json mine = filtered(e, json{{"Pod", pod("j", 0, 1, "none", 8)}, {"Nodes", nodes}}.dump());
  ASSERT_EQ(mine["Nodes"]["items"].size(), 1u);
  EXPECT_EQ(mine["Nodes"]["items"][0], nodes["items"][0]) << "the node object as it came";
  auto scores = e.prioritize(json{{"Pod", pod("", 0, 1, "", 0)}, {"Nodes", nodes}}.dump(), 0);
  ASSERT_TRUE(scores.ok());
  for (const json& h : json::parse(*scores)) EXPECT_EQ(h["Score"], 0);
}

TEST(Extender, WhatIsNotExtenderArgsIsRefusedByName) {
  SchedulerExtender e(four_nodes());
  auto expect_refused = [&](const std::string& body, const std::string& words) {
    auto r = e.filter(body, 0);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
  };
  expect_refused("{\"Pod\": ", "not JSON");
  expect_refused("{\"Pod\": 1e999}",
                 "number overflow");  // the fuzzer's: out_of_range, not a parse error
  expect_refused(json{{"NodeNames", {"n1"}}}.dump(), "no Pod");
  expect_refused(json{{"Pod", pod("j", 0, 1, "none", 1)}}.dump(), "neither Nodes nor NodeNames");
  json bad = pod("j", 0, 1, "none", 1);
  bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2 cores";
  expect_refused(args(bad), "`2 cores` is not a Kubernetes quantity");
  bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1";
  bad["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "4294967296";
  expect_refused(args(bad), "is more than any node holds");  // the fuzzer's: once cast to int
  bad["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1";
  bad["spec"]["containers"][0]["resources"]["requests"]["memory"] = "9e300Ti";
  expect_refused(args(bad), "is more than any node holds");
  expect_refused(args(pod("j", 5, 4, "none", 1)), "rank 5 of job ml/j, which has 4 ranks");
  expect_refused(args(pod("j", 0, 4, "torus", 1)), "`torus`, not ring, mesh or none");
}

TEST(Extender, QuantitiesReadAsKubernetesWritesThem) {
  EXPECT_DOUBLE_EQ(*parse_quantity("500m"), 0.5);
  EXPECT_DOUBLE_EQ(*parse_quantity("2"), 2);
  EXPECT_DOUBLE_EQ(*parse_quantity("4Gi"), 4.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(*parse_quantity("8000M"), 8e9);
  EXPECT_DOUBLE_EQ(*parse_quantity("1.5k"), 1500);
  EXPECT_FALSE(parse_quantity("-1").ok());
  EXPECT_FALSE(parse_quantity("Gi").ok());
  EXPECT_FALSE(parse_quantity("").ok());
}

}  // namespace
}  // namespace shoal::cluster
