#include "shoal/cluster/topology.h"

#include <map>

#include "cluster/yaml_fields.h"
#include "shoal/core/file.h"

namespace shoal::cluster {

int Topology::total_cpus() const {
  int n = 0;
  for (const Node& x : nodes) n += x.cpus;
  return n;
}
std::int64_t Topology::total_mem_mb() const {
  std::int64_t n = 0;
  for (const Node& x : nodes) n += x.mem_mb;
  return n;
}
int Topology::total_accels() const {
  int n = 0;
  for (const Node& x : nodes) n += x.accels;
  return n;
}

int Topology::switch_hops(int a, int b) const {
  if (a == b) return 0;
  int sa = nodes[a].leaf, sb = nodes[b].leaf;
  if (sa == sb) return 1;
  // Depth of each switch, then climb to the common ancestor.
  auto depth = [&](int s) {
    int d = 0;
    while (switches[s].parent >= 0) s = switches[s].parent, ++d;
    return d;
  };
  int da = depth(sa), db = depth(sb), hops = 1;
  while (da > db) sa = switches[sa].parent, --da, ++hops;
  while (db > da) sb = switches[sb].parent, --db, ++hops;
  while (sa != sb) {
    sa = switches[sa].parent;
    sb = switches[sb].parent;
    ++hops;
    if (sa < 0 || sb < 0) return 1 << 20;  // different trees: no path through a switch
  }
  return hops;
}

int Topology::find_node(const std::string& name) const {
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].name == name) return static_cast<int>(i);
  return -1;
}

Status validate(const Topology& t) {
  if (t.nodes.empty()) return invalid_argument("topology: no nodes");
  std::map<std::string, int> seen;
  for (std::size_t i = 0; i < t.nodes.size(); ++i) {
    const Node& n = t.nodes[i];
    if (!seen.emplace(n.name, static_cast<int>(i)).second)
      return invalid_argument("topology: node `{}` appears twice", n.name);
    if (n.accels < 0 || n.accels > 64)
      return invalid_argument("topology: node `{}` has {} accelerators (0..64)", n.name, n.accels);
    if (n.links == ChipLinks::kMesh && n.mesh_w * n.mesh_h != n.accels)
      return invalid_argument("topology: node `{}`: mesh {}x{} is {} chips, accels is {}", n.name,
                              n.mesh_w, n.mesh_h, n.mesh_w * n.mesh_h, n.accels);
    if (n.leaf < 0 || n.leaf >= static_cast<int>(t.switches.size()))
      return invalid_argument("topology: node `{}` is under no switch", n.name);
  }
  for (std::size_t s = 0; s < t.switches.size(); ++s) {
    int p = t.switches[s].parent, steps = 0;
    while (p >= 0 && steps++ <= static_cast<int>(t.switches.size())) p = t.switches[p].parent;
    if (p >= 0) return invalid_argument("topology: switch `{}` is in a cycle", t.switches[s].name);
  }
  return ok_status();
}

Topology generate_topology(int nodes, int per_switch, int cpus, std::int64_t mem_mb, int accels,
                           ChipLinks links, int mesh_w, int mesh_h) {
  Topology t;
  t.switches.push_back({"root", -1, {}});
  for (int i = 0; i < nodes; ++i) {
    if (i % per_switch == 0)
      t.switches.push_back({"s" + std::to_string(i / per_switch + 1), 0, {}});
    Node n;
    n.name = "n" + std::to_string(i + 1);
    n.cpus = cpus;
    n.mem_mb = mem_mb;
    n.accels = accels;
    n.links = accels > 0 ? links : ChipLinks::kNone;
    n.mesh_w = mesh_w;
    n.mesh_h = mesh_h;
    n.leaf = static_cast<int>(t.switches.size()) - 1;
    t.switches.back().nodes.push_back(i);
    t.nodes.push_back(n);
  }
  return t;
}

