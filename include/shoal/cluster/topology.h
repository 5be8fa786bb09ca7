// The cluster model: nodes with CPUs, memory and accelerators joined by
// chip links (a ring or a W×H mesh inside a node), nodes under leaf
// switches, switches in a tree. Loaded from YAML, derived from Slurm's
// topology.conf and `scontrol show nodes`, or generated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shoal/core/status.h"

namespace shoal::cluster {

enum class ChipLinks { kNone, kRing, kMesh };

struct Node {
  std::string name;
  int cpus = 0;
  std::int64_t mem_mb = 0;
  int accels = 0;  // at most 64
  ChipLinks links = ChipLinks::kNone;
  int mesh_w = 0, mesh_h = 0;  // kMesh: accels = w·h, chip i at (i % w, i / w)
  int leaf = -1;               // index of its leaf switch in Topology::switches
};

struct Switch {
  std::string name;
  int parent = -1;         // -1: a root
  std::vector<int> nodes;  // in link order (a ring job across nodes uses a run of these)
};

// α-β costs of one message over each kind of hop (seconds, seconds/byte).
struct LinkCost {
  double alpha = 0, beta = 0;
};
struct LinkCosts {
  LinkCost chip{2e-6, 1.0 / 100e9};     // a direct chip-to-chip link
  LinkCost host{5e-6, 1.0 / 16e9};      // two chips of a node without a direct link
  LinkCost leaf{10e-6, 1.0 / 12.5e9};   // two nodes under one switch
  LinkCost spine{20e-6, 1.0 / 6.25e9};  // two nodes under different switches
};

struct Topology {
  std::vector<Node> nodes;
  std::vector<Switch> switches;
  LinkCosts costs;

  int total_cpus() const;
  std::int64_t total_mem_mb() const;
  int total_accels() const;
  // Hops (switches crossed) between the leaves of two nodes: 0 same node,
  // 1 same leaf, 2 and more through parents.
  int switch_hops(int a, int b) const;
  int find_node(const std::string& name) const;  // -1 when absent
};

Status validate(const Topology& t);
// YAML: {nodes: [{name, cpus, mem_mb, accels, links: none|ring|mesh WxH,
// switch}], switches: [{name, parent}], links: {chip|host|leaf|spine:
// {alpha_us, gbps}}} or the short form {generate: {nodes, per_switch, cpus,
// mem_mb, accels, links}}.
Result<Topology> parse_topology(const std::string& text, const std::string& where);
Result<Topology> load_topology(const std::string& path);
// `nodes` nodes, `per_switch` to a leaf switch, leaves under one root.
Topology generate_topology(int nodes, int per_switch, int cpus, std::int64_t mem_mb, int accels,
                           ChipLinks links, int mesh_w = 0, int mesh_h = 0);
// From Slurm: topology.conf text (SwitchName=… Nodes=…/Switches=…) and the
// output of `scontrol show nodes` (NodeName=… CPUTot=… RealMemory=…
// Gres=gpu:N).
Result<Topology> from_slurm(const std::string& topology_conf, const std::string& scontrol_nodes);
// topology.conf for Slurm's topology/tree plugin.
std::string to_topology_conf(const Topology& t);
// "n[1-4]" → n1 n2 n3 n4 (Slurm hostlist syntax, one bracket group).
Result<std::vector<std::string>> expand_hostlist(const std::string& list);
std::string compress_hostlist(const std::vector<std::string>& names);

}  // namespace shoal::cluster
