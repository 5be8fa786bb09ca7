// Kubernetes manifests for a job: an Indexed Job with a headless Service
// (pods reach rank 0 as <job>-0.<job>) and a Volcano PodGroup for gang
// scheduling, or Kubeflow's PyTorchJob / MPIJob shapes. Node affinity from
// the placer when it placed the job. The environment each pod gets is the
// torchrun contract Shoal reads: MASTER_ADDR, MASTER_PORT, WORLD_SIZE and
// RANK (from the job-completion index).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shoal/cluster/placer.h"

namespace shoal::cluster {

struct K8sOptions {
  std::string kind = "job";  // job (Indexed Job + Service + PodGroup), pytorchjob, mpijob
  std::string image = "shoal:latest";
  std::string namespace_ = "default";
  int port = 29500;              // rank 0's store
  bool volcano = true;           // job: a PodGroup and schedulerName volcano
  std::vector<std::string> cmd;  // each rank's command
  // The job token (SHOAL_JOB_TOKEN: authenticated rendezvous and links),
  // shipped as a Secret the pods read; "" = none.
  std::string token;
};

// YAML, documents separated by `---`. The job token is not in them: the
// pods read it from the Secret kubernetes_secret writes (a file of its own,
// kept private, never printed).
Result<std::string> kubernetes_manifests(const Topology* t, const JobSpec& j,
                                         const std::optional<Placement>& p, const K8sOptions& o);
std::string kubernetes_secret(const JobSpec& j, const K8sOptions& o);

// Writes DIR/<name>.k8s.yaml (placed on `model`, a YAML cluster model,
// when given) and the job token's Secret, DIR/<name>.secret.yaml (mode
// 0600), and unless `dry_run` applies both with kubectl; with no API server
// reachable that is an error naming the written files.
struct K8sSubmission {
  std::string path, manifests;
  std::string secret_path;         // DIR/<name>.secret.yaml, mode 0600
  std::vector<std::string> nodes;  // the placer's, when placed
  std::string applied;             // kubectl's output
};
Result<K8sSubmission> submit_kubernetes(const JobSpec& j, const K8sOptions& o,
                                        const std::string& dir, const std::string& model,
                                        bool dry_run);

}  // namespace shoal::cluster
