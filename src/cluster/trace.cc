// Job traces: a synthetic generator and a loader for Alibaba PAI's GPU trace.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "shoal/cluster/sim.h"

namespace shoal::cluster {

namespace {

int widest_node_chips(const Topology& t) {
  int a = 0;
  for (const Node& n : t.nodes) a = std::max(a, n.accels);
  return a;
}

}  // namespace

Trace synthetic_trace(const Topology& t, const SyntheticOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::lognormal_distribution<double> dur(std::log(1800.0), 1.4);
  const int node_chips = std::max(1, widest_node_chips(t));
  const bool chips = t.total_accels() > 0;
  const Node& proto = t.nodes[0];
  // Chips per job (the studies: most jobs one GPU, a tail of big gangs).
  const std::vector<std::pair<int, double>> sizes = {{1, 0.55},  {2, 0.10},  {4, 0.12}, {8, 0.12},
                                                     {16, 0.05}, {32, 0.04}, {64, 0.02}};
  std::vector<double> qshare;
  for (int q = 0; q < o.queues; ++q) qshare.push_back(std::pow(0.6, q));
  std::discrete_distribution<int> pick_q(qshare.begin(), qshare.end());
  Trace tr;
  tr.source = fmt::format("synthetic: {} jobs, load {}, seed {}", o.jobs, o.load, o.seed);
  double work = 0;  // chip-seconds
  for (int i = 0; i < o.jobs; ++i) {
    double r = u(rng), acc = 0;
    int size = sizes.back().first;
    for (const auto& [s, p] : sizes)
      if ((acc += p) >= r) {
        size = s;
        break;
      }
    TraceJob tj;
    JobSpec& j = tj.spec;
    j.name = "j" + std::to_string(i + 1);
    j.ranks = size;
    j.accels_per_rank = chips ? 1 : 0;
    const int per_chip = chips ? std::max(1, proto.cpus / std::max(1, proto.accels)) : 1;
    j.cpus_per_rank = per_chip;
    j.mem_mb_per_rank = chips ? proto.mem_mb / std::max(1, proto.accels) / 2 : 0;
    j.queue = "q" + std::to_string(pick_q(rng));
    j.priority = u(rng) < o.urgent_share ? 10 : 0;
    bool ring_fits = size <= node_chips || size % node_chips == 0;
    if (size > 1 && chips && ring_fits && u(rng) < o.ring_share) {
      j.links = LinkNeed::kRing;
    } else if (size > 1 && u(rng) < o.elastic_share / (1 - o.ring_share)) {
      j.kind = JobKind::kElastic;
      j.min_ranks = std::max(1, size / 2);
    }
    j.comm_fraction = size > 1 ? o.comm_fraction : 0;
    j.checkpoint_every_s = 1800;
    tj.duration = std::clamp(dur(rng), 60.0, 7 * 86400.0);
    j.max_runtime_s = std::ceil(tj.duration * (1.2 + 1.8 * u(rng)) / 60) * 60;
    work += tj.duration * size;
    tr.jobs.push_back(tj);
  }
  // Poisson arrivals at the offered load.
  const double capacity = chips ? t.total_accels() : t.total_cpus();
  const double rate = o.load * capacity / std::max(1.0, work / o.jobs);
  std::exponential_distribution<double> gap(rate);
  double now = 0;
  for (TraceJob& tj : tr.jobs) tj.submit = now += gap(rng);
  if (o.failures_per_node_day > 0) {
    std::exponential_distribution<double> fgap(o.failures_per_node_day * t.nodes.size() / 86400);
    std::uniform_int_distribution<int> node(0, static_cast<int>(t.nodes.size()) - 1);
    for (double f = fgap(rng); f < now; f += fgap(rng)) tr.failures.push_back({f, node(rng), 3600});
  }
  return tr;
}

namespace {

struct PaiJob {
  double start = 1e300, end = 0;
  int ranks = 0, servers = 0;
  double cpu = 0, mem = 0, gpu = 0;  // per instance, the largest task's
  bool ok = true;
};

std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> f;
  std::stringstream in(line);
  std::string x;
  while (std::getline(in, x, ',')) f.push_back(x);
  if (!line.empty() && line.back() == ',') f.emplace_back();
  return f;
}

// Adds one pai_task_table row to its job; false when the row cannot count
// (not terminated, times or numbers missing or malformed): the job is then
// left out.
bool add_task(PaiJob& j, const std::vector<std::string>& f) {
  if (f[3] != "Terminated" || f[4].empty() || f[5].empty()) return false;
  int inst = 0;
  double s = 0, e = 0, cpu = 0, mem = 0, gpu = 0;
  try {
    inst = static_cast<int>(std::stod(f[2]));
    s = std::stod(f[4]);
    e = std::stod(f[5]);
    cpu = f[6].empty() ? 0 : std::stod(f[6]);
    mem = f[7].empty() ? 0 : std::stod(f[7]);
    gpu = f[8].empty() ? 0 : std::stod(f[8]);
  } catch (const std::exception&) {  // std::stod: not a number, or out of range
    return false;
  }
  if (inst < 1 || e < s) return false;
  j.start = std::min(j.start, s);
  j.end = std::max(j.end, e);
  (f[1] == "ps" ? j.servers : j.ranks) += inst;
  j.cpu = std::max(j.cpu, cpu);
  j.mem = std::max(j.mem, mem);
  j.gpu = std::max(j.gpu, gpu);
  return true;
}

}  // namespace