namespace {

Result<LinkCost> read_cost(const YAML::Node& n, const std::string& where, LinkCost fallback) {
  if (!n.IsDefined()) return fallback;
  SHOAL_ASSIGN_OR_RETURN(Fields f, Fields::open(n, where, {"alpha_us", "gbit_s"}));
  SHOAL_ASSIGN_OR_RETURN(double a, f.number("alpha_us", fallback.alpha * 1e6, 0, 1e9));
  SHOAL_ASSIGN_OR_RETURN(double g, f.number("gbit_s", 8 / fallback.beta / 1e9, 1e-6, 1e9));
  return LinkCost{a * 1e-6, 8 / (g * 1e9)};
}

Status read_costs(const Fields& root, const std::string& where, LinkCosts& c) {
  if (!root.has("links")) return ok_status();
  const YAML::Node l = root.node()["links"];
  SHOAL_ASSIGN_OR_RETURN(Fields f, Fields::open(l, where, {"chip", "host", "leaf", "spine"}));
  SHOAL_ASSIGN_OR_RETURN(c.chip, read_cost(l["chip"], where, c.chip));
  SHOAL_ASSIGN_OR_RETURN(c.host, read_cost(l["host"], where, c.host));
  SHOAL_ASSIGN_OR_RETURN(c.leaf, read_cost(l["leaf"], where, c.leaf));
  SHOAL_ASSIGN_OR_RETURN(c.spine, read_cost(l["spine"], where, c.spine));
  return ok_status();
}

Status read_chip_links(const Fields& f, Node& n) {
  SHOAL_ASSIGN_OR_RETURN(LinkShape l, read_link_shape(f, "links"));
  n.links = l.kind == 2 ? ChipLinks::kMesh : l.kind == 1 ? ChipLinks::kRing : ChipLinks::kNone;
  n.mesh_w = l.w;
  n.mesh_h = l.h;
  return ok_status();
}

Status read_generate(const YAML::Node& g, const std::string& where, Topology& t) {
  SHOAL_ASSIGN_OR_RETURN(
      Fields f,
      Fields::open(g, where, {"nodes", "per_switch", "cpus", "mem_mb", "accels", "links"}));
  SHOAL_ASSIGN_OR_RETURN(auto nodes, f.integer("nodes", 0, 1, 1 << 20));
  SHOAL_ASSIGN_OR_RETURN(auto per, f.integer("per_switch", 32, 1, 1 << 20));
  SHOAL_ASSIGN_OR_RETURN(auto cpus, f.integer("cpus", 64, 0, 1 << 20));
  SHOAL_ASSIGN_OR_RETURN(auto mem, f.integer("mem_mb", 512000, 0, 1ll << 40));
  SHOAL_ASSIGN_OR_RETURN(auto accels, f.integer("accels", 8, 0, 64));
  Node proto;
  SHOAL_RETURN_IF_ERROR(read_chip_links(f, proto));
  Topology gen =
      generate_topology(static_cast<int>(nodes), static_cast<int>(per), static_cast<int>(cpus), mem,
                        static_cast<int>(accels), proto.links, proto.mesh_w, proto.mesh_h);
  t.nodes = std::move(gen.nodes);
  t.switches = std::move(gen.switches);
  return ok_status();
}

Status read_switches(const YAML::Node& list, const std::string& where, Topology& t,
                     std::map<std::string, int>& index) {
  if (!list.IsSequence())
    return invalid_argument("{}:{}: `switches` must be a list", where, list.Mark().line + 1);
  std::vector<std::string> parents;
  for (const auto& s : list) {
    SHOAL_ASSIGN_OR_RETURN(Fields f, Fields::open(s, where, {"name", "parent"}));
    SHOAL_ASSIGN_OR_RETURN(std::string name, f.text("name", ""));
    SHOAL_ASSIGN_OR_RETURN(std::string parent, f.text("parent", ""));
    if (name.empty() || !index.emplace(name, static_cast<int>(t.switches.size())).second)
      return invalid_argument("{}: switch name `{}` empty or repeated", f.at("name"), name);
    t.switches.push_back({name, -1, {}});
    parents.push_back(parent);
  }
  for (std::size_t i = 0; i < parents.size(); ++i) {
    if (parents[i].empty()) continue;
    auto it = index.find(parents[i]);
    if (it == index.end())
      return invalid_argument("{}: switch `{}` has parent `{}`, which is not a switch", where,
                              t.switches[i].name, parents[i]);
    t.switches[i].parent = it->second;
  }
  return ok_status();
}

Status read_nodes(const YAML::Node& list, const std::string& where, Topology& t,
                  const std::map<std::string, int>& switches) {
  if (!list.IsSequence())
    return invalid_argument("{}:{}: `nodes` must be a list", where, list.Mark().line + 1);
  for (const auto& item : list) {
    SHOAL_ASSIGN_OR_RETURN(
        Fields f,
        Fields::open(item, where, {"name", "cpus", "mem_mb", "accels", "links", "switch"}));
    Node proto;
    SHOAL_ASSIGN_OR_RETURN(std::string names, f.text("name", ""));
    SHOAL_ASSIGN_OR_RETURN(auto cpus, f.integer("cpus", 0, 0, 1 << 20));
    SHOAL_ASSIGN_OR_RETURN(proto.mem_mb, f.integer("mem_mb", 0, 0, 1ll << 40));
    SHOAL_ASSIGN_OR_RETURN(auto accels, f.integer("accels", 0, 0, 64));
    SHOAL_ASSIGN_OR_RETURN(std::string sw, f.text("switch", ""));
    proto.cpus = static_cast<int>(cpus);
    proto.accels = static_cast<int>(accels);
    SHOAL_RETURN_IF_ERROR(read_chip_links(f, proto));
    auto it = switches.find(sw);
    if (it == switches.end())
      return invalid_argument("{}: `{}` is not a switch of `switches`", f.at("switch"), sw);
    proto.leaf = it->second;
    SHOAL_ASSIGN_OR_RETURN(auto expanded, expand_hostlist(names));
    for (const std::string& n : expanded) {
      proto.name = n;
      t.switches[proto.leaf].nodes.push_back(static_cast<int>(t.nodes.size()));
      t.nodes.push_back(proto);
    }
  }
  return ok_status();
}

}  // namespace

Result<Topology> parse_topology(const std::string& text, const std::string& where) {
  SHOAL_ASSIGN_OR_RETURN(YAML::Node root, load_yaml(text, where));
  SHOAL_ASSIGN_OR_RETURN(Fields f,
                         Fields::open(root, where, {"nodes", "switches", "links", "generate"}));
  Topology t;
  SHOAL_RETURN_IF_ERROR(read_costs(f, where, t.costs));
  if (f.has("generate")) {
    if (f.has("nodes") || f.has("switches"))
      return invalid_argument("{}: give either `generate` or `nodes` and `switches`", where);
    SHOAL_RETURN_IF_ERROR(read_generate(root["generate"], where, t));
  } else {
    if (!f.has("nodes") || !f.has("switches"))
      return invalid_argument("{}: needs `nodes` and `switches` (or `generate`)", where);
    std::map<std::string, int> index;
    SHOAL_RETURN_IF_ERROR(read_switches(root["switches"], where, t, index));
    SHOAL_RETURN_IF_ERROR(read_nodes(root["nodes"], where, t, index));
  }
  Status st = validate(t);
  if (!st.ok()) return st.with_context(where);
  return t;
}

Result<Topology> load_topology(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_topology(text, path);
}

}  // namespace shoal::cluster
