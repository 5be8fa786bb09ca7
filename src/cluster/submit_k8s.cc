// `shoal submit --engine kubernetes`: manifests written, then applied with
// kubectl where an API server answers.
#include <sodium.h>

#include <filesystem>
#include <set>

#include "shoal/cluster/k8s.h"
#include "shoal/cluster/slurm.h"
#include "shoal/core/file.h"

namespace shoal::cluster {

Result<K8sSubmission> submit_kubernetes(const JobSpec& j, const K8sOptions& o,
                                        const std::string& dir, const std::string& model,
                                        bool dry_run) {
  K8sSubmission out;
  std::optional<Topology> t;
  std::optional<Placement> p;
  if (!model.empty()) {
    SHOAL_ASSIGN_OR_RETURN(t, load_topology(model));
    ClusterState s(*t);
    p = place(s, j, j.ranks, {});
    if (p) {
      std::set<std::string> seen;
      for (const RankSlot& r : p->ranks)
        if (seen.insert(t->nodes[r.node].name).second) out.nodes.push_back(t->nodes[r.node].name);
    }
  }
  K8sOptions with_token = o;
  if (with_token.token.empty()) {
    unsigned char key[32];
    randombytes_buf(key, sizeof key);
    for (unsigned char b : key) with_token.token += fmt::format("{:02x}", b);
  }
  SHOAL_ASSIGN_OR_RETURN(out.manifests, kubernetes_manifests(t ? &*t : nullptr, j, p, with_token));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return unavailable("cannot create {}: {}", dir, ec.message());
  out.path = dir + "/" + j.name + ".k8s.yaml";
  out.secret_path = dir + "/" + j.name + ".secret.yaml";
  SHOAL_RETURN_IF_ERROR(write_file_atomic(out.secret_path, kubernetes_secret(j, with_token), 0600));
  SHOAL_RETURN_IF_ERROR(write_file_atomic(out.path, out.manifests));
  if (dry_run) return out;
  auto info = run_command({"kubectl", "cluster-info", "--request-timeout=5s"}, 15);
  if (!info.ok() || info->code != 0)
    return unavailable(
        "no Kubernetes API server answers (kubectl cluster-info: {}); the "
        "manifests are in {} and {}: apply them where one does",
        info.ok() ? info->out.substr(0, info->out.find('\n')) : info.status().message(),
        out.secret_path, out.path);
  SHOAL_ASSIGN_OR_RETURN(
      CommandResult r,
      run_command({"kubectl", "apply", "-f", out.secret_path, "-f", out.path}, 60));
  if (r.code != 0) return unavailable("kubectl apply -f {} failed: {}", out.path, r.out);
  out.applied = r.out;
  return out;
}

}  // namespace shoal::cluster
