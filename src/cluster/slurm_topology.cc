// The cluster model from and to Slurm's own files: topology.conf (the
// topology/tree plugin's switches) and `scontrol show nodes`.
#include <map>
#include <sstream>

#include "cluster/slurm_text.h"
#include "shoal/cluster/topology.h"

namespace shoal::cluster {

namespace {

// Gres=gpu:4, gpu:a100:4(S:0-1), (null).
int gres_gpus(const std::string& gres) {
  int total = 0;
  std::istringstream in(gres);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.rfind("gpu", 0) != 0) continue;
    auto paren = item.find('(');
    if (paren != std::string::npos) item.resize(paren);
    auto colon = item.rfind(':');
    if (colon == std::string::npos) continue;
    try {
      total += std::stoi(item.substr(colon + 1));
    } catch (...) {
    }
  }
  return total;
}

struct SlurmNode {
  int cpus = 0;
  std::int64_t mem = 0;
  int gpus = 0;
};

Result<std::map<std::string, SlurmNode>> parse_scontrol(const std::string& text) {
  std::map<std::string, SlurmNode> out;
  SHOAL_RETURN_IF_ERROR(for_each_node(text, [&](KeyValues& kv) -> Status {
    SlurmNode n;
    try {
      n.cpus = std::stoi(kv["CPUTot"]);
      n.mem = std::stoll(kv["RealMemory"]);
    } catch (...) {
      return invalid_argument("scontrol show nodes: node `{}` lacks CPUTot/RealMemory numbers",
                              kv["NodeName"]);
    }
    n.gpus = gres_gpus(kv["Gres"]);
    out[kv["NodeName"]] = n;
    return ok_status();
  }));
  return out;
}

}  // namespace

KeyValues key_values(const std::string& text) {
  KeyValues kv;
  std::istringstream in(text);
  std::string tok;
  while (in >> tok) {
    auto eq = tok.find('=');
    if (eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
  }
  return kv;
}

Status for_each_node(const std::string& text, const std::function<Status(KeyValues&)>& fn) {
  std::istringstream in(text);
  std::string line, block;
  auto flush = [&]() -> Status {
    KeyValues kv = key_values(block);
    block.clear();
    return kv.contains("NodeName") ? fn(kv) : ok_status();
  };
  while (std::getline(in, line)) {
    if (line.find("NodeName=") != std::string::npos) SHOAL_RETURN_IF_ERROR(flush());
    block += line + "\n";
  }
  return flush();
}

Result<Topology> from_slurm(const std::string& topology_conf, const std::string& scontrol_nodes) {
  SHOAL_ASSIGN_OR_RETURN(auto nodes, parse_scontrol(scontrol_nodes));
  Topology t;
  std::map<std::string, int> index;
  std::vector<std::pair<int, std::vector<std::string>>> children;
  std::istringstream in(topology_conf);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    auto kv = key_values(line);
    if (kv.empty()) continue;
    if (!kv.contains("SwitchName"))
      return invalid_argument("topology.conf:{}: a line without SwitchName=", lineno);
    int s = static_cast<int>(t.switches.size());
    if (!index.emplace(kv["SwitchName"], s).second)
      return invalid_argument("topology.conf:{}: switch `{}` twice", lineno, kv["SwitchName"]);
    t.switches.push_back({kv["SwitchName"], -1, {}});
    if (kv.contains("Nodes")) {
      SHOAL_ASSIGN_OR_RETURN(auto names, expand_hostlist(kv["Nodes"]));
      for (const std::string& n : names) {
        auto it = nodes.find(n);
        if (it == nodes.end())
          return invalid_argument("topology.conf:{}: node `{}` is not in scontrol show nodes",
                                  lineno, n);
        Node node;
        node.name = n;
        node.cpus = it->second.cpus;
        node.mem_mb = it->second.mem;
        node.accels = it->second.gpus;
        node.leaf = s;
        t.switches[s].nodes.push_back(static_cast<int>(t.nodes.size()));
        t.nodes.push_back(node);
      }
    }
    if (kv.contains("Switches")) {
      SHOAL_ASSIGN_OR_RETURN(auto names, expand_hostlist(kv["Switches"]));
      children.push_back({s, names});
    }
  }
  for (const auto& [parent, names] : children)
    for (const std::string& n : names) {
      auto it = index.find(n);
      if (it == index.end())
        return invalid_argument("topology.conf: switch `{}` lists unknown switch `{}`",
                                t.switches[parent].name, n);
      t.switches[it->second].parent = parent;
    }
  SHOAL_RETURN_IF_ERROR(validate(t));
  return t;
}

std::string to_topology_conf(const Topology& t) {
  std::string out = "# topology.conf for TopologyPlugin=topology/tree (written by shoal)\n";
  for (std::size_t s = 0; s < t.switches.size(); ++s) {
    const Switch& sw = t.switches[s];
    out += "SwitchName=" + sw.name;
    std::vector<std::string> kids;
    for (std::size_t c = 0; c < t.switches.size(); ++c)
      if (t.switches[c].parent == static_cast<int>(s)) kids.push_back(t.switches[c].name);
    if (!kids.empty()) out += " Switches=" + compress_hostlist(kids);
    std::vector<std::string> names;
    for (int n : sw.nodes) names.push_back(t.nodes[n].name);
    if (!names.empty()) out += " Nodes=" + compress_hostlist(names);
    out += "\n";
  }
  return out;
}

}  // namespace shoal::cluster
