#include "shoal/cluster/k8s.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <set>

namespace shoal::cluster {

namespace {

using json = nlohmann::json;

// JSON → YAML with every string quoted (an env value "29500" must stay a
// string, not become a number).
void emit(YAML::Emitter& e, const json& v) {
  if (v.is_object()) {
    e << YAML::BeginMap;
    for (const auto& [k, x] : v.items()) {
      e << YAML::Key << k << YAML::Value;
      emit(e, x);
    }
    e << YAML::EndMap;
  } else if (v.is_array()) {
    e << YAML::BeginSeq;
    for (const auto& x : v) emit(e, x);
    e << YAML::EndSeq;
  } else if (v.is_string()) {
    e << YAML::DoubleQuoted << v.get<std::string>();
  } else if (v.is_boolean()) {
    e << v.get<bool>();
  } else if (v.is_number_integer()) {
    e << v.get<long long>();
  } else if (v.is_number()) {
    e << v.get<double>();
  } else {
    e << YAML::Null;
  }
}

// What `ranks` ranks of the job need together. Memory in "M" (10^6
// bytes), the unit of the spec's mem_mb_per_rank; "Mi" asked about 5% more.
json quantities(const JobSpec& j, int ranks) {
  json r = json::object();
  if (j.cpus_per_rank > 0) r["cpu"] = std::to_string(j.cpus_per_rank * ranks);
  if (j.mem_mb_per_rank > 0) r["memory"] = std::to_string(j.mem_mb_per_rank * ranks) + "M";
  if (j.accels_per_rank > 0) r["nvidia.com/gpu"] = std::to_string(j.accels_per_rank * ranks);
  return r;
}

std::string yaml_documents(const std::string& head, const std::vector<json>& docs) {
  std::string out = head;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    YAML::Emitter e;
    emit(e, docs[i]);
    out += (i ? "---\n" : "") + std::string(e.c_str()) + "\n";
  }
  return out;
}

json resources(const JobSpec& j) {
  json r = quantities(j, 1);
  return {{"limits", r}, {"requests", r}};
}

// Pod failures the job outlives: none for a sync gang (one pod fails, the
// job fails and its pods stop); for an elastic job, as many as it can lose
// and still train (the controller starts a replacement for each).
int failures_tolerated(const JobSpec& j) { return j.ranks - j.fewest_ranks(); }

json labels(const JobSpec& j) {
  // shoal.dev/ranks and /links tell `shoal place --serve` (kube-scheduler's
  // extender) the gang each pod belongs to.
  json l = {{"app.kubernetes.io/managed-by", "shoal"},
            {"shoal.dev/job", j.name},
            {"shoal.dev/ranks", std::to_string(j.ranks)},
            {"shoal.dev/links", link_need_name(j.links)}};
  if (j.links == LinkNeed::kMesh) l["shoal.dev/mesh"] = fmt::format("{}x{}", j.mesh_w, j.mesh_h);
  return l;
}

// Required node affinity to the placer's nodes.
json affinity(const Topology* t, const std::optional<Placement>& p) {
  if (!t || !p) return nullptr;
  std::set<std::string> nodes;
  for (const RankSlot& r : p->ranks) nodes.insert(t->nodes[r.node].name);
  json values(std::vector<std::string>(nodes.begin(), nodes.end()));
  return {{"nodeAffinity",
           {{"requiredDuringSchedulingIgnoredDuringExecution",
             {{"nodeSelectorTerms",
               json::array({{{"matchExpressions", json::array({{{"key", "kubernetes.io/hostname"},
                                                                {"operator", "In"},
                                                                {"values", values}}})}}})}}}}}};
}

json container(const std::string& name, const JobSpec& j, const K8sOptions& o, json env,
               const std::string& port_name = "store") {
  if (!o.token.empty())
    env.push_back(
        {{"name", "SHOAL_JOB_TOKEN"},
         {"valueFrom", {{"secretKeyRef", {{"name", j.name + "-token"}, {"key", "token"}}}}}});
  json c = {{"name", name},
            {"image", o.image},
            {"command", o.cmd},
            {"resources", resources(j)},
            {"ports", json::array({{{"name", port_name}, {"containerPort", o.port}}})}};
  if (!env.empty()) c["env"] = std::move(env);
  return c;
}

// An elastic job's coordinator: one pod running `shoal run --engine
// external`, which serves the store (on the wildcard address, reached as
// <job>-coord.<job> through the headless Service) and keeps the job's
// generations; the ranks' pods claim their places there. Its Job ends with
// the training (it is done when every member is), and it is not a rank:
// no shoal.dev/ranks label, so the extender leaves it out of the gang.
json coordinator_job(const JobSpec& j, const K8sOptions& o) {
  const std::string bin =
      !o.cmd.empty() && o.cmd[0].size() >= 5 && o.cmd[0].substr(o.cmd[0].size() - 5) == "shoal"
          ? o.cmd[0]
          : "shoal";
  K8sOptions co = o;
  co.cmd = {bin,
            "run",
            "--engine",
            "external",
            "-n",
            std::to_string(j.ranks),
            "--elastic",
            fmt::format("{}:{}", j.fewest_ranks(), j.ranks),
            "--store-host",
            "0.0.0.0",
            "--store-port",
            std::to_string(o.port)};
  JobSpec light = j;  // it trains nothing
  light.accels_per_rank = 0;
  light.cpus_per_rank = 1;
  light.mem_mb_per_rank = 0;
  json meta_labels = {{"app.kubernetes.io/managed-by", "shoal"},
                      {"shoal.dev/job", j.name},
                      {"shoal.dev/role", "coordinator"}};
  json pod = {{"hostname", j.name + "-coord"},
              {"subdomain", j.name},
              {"restartPolicy", "Never"},
              {"containers", json::array({container("coordinator", light, co, json::array())})}};
  json spec = {{"completions", 1},
               {"parallelism", 1},
               {"backoffLimit", 0},
               {"template", {{"metadata", {{"labels", meta_labels}}}, {"spec", pod}}}};
  if (j.max_runtime_s > 0) spec["activeDeadlineSeconds"] = static_cast<long long>(j.max_runtime_s);
  return {{"apiVersion", "batch/v1"},
          {"kind", "Job"},
          {"metadata",
           {{"name", j.name + "-coord"}, {"namespace", o.namespace_}, {"labels", meta_labels}}},
          {"spec", spec}};
}

// The ranks' variables: a sync job's meet through rank 0's store (the
// torchrun contract); an elastic job's claim their places at the
// coordinator's (SHOAL_ELASTIC=join), so a pod the Job controller starts
// again for a failed index joins the job as a newcomer.
json rank_env(const JobSpec& j, const K8sOptions& o) {
  if (failures_tolerated(j) > 0)
    return json::array({{{"name", "SHOAL_ELASTIC"}, {"value", "join"}},
                        {{"name", "SHOAL_STORE"},
                         {"value", fmt::format("{}-coord.{}:{}", j.name, j.name, o.port)}}});
  return json::array(
      {{{"name", "MASTER_ADDR"}, {"value", j.name + "-0." + j.name}},
       {{"name", "MASTER_PORT"}, {"value", std::to_string(o.port)}},
       {{"name", "WORLD_SIZE"}, {"value", std::to_string(j.ranks)}},
       {{"name", "RANK"},
        {"valueFrom",
         {{"fieldRef",
           {{"fieldPath",
             "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}}}}});
}

std::vector<json> indexed_job(const Topology* t, const JobSpec& j,
                              const std::optional<Placement>& p, const K8sOptions& o) {
  const int ranks = j.ranks;
  json env = rank_env(j, o);
  json pod = {{"subdomain", j.name},
              {"restartPolicy", "Never"},
              {"containers", json::array({container("rank", j, o, env)})}};
  if (auto a = affinity(t, p); !a.is_null()) pod["affinity"] = a;
  json meta = {{"labels", labels(j)}};
  if (o.volcano) {
    pod["schedulerName"] = "volcano";
    meta["annotations"] = {{"scheduling.k8s.io/group-name", j.name}};
  }
  json spec = {{"completionMode", "Indexed"},
               {"completions", ranks},
               {"parallelism", ranks},
               {"backoffLimit", failures_tolerated(j)},
               {"template", {{"metadata", meta}, {"spec", pod}}}};
  // An elastic job is done when as many pods as it trains on at least
  // have: the rest may be gone, dropped (a frozen pod the coordinator left
  // behind) or replacements still counting.
  if (failures_tolerated(j) > 0)
    spec["successPolicy"] = {{"rules", json::array({{{"succeededCount", j.fewest_ranks()}}})}};
  if (j.max_runtime_s > 0) spec["activeDeadlineSeconds"] = static_cast<long long>(j.max_runtime_s);
  std::vector<json> docs;
  docs.push_back(
      {{"apiVersion", "v1"},
       {"kind", "Service"},
       {"metadata", {{"name", j.name}, {"namespace", o.namespace_}, {"labels", labels(j)}}},
       {"spec",
        {{"clusterIP", "None"},
         {"publishNotReadyAddresses", true},
         {"selector", {{"shoal.dev/job", j.name}}},
         {"ports", json::array({{{"name", "store"}, {"port", o.port}}})}}}});
  if (o.volcano) {
    // The gang is the fewest ranks that train, and so are the resources it
    // waits for: the rest of an elastic job's pods start when they fit.
    json min_res = quantities(j, j.fewest_ranks());
    docs.push_back(
        {{"apiVersion", "scheduling.volcano.sh/v1beta1"},
         {"kind", "PodGroup"},
         {"metadata", {{"name", j.name}, {"namespace", o.namespace_}}},
         {"spec",
          {{"minMember", j.fewest_ranks()}, {"minResources", min_res}, {"queue", j.queue}}}});
  }
  if (failures_tolerated(j) > 0) docs.push_back(coordinator_job(j, o));
  docs.push_back(
      {{"apiVersion", "batch/v1"},
       {"kind", "Job"},
       {"metadata", {{"name", j.name}, {"namespace", o.namespace_}, {"labels", labels(j)}}},
       {"spec", spec}});
  return docs;
}

json replica(int n, json pod_spec, const json& meta) {
  return {{"replicas", n},
          {"restartPolicy", "Never"},
          {"template", {{"metadata", meta}, {"spec", std::move(pod_spec)}}}};
}

json run_policy(const JobSpec& j, int min_available) {
  json rp = {{"cleanPodPolicy", "All"},
             {"backoffLimit", failures_tolerated(j)},
             {"schedulingPolicy", {{"minAvailable", min_available}, {"queue", j.queue}}}};
  if (j.max_runtime_s > 0) rp["activeDeadlineSeconds"] = static_cast<long long>(j.max_runtime_s);
  return rp;
}

std::vector<json> pytorch_job(const Topology* t, const JobSpec& j,
                              const std::optional<Placement>& p, const K8sOptions& o) {
  // The operator sets MASTER_ADDR (<job>-master-0), MASTER_PORT (the
  // container port named pytorchjob-port), WORLD_SIZE and RANK (one process
  // per pod: RANK is the process's rank), the torchrun contract Shoal reads.
  json pod = {
      {"containers", json::array({container("pytorch", j, o, json::array(), "pytorchjob-port")})}};
  if (auto a = affinity(t, p); !a.is_null()) pod["affinity"] = a;
  json meta = {{"labels", labels(j)}};
  json replicas = {{"Master", replica(1, pod, meta)}};
  if (j.ranks > 1) replicas["Worker"] = replica(j.ranks - 1, pod, meta);
  return {{{"apiVersion", "kubeflow.org/v1"},
           {"kind", "PyTorchJob"},
           {"metadata", {{"name", j.name}, {"namespace", o.namespace_}, {"labels", labels(j)}}},
           {"spec",
            {{"runPolicy", run_policy(j, j.fewest_ranks())}, {"pytorchReplicaSpecs", replicas}}}}};
}

std::vector<json> mpi_job(const Topology* t, const JobSpec& j, const std::optional<Placement>& p,
                          const K8sOptions& o) {
  // mpirun does not say where rank 0 runs (docs/launch.md), so the launch
  // line does: rank 0 is on the first worker (the operator's hostfile lists
  // the workers in order, one slot each) and serves the store there, under
  // the name the operator's headless Service <job>-worker gives that pod.
  // The job token goes with it: a process sshd starts sees none of its
  // pod's environment.
  std::vector<std::string> launch = {"mpirun",
                                     "-n",
                                     std::to_string(j.ranks),
                                     "--allow-run-as-root",
                                     "-x",
                                     fmt::format("SHOAL_STORE={}-worker-0.{}-worker.{}.svc:{}",
                                                 j.name, j.name, o.namespace_, o.port),
                                     "-x",
                                     "SHOAL_STORE_SERVE=1"};
  if (!o.token.empty()) launch.insert(launch.end(), {"-x", "SHOAL_JOB_TOKEN"});
  launch.insert(launch.end(), o.cmd.begin(), o.cmd.end());
  K8sOptions lo = o;
  lo.cmd = launch;
  JobSpec light = j;  // the launcher only starts mpirun
  light.accels_per_rank = 0;
  light.cpus_per_rank = 1;
  light.mem_mb_per_rank = 0;
  json launcher = {{"containers", json::array({container("launcher", light, lo, json::array())})}};
  K8sOptions wo = o;
  wo.cmd = {"/usr/sbin/sshd", "-De"};
  json worker = {{"containers", json::array({container("worker", j, wo, json::array())})}};
  if (auto a = affinity(t, p); !a.is_null()) worker["affinity"] = a;
  json meta = {{"labels", labels(j)}};
  return {{{"apiVersion", "kubeflow.org/v2beta1"},
           {"kind", "MPIJob"},
           {"metadata", {{"name", j.name}, {"namespace", o.namespace_}, {"labels", labels(j)}}},
           {"spec",
            {{"slotsPerWorker", 1},
             {"mpiImplementation", "OpenMPI"},
             {"runPolicy", run_policy(j, j.fewest_ranks() + 1)},
             {"mpiReplicaSpecs",
              {{"Launcher", replica(1, launcher, meta)},
               {"Worker", replica(j.ranks, worker, meta)}}}}}}};
}

}  // namespace

Result<std::string> kubernetes_manifests(const Topology* t, const JobSpec& j,
                                         const std::optional<Placement>& p, const K8sOptions& o) {
  if (o.cmd.empty()) return invalid_argument("kubernetes: job `{}` has no command", j.name);
  if (j.kind == JobKind::kPs)
    return invalid_argument(
        "kubernetes: job `{}` is a ps job; manifests for its servers are not "
        "built yet",
        j.name);
  // A DNS-1123 label: the Job's pods are named <job>-<index> under it.
  for (char c : j.name)
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-'))
      return invalid_argument(
          "kubernetes: job name `{}` must be lower-case letters, digits and '-'", j.name);
  std::vector<json> docs;
  if (o.kind == "job") {
    docs = indexed_job(t, j, p, o);
  } else if (o.kind == "pytorchjob") {
    docs = pytorch_job(t, j, p, o);
  } else if (o.kind == "mpijob") {
    if (failures_tolerated(j) > 0)
      return invalid_argument(
          "kubernetes: job `{}` is elastic ({} to {} ranks), and mpirun cannot lose a rank and "
          "go on: use --k8s-kind job or pytorchjob",
          j.name, j.fewest_ranks(), j.ranks);
    docs = mpi_job(t, j, p, o);
  } else {
    return invalid_argument("kubernetes: kind `{}` is not job, pytorchjob or mpijob", o.kind);
  }
  return yaml_documents("# Written by shoal submit --engine kubernetes for job `" + j.name + "`." +
                            (o.token.empty() ? ""
                                             : " Its pods read the job token from the Secret " +
                                                   j.name + "-token (kubernetes_secret).") +
                            "\n",
                        docs);
}

std::string kubernetes_secret(const JobSpec& j, const K8sOptions& o) {
  return yaml_documents(
      "# The job token of `" + j.name + "`: keep this file private (mode 0600).\n",
      {json{{"apiVersion", "v1"},
            {"kind", "Secret"},
            {"metadata",
             {{"name", j.name + "-token"}, {"namespace", o.namespace_}, {"labels", labels(j)}}},
            {"type", "Opaque"},
            {"stringData", {{"token", o.token}}}}});
}

}  // namespace shoal::cluster
