// Slurm as the engine: the live cluster's model and use, the sbatch
// script for a placed job, and its submission.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "cluster/slurm_text.h"
#include "shoal/cluster/slurm.h"
#include "shoal/core/deadline.h"
#include "shoal/core/file.h"

namespace shoal::cluster {

namespace {

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// GPUs in use on a node. `scontrol -d`'s GresUsed counts them
// (gpu:4(IDX:0-3), or typed: gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:2));
// AllocTRES does only when AccountingStorageTRES lists gres/gpu, which by
// default it does not, so it is the fallback.
int gpus_in_use(const std::string& gres_used, const std::string& tres) {
  if (!gres_used.empty()) {
    int n = 0;
    std::size_t at = 0;
    while ((at = gres_used.find("gpu", at)) != std::string::npos) {
      const std::size_t paren = gres_used.find('(', at), comma = gres_used.find(',', at);
      const std::size_t end = std::min(paren, comma);
      const std::size_t colon = gres_used.rfind(':', end);
      if (colon != std::string::npos && colon >= at) n += std::atoi(gres_used.c_str() + colon + 1);
      if (comma == std::string::npos) break;
      at = comma;
    }
    return n;
  }
  auto at = tres.find("gres/gpu=");
  return at == std::string::npos ? 0 : std::atoi(tres.c_str() + at + 9);
}

Status occupy_node(ClusterState& s, int n, const KeyValues& kv) {
  auto get = [&](const char* k) {
    auto it = kv.find(k);
    return it == kv.end() ? std::string() : it->second;
  };
  const std::string state = get("State");
  for (const char* bad : {"DOWN", "DRAIN", "INVAL", "FAIL", "NOT_RESPONDING"})
    if (state.find(bad) != std::string::npos) s.set_up(n, false);
  JobSpec used;
  used.name = "in use on " + get("NodeName");
  used.cpus_per_rank = std::atoi(get("CPUAlloc").c_str());
  used.mem_mb_per_rank = std::atoll(get("AllocMem").c_str());
  used.accels_per_rank = gpus_in_use(get("GresUsed"), get("AllocTRES"));
  if (used.cpus_per_rank == 0 && used.mem_mb_per_rank == 0 && used.accels_per_rank == 0)
    return ok_status();
  std::uint64_t chips = 0, free = s.free_accels(n);
  for (int i = 0; i < used.accels_per_rank && free; ++i) {
    chips |= free & (~free + 1);
    free &= free - 1;
  }
  return s.take(used, {{n, chips}});
}

}  // namespace

Status occupy_from_scontrol(ClusterState& s, const std::string& text) {
  return for_each_node(text, [&](KeyValues& kv) -> Status {
    int n = s.topology().find_node(kv["NodeName"]);
    if (n < 0) return ok_status();  // a node outside the model: not ours to place on
    return occupy_node(s, n, kv);
  });
}

std::string sbatch_script(const Topology& t, const JobSpec& j, const std::optional<Placement>& p,
                          const SubmitOptions& o) {
  const int tasks = j.ranks + j.servers;
  std::string s = "#!/bin/sh\n# Written by shoal submit for job `" + j.name + "`.\n";
  auto opt = [&](const std::string& x) { s += "#SBATCH " + x + "\n"; };
  opt("--job-name=" + j.name);
  opt("--ntasks=" + std::to_string(tasks));
  if (j.cpus_per_rank > 0) opt("--cpus-per-task=" + std::to_string(j.cpus_per_rank));
  if (j.mem_mb_per_rank > 0 && j.cpus_per_rank > 0)
    opt("--mem-per-cpu=" +
        std::to_string((j.mem_mb_per_rank + j.cpus_per_rank - 1) / j.cpus_per_rank));
  if (j.accels_per_rank > 0) opt("--gpus-per-task=" + std::to_string(j.accels_per_rank));
  // Slurm places the job, from its shape; a node list only when the user
  // pins it (--pin). A snapshot taken at submit time is stale by the time
  // the job starts, and Slurm's own scheduler sees what it does not.
  bool one_switch = j.links != LinkNeed::kNone;
  if (p && o.pin) {
    std::vector<std::string> names;
    std::set<int> seen, leaves;
    for (const RankSlot& r : p->ranks)
      if (seen.insert(r.node).second) {
        names.push_back(t.nodes[r.node].name);
        leaves.insert(t.nodes[r.node].leaf);
      }
    opt("--nodes=" + std::to_string(names.size()));
    opt("--nodelist=" + compress_hostlist(names));
    one_switch |= leaves.size() == 1;
  } else if (j.links != LinkNeed::kNone) {
    // A ring or mesh larger than a node is whole nodes of one switch (the
    // placer's rule): that many nodes, under --switches=1 below. Not
    // --contiguous: measured on Slurm 22.05 with topology/tree, it makes
    // Slurm pick n[2-3] across two switches where n[3-4] share one
    // (docs/cluster.md).
    int per_node = 0;
    for (const Node& n : t.nodes) per_node = std::max(per_node, n.accels);
    const int k = j.total_accels();
    opt("--nodes=" + std::to_string(per_node > 0 ? (k + per_node - 1) / per_node : 1));
  }
  // One switch, waited for up to switch_wait_s (Slurm's own cap is
  // SchedulerParameters=max_switch_wait, 300 s by default).
  if (one_switch)
    opt(fmt::format("--switches=1@{}",
                    std::max<long>(1, std::lround(std::ceil(o.switch_wait_s / 60)))));
  if (j.max_runtime_s > 0)
    opt("--time=" + std::to_string(static_cast<long>(std::ceil(j.max_runtime_s / 60))));
  opt("--output=" + o.dir + "/" + j.name + "-%j.out");
  s += "exec " + quote(o.shoal) + " run --engine srun -n " + std::to_string(tasks);
  if (o.rank_timeout_s > 0) s += " --timeout " + std::to_string(o.rank_timeout_s);
  s += " --";
  for (const std::string& a : o.cmd) s += " " + quote(a);
  return s + "\n";
}

Result<CommandResult> run_command(const std::vector<std::string>& argv, double timeout_s) {
  std::string line = "timeout -k 2 " + std::to_string(timeout_s);
  for (const std::string& a : argv) line += " " + quote(a);
  line += " 2>&1";
  FILE* f = popen(line.c_str(), "r");
  if (!f) return unavailable("cannot run `{}`", argv.empty() ? "" : argv[0]);
  CommandResult r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int st = pclose(f);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  if (r.code == 124)
    return deadline_exceeded("`{}` did not finish within {} s", argv[0], timeout_s);
  return r;
}

namespace {

// The live cluster: scontrol's nodes under topology.conf's switches (one
// switch over all when the cluster has no topology.conf).
Result<Topology> live_topology(std::string& scontrol, ChipLinks links) {
  // -d: GresUsed, the GPUs in use (AllocTRES leaves them out by default).
  SHOAL_ASSIGN_OR_RETURN(CommandResult r, run_command({"scontrol", "-d", "show", "nodes"}, 20));
  if (r.code != 0) return unavailable("scontrol show nodes failed: {}", r.out);
  scontrol = r.out;
  const char* conf = std::getenv("SLURM_CONF");
  std::string dir = conf ? std::filesystem::path(conf).parent_path().string() : "/etc/slurm";
  std::string topo;
  if (std::filesystem::exists(dir + "/topology.conf")) {
    SHOAL_ASSIGN_OR_RETURN(topo, read_file(dir + "/topology.conf"));
  } else {
    std::vector<std::string> names;
    std::istringstream in(r.out);
    std::string tok;
    while (in >> tok)
      if (tok.rfind("NodeName=", 0) == 0) names.push_back(tok.substr(9));
    topo = "SwitchName=all Nodes=" + compress_hostlist(names) + "\n";
  }
  SHOAL_ASSIGN_OR_RETURN(Topology t, from_slurm(topo, r.out));
  for (Node& n : t.nodes)
    if (n.accels > 0) n.links = links;
  return t;
}

// Polls `scontrol show job` until the job ends; its exit code. Past the
// deadline the job is cancelled, so nothing is left behind.
Result<int> wait_for_job(const std::string& id, double wait_s, std::string* final_state,
                         std::string* nodes) {
  const Deadline d = Deadline::after_seconds(wait_s);
  for (int polls = 0; polls < 1000000; ++polls) {
    SHOAL_ASSIGN_OR_RETURN(CommandResult r, run_command({"scontrol", "show", "job", id}, 10));
    auto kv = key_values(r.out);
    const std::string state = kv["JobState"];
    if (r.code == 0 && state != "PENDING" && state != "RUNNING" && state != "CONFIGURING" &&
        state != "COMPLETING" && !state.empty()) {
      int code = std::atoi(kv["ExitCode"].c_str());
      *final_state = state;
      *nodes = kv["NodeList"] == "(null)" ? "" : kv["NodeList"];
      if (state == "COMPLETED") return 0;
      return code != 0 ? code : 1;  // CANCELLED, FAILED, TIMEOUT, NODE_FAIL
    }
    if (d.expired()) {
      (void)run_command({"scancel", id}, 10);
      return deadline_exceeded("Slurm job {} still {} after {} s: cancelled", id,
                               state.empty() ? "unknown" : state, wait_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return deadline_exceeded("Slurm job {}: gave up polling", id);
}

}  // namespace

Result<Submission> submit_slurm(const JobSpec& j, const SubmitOptions& o, const std::string& model,
                                bool dry_run, bool wait, double wait_s) {
  std::string scontrol;
  Topology t;
  if (!model.empty()) {
    SHOAL_ASSIGN_OR_RETURN(t, load_topology(model));
  } else {
    SHOAL_ASSIGN_OR_RETURN(t, live_topology(scontrol, o.live_links));
  }
  ClusterState s(t);
  if (!scontrol.empty()) SHOAL_RETURN_IF_ERROR(occupy_from_scontrol(s, scontrol));
  // A job that cannot fit even on the empty cluster is refused here; sbatch
  // would queue it forever or refuse it later with less to say.
  const Fit fit = cluster::fit(s, j);
  if (!fit.ever)
    return failed_precondition(
        "job `{}` can never fit on this cluster, even empty ({} ranks x {} GPUs, {} CPUs, {} MB "
        "each, links {}): {}",
        j.name, j.ranks, j.accels_per_rank, j.cpus_per_rank, j.mem_mb_per_rank,
        link_need_name(j.links), fit.why);
  Submission out;
  out.why = fit.why;
  const std::optional<Placement>& p = fit.p;
  if (p) {
    std::set<int> leaves, nodes;
    for (const RankSlot& r : p->ranks) {
      out.rank_nodes.push_back(t.nodes[r.node].name);
      leaves.insert(t.nodes[r.node].leaf);
      nodes.insert(r.node);
    }
    out.one_switch =
        leaves.size() == 1 && nodes.size() > 1;  // "one switch" says nothing of one node
  }
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  if (ec) return unavailable("cannot create {}: {}", o.dir, ec.message());
  out.script = sbatch_script(t, j, p, o);
  out.script_path = o.dir + "/" + j.name + ".sbatch";
  SHOAL_RETURN_IF_ERROR(write_file_atomic(out.script_path, out.script));
  SHOAL_RETURN_IF_ERROR(write_file_atomic(o.dir + "/topology.conf", to_topology_conf(t)));
  if (dry_run) return out;
  SHOAL_ASSIGN_OR_RETURN(CommandResult r,
                         run_command({"sbatch", "--parsable", out.script_path}, 30));
  out.job_id = r.out.substr(0, r.out.find_first_of(";\n"));
  if (r.code != 0 || out.job_id.empty())
    return unavailable("sbatch refused {}: {}", out.script_path, r.out);
  if (!wait) return out;
  SHOAL_ASSIGN_OR_RETURN(out.exit_code, wait_for_job(out.job_id, wait_s, &out.state, &out.ran_on));
  return out;
}

}  // namespace shoal::cluster
