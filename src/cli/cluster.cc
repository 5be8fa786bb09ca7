// `shoal simulate` and `shoal place`: the cluster module's placer and
// trace-driven simulator from the command line (cluster/*.h).
#include <CLI/CLI.hpp>
#include <filesystem>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "shoal/cluster/k8s.h"
#include "shoal/cluster/project.h"
#include "shoal/cluster/sim.h"
#include "shoal/cluster/slurm.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"

namespace shoal::cli {

namespace {

void add_topology_flags(CLI::App* a, ClusterFlags& f) {
  a->add_option("--cluster", f.cluster,
                "Cluster model (YAML: nodes and switches, or generate:); default: generated "
                "from --nodes --per-switch --accels --cpus --mem-mb --chip-links");
  a->add_option("--nodes", f.nodes, "Generated cluster: nodes")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  a->add_option("--per-switch", f.per_switch, "Generated cluster: nodes per leaf switch")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  a->add_option("--accels", f.accels, "Generated cluster: accelerators per node (0..64)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  a->add_option("--cpus", f.cpus, "Generated cluster: CPUs per node")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  a->add_option("--mem-mb", f.mem_mb, "Generated cluster: memory per node (MB)")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  a->add_option("--chip-links", f.chip_links, "Generated cluster: chip links in a node")
      ->check(CLI::IsMember({"none", "ring"}))
      ->capture_default_str();
}

Result<cluster::Topology> topology_of(const ClusterFlags& f) {
  if (!f.cluster.empty()) return cluster::load_topology(f.cluster);
  return cluster::generate_topology(
      f.nodes, f.per_switch, f.cpus, f.mem_mb, f.accels,
      f.chip_links == "ring" ? cluster::ChipLinks::kRing : cluster::ChipLinks::kNone);
}

Result<std::vector<cluster::Policy>> policies_of(const std::vector<std::string>& names) {
  std::vector<cluster::Policy> out;
  for (const std::string& n : names) {
    bool found = false;
    for (auto p : {cluster::Policy::kFifoFirstFit, cluster::Policy::kBackfill,
                   cluster::Policy::kTopoBackfill, cluster::Policy::kShoal})
      if (n == cluster::policy_name(p)) out.push_back(p), found = true;
    if (!found)
      return invalid_argument(
          "--policies: `{}` is not fifo-first-fit, backfill, backfill-topo or shoal", n);
  }
  return out;
}

std::string chips_text(std::uint64_t mask) {
  std::string out;
  for (int c = 0; c < 64; ++c)
    if (mask >> c & 1) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out.empty() ? "-" : out;
}

// The flags of `shoal simulate --project` and --png.
void add_projection_flags(CLI::App* sim, ClusterFlags& f) {
  sim->add_flag("--project", f.project,
                "Instead: project all-reduce (ring, halving-doubling, hierarchical) and the "
                "data-parallel step to 8..4096 ranks from the link costs");
  sim->add_option("--png", f.png, "Also chart the policies (utilization, goodput, waits) here");
  sim->add_option("--ranks-per-node", f.ranks_per_node, "--project: ranks sharing a node")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sim->add_option("--project-ranks", f.project_ranks, "--project: world sizes")->delimiter(',');
  sim->add_option("--bytes", f.project_bytes, "--project: all-reduce sizes")->delimiter(',');
  sim->add_option("--compute-ms", f.compute_ms,
                  "--project: one step's compute, for the step efficiency column");
  sim->add_option("--host-alpha-us", f.host_alpha_us, "Link cost within a node: α (µs)");
  sim->add_option("--host-gbit-s", f.host_gbit_s, "Link cost within a node: bandwidth (Gbit/s)");
  sim->add_option("--net-alpha-us", f.net_alpha_us, "Link cost under one switch: α (µs)");
  sim->add_option("--net-gbit-s", f.net_gbit_s, "Link cost under one switch: Gbit/s");
  sim->add_option("--spine-alpha-us", f.spine_alpha_us, "Link cost across switches: α (µs)");
  sim->add_option("--spine-gbit-s", f.spine_gbit_s, "Link cost across switches: Gbit/s");
}

CLI::App* add_submit_command(CLI::App& app, ClusterFlags& f) {
  CLI::App* s = app.add_subcommand(
      "submit",
      "Place a job (YAML spec) and submit it: to Slurm (sbatch on the placer's nodes, ranks "
      "under shoal run --engine srun) or as Kubernetes manifests");
  s->add_option("job", f.job, "Job spec (YAML)")->required();
  s->add_option("--engine", f.engine, "Where to run it")
      ->check(CLI::IsMember({"slurm", "kubernetes"}))
      ->capture_default_str();
  s->add_option("--image", f.image, "kubernetes: the container image")->capture_default_str();
  s->add_option("--k8s-kind", f.k8s_kind,
                "kubernetes: job (Indexed Job + headless Service + Volcano PodGroup), "
                "pytorchjob or mpijob (Kubeflow)")
      ->check(CLI::IsMember({"job", "pytorchjob", "mpijob"}))
      ->capture_default_str();
  s->add_option("--namespace", f.k8s_namespace, "kubernetes: the namespace")->capture_default_str();
  s->add_option("--store-port", f.k8s_port, "kubernetes: the port rank 0 serves the store on")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  s->add_flag("--no-volcano", f.no_volcano,
              "kubernetes: no PodGroup (the default scheduler; no gang scheduling)");
  s->add_option("--cluster", f.cluster,
                "Place on this cluster model instead of the live Slurm cluster's "
                "(scontrol show nodes + topology.conf)");
  s->add_option("--chip-links", f.live_chip_links,
                "How the live cluster's GPUs are linked within a node (Slurm does not "
                "say)")
      ->check(CLI::IsMember({"none", "ring"}));
  s->add_option("--dir", f.dir,
                "Where the sbatch script, topology.conf and output go (default "
                "runs/submit-<job name>)");
  s->add_flag("--dry-run", f.dry_run, "Write the script and print it; submit nothing");
  s->add_flag("--pin", f.pin,
              "slurm: pin the job to the nodes the placer picks now (--nodelist) instead of "
              "letting Slurm place it from its shape");
  s->add_flag("--wait", f.wait, "Wait for the job to end; exit with its exit code");
  s->add_option("--wait-seconds", f.wait_s, "With --wait: cancel the job after S seconds")
      ->check(positive())
      ->capture_default_str();
  s->add_option("--rank-timeout", f.rank_timeout_s, "shoal run --timeout for the ranks (0 = none)")
      ->check(non_negative());
  s->add_option("cmd", f.cmd, "Each rank's command (after --)")->required();
  return s;
}

}  // namespace

ClusterCommand add_cluster_commands(CLI::App& app) {
  ClusterCommand c;
  c.flags = std::make_shared<ClusterFlags>();
  auto& f = *c.flags;
  c.simulate = app.add_subcommand(
      "simulate", "Simulate a job trace on a cluster under each scheduling policy, side by side");
  add_topology_flags(c.simulate, f);
  c.simulate->add_option("--pai", f.pai,
                         "Alibaba PAI GPU trace (cluster-trace-gpu-v2020 pai_task_table.csv) "
                         "instead of a synthetic trace");
  c.simulate->add_option("--jobs", f.jobs, "Synthetic trace: jobs (with --pai: at most)")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  c.simulate
      ->add_option("--load", f.synth.load, "Synthetic: offered load (1 = the cluster's capacity)")
      ->check(CLI::Range(0.01, 100.0))
      ->capture_default_str();
  c.simulate->add_option("--queues", f.synth.queues, "Synthetic: tenant queues")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  c.simulate->add_option("--seed", f.synth.seed, "Synthetic: random seed")->capture_default_str();
  c.simulate
      ->add_option("--failures-per-node-day", f.synth.failures_per_node_day,
                   "Synthetic: node failures (each repaired after an hour)")
      ->check(CLI::Range(0.0, 100.0));
  c.simulate
      ->add_option("--comm-fraction", f.synth.comm_fraction,
                   "Synthetic: share of a multi-chip job's step spent in its all-reduce on "
                   "an ideal placement (0: placement costs nothing)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  c.simulate->add_option("--policies", f.policies, "Policies to compare")
      ->delimiter(',')
      ->capture_default_str();
  c.simulate->add_option("--max-tries", f.sim.max_tries, "Jobs looked at per scheduling pass")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  c.simulate
      ->add_option("--move-s", f.sim.move_s,
                   "Shoal's policy: seconds a running job loses when moved to make room for a "
                   "gang, or suspended for a reservation's holder (checkpoint and restart); "
                   "negative: neither")
      ->capture_default_str();
  c.simulate->add_flag("--baseline-adjacency", f.sim.baseline_adjacency,
                       "The baselines also keep ring jobs on linked chips (first fit), so the "
                       "comparison is of scheduling alone");
  add_projection_flags(c.simulate, f);
  c.place = app.add_subcommand(
      "place", "Place jobs (YAML specs) one after another on a cluster and show where they go");
  add_topology_flags(c.place, f);
  c.place->add_option("jobs", f.job_files, "Job spec files (YAML)");
  c.place->add_option("--topology-conf,--emit-topology", f.topology_conf,
                      "Also write the cluster as Slurm's topology.conf to FILE");
  c.place->add_option("--serve", f.serve,
                      "Instead: serve kube-scheduler's extender verbs (filter, prioritize) on "
                      "HOST:PORT, placing Shoal's jobs on the --cluster model");
  c.place->add_option("--url-prefix", f.url_prefix,
                      "--serve: the path before /filter and /prioritize (the extender "
                      "config's urlPrefix path)");
  c.place
      ->add_option("--hold-seconds", f.hold_seconds,
                   "--serve: drop a job's plan when none of its pods was asked about for "
                   "this long")
      ->check(positive())
      ->capture_default_str();
  c.submit = add_submit_command(app, f);
  return c;
}

namespace {

int run_submit_k8s(const cluster::JobSpec& j, const ClusterFlags& f, const std::string& dir) {
  cluster::K8sOptions k;
  k.kind = f.k8s_kind;
  k.image = f.image;
  k.namespace_ = f.k8s_namespace;
  k.port = f.k8s_port;
  k.volcano = !f.no_volcano;
  k.cmd = f.cmd;
  auto s = cluster::submit_kubernetes(j, k, dir, f.cluster, f.dry_run);
  if (!s.ok()) {
    SHOAL_LOG_ERROR("shoal submit: {}", s.status().to_string());
    return 2;
  }
  if (!s->nodes.empty()) fmt::print("{}: placed on {}\n", j.name, fmt::join(s->nodes, " "));
  fmt::print("{}: manifests in {}, the job token's Secret in {} (mode 0600, not shown)\n{}", j.name,
             s->path, s->secret_path, f.dry_run ? s->manifests : s->applied);
  return 0;
}

}  // namespace

int run_submit(const ClusterFlags& f) {
  auto j = cluster::load_job_spec(f.job);
  if (!j.ok()) {
    SHOAL_LOG_ERROR("shoal submit: {}", j.status().to_string());
    return 2;
  }
  cluster::SubmitOptions o;
  o.dir = f.dir.empty() ? "runs/submit-" + j->name : f.dir;
  o.dir = std::filesystem::absolute(o.dir).string();
  o.shoal = std::filesystem::read_symlink("/proc/self/exe").string();
  o.cmd = f.cmd;
  o.rank_timeout_s = f.rank_timeout_s;
  o.pin = f.pin;
  o.live_links =
      f.live_chip_links == "ring" ? cluster::ChipLinks::kRing : cluster::ChipLinks::kNone;
  if (f.engine == "kubernetes") return run_submit_k8s(*j, f, o.dir);
  auto s = cluster::submit_slurm(*j, o, f.cluster, f.dry_run, f.wait, f.wait_s);
  if (!s.ok()) {
    SHOAL_LOG_ERROR("shoal submit: {}", s.status().to_string());
    return 2;
  }
  if (s->rank_nodes.empty())
    fmt::print("{}: does not fit now ({}); Slurm queues it until it does\n", j->name, s->why);
  else if (f.pin)
    fmt::print("{}: placed on {}{}\n", j->name, fmt::join(s->rank_nodes, " "),
               s->one_switch ? " (one switch)" : "");
  else
    fmt::print("{}: fits now (on {}{}); Slurm places it\n", j->name, fmt::join(s->rank_nodes, " "),
               s->one_switch ? ", one switch" : "");
  if (f.dry_run) {
    fmt::print("{}", s->script);
    return 0;
  }
  fmt::print("{}: Slurm job {} ({})\n", j->name, s->job_id, s->script_path);
  if (f.wait)  // before: --wait ended without a word on how
    fmt::print("{}: Slurm job {} ended {} on {}, exit code {}\n", j->name, s->job_id, s->state,
               s->ran_on.empty() ? "no node" : s->ran_on, s->exit_code);
  return f.wait ? s->exit_code : 0;
}

namespace {

void override_costs(const ClusterFlags& f, cluster::LinkCosts& c) {
  auto set = [](cluster::LinkCost& l, double alpha_us, double gbit_s) {
    if (alpha_us >= 0) l.alpha = alpha_us * 1e-6;
    if (gbit_s > 0) l.beta = 8 / (gbit_s * 1e9);
  };
  set(c.host, f.host_alpha_us, f.host_gbit_s);
  set(c.leaf, f.net_alpha_us, f.net_gbit_s);
  set(c.spine, f.spine_alpha_us, f.spine_gbit_s);
}

}  // namespace

int run_simulate(const ClusterFlags& f) {
  auto t = topology_of(f);
  if (t.ok()) override_costs(f, t->costs);
  if (t.ok() && f.project) {
    const auto& c = t->costs;
    fmt::print(
        "link costs: node α {:.2f} µs {:.2f} Gbit/s; switch α {:.2f} µs {:.2f} Gbit/s; "
        "spine α {:.2f} µs {:.2f} Gbit/s; {} ranks per node, {} nodes per switch\n",
        c.host.alpha * 1e6, 8e-9 / c.host.beta, c.leaf.alpha * 1e6, 8e-9 / c.leaf.beta,
        c.spine.alpha * 1e6, 8e-9 / c.spine.beta, f.ranks_per_node, f.per_switch);
    auto rows = cluster::project_allreduce(c, f.project_ranks, f.project_bytes, f.ranks_per_node,
                                           f.per_switch);
    fmt::print("{}", cluster::format_projection(rows, f.compute_ms / 1e3));
    return 0;
  }
  auto policies = policies_of(f.policies);
  if (!t.ok() || !policies.ok()) {
    SHOAL_LOG_ERROR("shoal simulate: {}", (t.ok() ? policies.status() : t.status()).to_string());
    return 2;
  }
  cluster::Trace trace;
  if (!f.pai.empty()) {
    auto tr = cluster::load_pai_trace(f.pai, f.jobs);
    if (!tr.ok()) {
      SHOAL_LOG_ERROR("shoal simulate: {}", tr.status().to_string());
      return 2;
    }
    trace = std::move(*tr);
  } else {
    cluster::SyntheticOptions o = f.synth;
    o.jobs = f.jobs;
    trace = cluster::synthetic_trace(*t, o);
  }
  fmt::print("cluster: {} nodes, {} switches, {} chips, {} CPUs; trace: {}\n", t->nodes.size(),
             t->switches.size(), t->total_accels(), t->total_cpus(), trace.source);
  fmt::print("goodput ceiling: {:.1f}% (every job from its submit, whole, on ideal chips)\n",
             100 * cluster::goodput_ceiling(*t, trace));
  std::vector<cluster::SimReport> reports;
  for (auto p : *policies) reports.push_back(cluster::simulate(*t, trace, p, f.sim));
  fmt::print("{}{}", cluster::format_reports(reports), cluster::format_wait_reasons(reports));
  if (!f.png.empty()) {
    if (Status st = cluster::plot_reports(reports, trace, f.png); !st.ok()) {
      SHOAL_LOG_ERROR("shoal simulate: {}", st.to_string());
      return 2;
    }
    fmt::print("chart: {}\n", f.png);
  }
  return 0;
}

int run_place(const ClusterFlags& f) {
  if (!f.serve.empty()) return run_place_serve(f);
  if (f.job_files.empty()) {
    SHOAL_LOG_ERROR("shoal place: give job spec files to place, or --serve HOST:PORT");
    return 2;
  }
  auto t = topology_of(f);
  if (!t.ok()) {
    SHOAL_LOG_ERROR("shoal place: {}", t.status().to_string());
    return 2;
  }
  if (!f.topology_conf.empty()) {
    if (Status st = write_file_atomic(f.topology_conf, cluster::to_topology_conf(*t)); !st.ok()) {
      SHOAL_LOG_ERROR("shoal place: {}", st.to_string());
      return 2;
    }
  }
  cluster::ClusterState state(*t);
  int unplaced = 0;
  for (const std::string& file : f.job_files) {
    auto j = cluster::load_job_spec(file);
    if (!j.ok()) {
      SHOAL_LOG_ERROR("shoal place: {}", j.status().to_string());
      return 2;
    }
    const cluster::Fit fit = cluster::fit(state, *j);
    if (!fit.ever) {
      fmt::print(
          "{}: can never fit on this cluster, even empty ({} ranks × {} chips, links {}{}): {}\n",
          j->name, j->ranks, j->accels_per_rank, cluster::link_need_name(j->links),
          j->links == cluster::LinkNeed::kMesh
              ? fmt::format(" {}x{}: a mesh must fit in one node's mesh", j->mesh_w, j->mesh_h)
              : "",
          fit.why);
      ++unplaced;
      continue;
    }
    const auto& p = fit.p;
    if (!p || !state.take(*j, p->ranks).ok()) {
      fmt::print("{}: does not fit now ({} ranks × {} chips, links {}): {}\n", j->name, j->ranks,
                 j->accels_per_rank, cluster::link_need_name(j->links), fit.why);
      ++unplaced;
      continue;
    }
    fmt::print(
        "{}: {} ranks, links {} ({}), all-reduce of {} MB {:.2f} ms (best {:.2f} ms), "
        "step slowdown {:.3f}\n",
        j->name, p->ranks.size(), cluster::link_need_name(j->links),
        cluster::adjacent(*t, *j, *p) ? "adjacent" : "not adjacent", j->allreduce_mb,
        1e3 * cluster::allreduce_seconds(*t, *j, *p),
        1e3 * cluster::ideal_allreduce_seconds(*t, *j, j->ranks), cluster::slowdown(*t, *j, *p));
    for (std::size_t r = 0; r < p->ranks.size(); ++r)
      fmt::print("  rank {:>3}: node {} chips {}\n", r, t->nodes[p->ranks[r].node].name,
                 chips_text(p->ranks[r].accels));
  }
  fmt::print("fragmentation after: {:.3f}\n", state.fragmentation());
  return unplaced == 0 ? 0 : 3;
}

}  // namespace shoal::cli