Result<Trace> load_pai_trace(const std::string& path, int max_jobs) {
  std::ifstream in(path);
  if (!in) return not_found("{}: cannot open the PAI task table", path);
  std::map<std::string, PaiJob> jobs;
  std::string line;
  long lineno = 0, skipped = 0;
  while (std::getline(in, line)) {
    ++lineno;
    auto f = csv_fields(line);
    if (f.size() != 10)
      return invalid_argument(
          "{}:{}: {} columns, a pai_task_table row has 10 (job_name, "
          "task_name, inst_num, status, start_time, end_time, plan_cpu, "
          "plan_mem, plan_gpu, gpu_type)",
          path, lineno, f.size());
    PaiJob& j = jobs[f[0]];
    if (!add_task(j, f)) {
      j.ok = false;
      ++skipped;
    }
  }
  Trace tr;
  // A job whose tasks start and end in the same second took no time: it is
  // left out of the simulation, and said so by name (before: silently).
  std::vector<std::string> instant;
  for (const auto& [name, pj] : jobs) {
    if (pj.ok && pj.ranks > 0 && pj.end == pj.start) instant.push_back(name);
    if (!pj.ok || pj.ranks == 0 || pj.end <= pj.start) continue;
    TraceJob tj;
    tj.spec.name = name;
    tj.spec.ranks = pj.ranks;
    tj.spec.cpus_per_rank = std::max(1, static_cast<int>(std::ceil(pj.cpu / 100)));
    tj.spec.mem_mb_per_rank = static_cast<std::int64_t>(pj.mem * 1024);
    tj.spec.accels_per_rank = pj.gpu > 0 ? static_cast<int>(std::ceil(pj.gpu / 100)) : 0;
    if (pj.servers > 0) {
      tj.spec.kind = JobKind::kPs;
      tj.spec.servers = pj.servers;
      tj.spec.min_ranks = pj.ranks;
    }
    tj.spec.comm_fraction = pj.ranks > 1 ? 0.3 : 0;
    tj.submit = pj.start;
    tj.duration = pj.end - pj.start;
    tj.spec.max_runtime_s = tj.duration * 2;
    tr.jobs.push_back(tj);
  }
  std::sort(tr.jobs.begin(), tr.jobs.end(),
            [](const TraceJob& a, const TraceJob& b) { return a.submit < b.submit; });
  if (max_jobs > 0 && static_cast<int>(tr.jobs.size()) > max_jobs) tr.jobs.resize(max_jobs);
  if (!tr.jobs.empty()) {
    double t0 = tr.jobs.front().submit;
    for (TraceJob& tj : tr.jobs) tj.submit -= t0;
  }
  tr.source = fmt::format("{}: {} jobs ({} rows skipped: not Terminated or incomplete", path,
                          tr.jobs.size(), skipped);
  if (!instant.empty())
    tr.source +=
        fmt::format("; {} jobs of zero duration left out: {}{}", instant.size(),
                    fmt::join(instant.begin(),
                              instant.begin() + std::min<std::size_t>(instant.size(), 3), ", "),
                    instant.size() > 3 ? ", ..." : "");
  tr.source += ")";
  return tr;
}

}  // namespace shoal::cluster
