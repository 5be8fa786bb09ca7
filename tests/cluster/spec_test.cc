// Job specs and cluster models from YAML and from Slurm's files: what is
// valid parses, what is not is refused with the field, the line and the
// value named.
#include "shoal/cluster/spec.h"

#include <gtest/gtest.h>

#include <bit>

#include "shoal/cluster/slurm.h"
#include "shoal/cluster/topology.h"

namespace shoal::cluster {
namespace {

TEST(JobSpec, ParsesEveryField) {
  auto j = parse_job_spec(R"(name: gpt
ranks: 8
accels_per_rank: 1
cpus_per_rank: 4
mem_mb_per_rank: 16000
links: mesh 4x2
queue: research
priority: 5
max_runtime_s: 3600
checkpoint_every_s: 600
allreduce_mb: 250
comm_fraction: 0.4
)",
                          "gpt.yaml");
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_EQ(j->name, "gpt");
  EXPECT_EQ(j->ranks, 8);
  EXPECT_EQ(j->links, LinkNeed::kMesh);
  EXPECT_EQ(j->mesh_w, 4);
  EXPECT_EQ(j->mesh_h, 2);
  EXPECT_EQ(j->queue, "research");
  EXPECT_EQ(j->priority, 5);
  EXPECT_DOUBLE_EQ(j->allreduce_mb, 250);
  EXPECT_EQ(j->kind, JobKind::kSync);
  auto e = parse_job_spec("name: e\nranks: 8\nkind: elastic\n", "e.yaml");
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->min_ranks, 8);  // an elastic job without min_ranks needs all it asked
}

TEST(JobSpec, RefusesBadFieldsByName) {
  struct Case {
    const char* yaml;
    const char* says;
  };
  const Case cases[] = {
      {"name: a\nranks: two\n", "bad.yaml:2: field `ranks`: `two` is not an integer"},
      {"name: a\nranks: 0\n", "field `ranks`: 0 is outside [1, "},
      {"name: a\nrank: 4\n", "bad.yaml:2: unknown field `rank`"},
      {"ranks: 4\n", "field `name` is missing"},
      {"name: a\nlinks: torus\n", "`torus` is not one of none, ring, mesh WxH"},
      {"name: a\nlinks: mesh 4y2\n", "`4y2` is not WxH"},
      {"name: a\nranks: 4\naccels_per_rank: 1\nlinks: mesh 3x2\n",
       "mesh 3x2 has 6 chips but ranks × accels_per_rank = 4"},
      {"name: a\nranks: 4\nlinks: ring\n", "links: ring needs accels_per_rank ≥ 1"},
      {"name: a\nranks: 4\nkind: elastic\nmin_ranks: 5\n", "min_ranks is 5, must be in [1, "},
      {"name: a\nranks: 4\nmin_ranks: 2\n", "min_ranks 2 on a sync job"},
      {"name: a\nkind: ps\n", "a ps job needs servers ≥ 1"},
      {"name: a\ncomm_fraction: 1.5\n", "field `comm_fraction`: 1.5 is outside [0, 1]"},
      {"name: [a\n", "bad.yaml:"},
      {"- a\n- b\n", "expected a mapping"},
  };
  for (const Case& c : cases) {
    auto j = parse_job_spec(c.yaml, "bad.yaml");
    ASSERT_FALSE(j.ok()) << c.yaml;
    EXPECT_NE(j.status().message().find(c.says), std::string::npos)
        << c.yaml << " → " << j.status().message();
  }
}

TEST(Topology, ParsesNodesSwitchesAndLinks) {
  auto t = parse_topology(R"(switches:
  - {name: root}
  - {name: s1, parent: root}
  - {name: s2, parent: root}
nodes:
  - {name: "n[1-2]", cpus: 32, mem_mb: 256000, accels: 8, links: ring, switch: s1}
  - {name: n3, cpus: 32, mem_mb: 256000, accels: 8, links: mesh 4x2, switch: s2}
links:
  chip: {alpha_us: 1, gbit_s: 800}
)",
                          "c.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->nodes.size(), 3u);
  EXPECT_EQ(t->nodes[1].name, "n2");
  EXPECT_EQ(t->nodes[2].links, ChipLinks::kMesh);
  EXPECT_EQ(t->switch_hops(0, 1), 1);
  EXPECT_EQ(t->switch_hops(0, 2), 2);
  EXPECT_DOUBLE_EQ(t->costs.chip.alpha, 1e-6);
  EXPECT_DOUBLE_EQ(t->costs.chip.beta, 8 / 800e9);
  auto g = parse_topology("generate: {nodes: 10, per_switch: 4, accels: 4, links: ring}\n", "g");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->nodes.size(), 10u);
  EXPECT_EQ(g->switches.size(), 4u);  // a root and 3 leaves
  EXPECT_EQ(g->total_accels(), 40);
}

TEST(Topology, RefusesBadModels) {
  struct Case {
    const char* yaml;
    const char* says;
  };
  const Case cases[] = {
      {"switches: [{name: s}]\nnodes: [{name: n1, switch: t}]\n", "`t` is not a switch"},
      {"switches: [{name: s, parent: x}]\nnodes: [{name: n1, switch: s}]\n",
       "has parent `x`, which is not a switch"},
      {"switches: [{name: s}]\nnodes: [{name: n1, switch: s}, {name: n1, switch: s}]\n",
       "node `n1` appears twice"},
      {"switches: [{name: s}]\nnodes: [{name: n1, accels: 6, links: mesh 2x2, switch: s}]\n",
       "mesh 2x2 is 4 chips, accels is 6"},
      {"switches: [{name: s}]\nnodes: [{name: n1, accels: 65, switch: s}]\n", "65 is outside"},
      {"switches: [{name: s}]\nnodes: [{name: \"n[3-1]\", switch: s}]\n", "not a range"},
      {"nodes: []\n", "needs `nodes` and `switches`"},
      {"generate: {nodes: 4}\nnodes: []\n", "either `generate` or"},
  };
  for (const Case& c : cases) {
    auto t = parse_topology(c.yaml, "bad.yaml");
    ASSERT_FALSE(t.ok()) << c.yaml;
    EXPECT_NE(t.status().message().find(c.says), std::string::npos)
        << c.yaml << " → " << t.status().message();
  }
}

TEST(Topology, HostlistsRoundTrip) {
  auto a = expand_hostlist("n[1-3,7],gpu[08-10],login");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(*a,
            (std::vector<std::string>{"n1", "n2", "n3", "n7", "gpu08", "gpu09", "gpu10", "login"}));
  EXPECT_EQ(compress_hostlist({"n1", "n2", "n3", "n7", "login"}), "n[1-3],n7,login");
  EXPECT_FALSE(expand_hostlist("n[1-").ok());
  EXPECT_FALSE(expand_hostlist("n[a-b]").ok());
  // Found by the fuzzer: a range ending at LONG_MAX overflowed the loop counter.
  auto top = expand_hostlist("n[9223372036854775807]");
  ASSERT_TRUE(top.ok()) << top.status().to_string();
  EXPECT_EQ(*top, std::vector<std::string>{"n9223372036854775807"});
  EXPECT_FALSE(expand_hostlist("n[1-90000],m[1-90000]").ok());
  // Numbers too long for a long stay the names they are.
  EXPECT_EQ(compress_hostlist({"n99999999999999999999", "n1", "n2"}),
            "n99999999999999999999,n[1-2]");
}

// The text Slurm's own tools give: topology.conf and `scontrol show nodes`.
TEST(Topology, FromSlurmAndBack) {
  const std::string conf =
      "# two leaves\nSwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4]\n"
      "SwitchName=top Switches=s[1-2]\n";
  std::string nodes;
  for (int i = 1; i <= 4; ++i)
    nodes += fmt::format(
        "NodeName=n{} Arch=x86_64 CoresPerSocket=1\n   CPUAlloc=0 CPUTot=2 CPULoad=0.00\n"
        "   Gres={}\n   RealMemory=4000 AllocMem=0 FreeMem=N/A\n   State=IDLE\n\n",
        i, i <= 2 ? "gpu:4" : "(null)");
  auto t = from_slurm(conf, nodes);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->nodes.size(), 4u);
  EXPECT_EQ(t->nodes[0].accels, 4);
  EXPECT_EQ(t->nodes[3].accels, 0);
  EXPECT_EQ(t->nodes[2].cpus, 2);
  EXPECT_EQ(t->nodes[2].mem_mb, 4000);
  EXPECT_EQ(t->switch_hops(0, 1), 1);
  EXPECT_EQ(t->switch_hops(0, 3), 2);
  const std::string back = to_topology_conf(*t);
  EXPECT_NE(back.find("SwitchName=s1 Nodes=n[1-2]"), std::string::npos) << back;
  EXPECT_NE(back.find("SwitchName=top Switches=s[1-2]"), std::string::npos) << back;
  auto again = from_slurm(back, nodes);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->switch_hops(1, 2), 2);
  auto bad = from_slurm("SwitchName=s1 Nodes=n9\n", nodes);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("node `n9` is not in scontrol show nodes"),
            std::string::npos);
}

// GPUs in use come from `scontrol -d`'s GresUsed, plain or typed: under
// Slurm's default settings AllocTRES does not list them (measured: a job
// holding one GPU shows AllocTRES=cpu=1 and GresUsed=gpu:1).
TEST(Topology, GpusInUseComeFromGresUsed) {
  std::string nodes;
  const char* used[] = {"gpu:1", "gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:2)", "gpu:0(IDX:N/A)", ""};
  for (int i = 1; i <= 4; ++i)
    nodes += fmt::format(
        "NodeName=n{} CPUAlloc=1 CPUTot=2\n   Gres=gpu:4\n   GresUsed={}\n   RealMemory=4000 "
        "AllocMem=0\n   AllocTRES=cpu=1{}\n   State=MIXED\n\n",
        i, used[i - 1], i == 4 ? ",gres/gpu=2" : "");
  // n4's GresUsed is empty: AllocTRES's count, the older source, stands.
  nodes.replace(nodes.find("GresUsed=\n"), 10, "");
  auto t = from_slurm("SwitchName=s1 Nodes=n[1-4]\n", nodes);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ClusterState s(*t);
  ASSERT_TRUE(occupy_from_scontrol(s, nodes).ok());
  EXPECT_EQ(std::popcount(s.free_accels(0)), 3);
  EXPECT_EQ(std::popcount(s.free_accels(1)), 1);
  EXPECT_EQ(std::popcount(s.free_accels(2)), 4);
  EXPECT_EQ(std::popcount(s.free_accels(3)), 2);
}

}  // namespace
}  // namespace shoal::cluster
