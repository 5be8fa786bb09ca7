// `shoal submit --engine kubernetes`. No API server can run here, so: the
// manifests (Indexed Job + headless Service + Volcano PodGroup, Kubeflow
// PyTorchJob and MPIJob) are checked offline against the Kubernetes
// schemas (npm kubernetes-models, tools/k8s_validate.mjs), and the in-pod
// contract is tested by running ranks with exactly the environment those
// manifests give a pod (MASTER_ADDR=<job>-0.<job>, MASTER_PORT,
// WORLD_SIZE, RANK, JOB_COMPLETION_INDEX, HOSTNAME, SHOAL_JOB_TOKEN from
// its Secret), the headless
// Service's names resolving to loopback through an /etc/hosts mounted in
// a private mount namespace (unshare): a master that starts late, and a
// pod that is killed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "cli/run_shoal.h"
#include "free_port.h"
#include "temp_dir.h"

namespace {

using Result = shoal::testing::ShoalRun;
using shoal::testing::run_sh;
bool has(const Result& r, const std::string& s) { return r.out.find(s) != std::string::npos; }

std::string npm_dir() {
  const char* d = std::getenv("SHOAL_NPM_DIR");
  return d ? d
           : std::string(std::getenv("HOME") ? std::getenv("HOME") : "/root") + "/.cache/shoal-npm";
}

class K8s : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.path() + "/gang.yaml")
        << "name: gang\nranks: 2\naccels_per_rank: 4\ncpus_per_rank: 2\nmem_mb_per_rank: "
           "8000\nlinks: ring\nmax_runtime_s: 600\n";
    std::ofstream(dir_.path() + "/c.yaml")
        << "generate: {nodes: 4, per_switch: 2, cpus: 16, mem_mb: 64000, accels: 4, links: "
           "ring}\n";
  }
  Result submit(const std::string& kind) {
    return shoal::testing::run_shoal("submit " + dir_.path() +
                                     "/gang.yaml --engine kubernetes "
                                     "--k8s-kind " +
                                     kind + " --cluster " + dir_.path() +
                                     "/c.yaml --dry-run --dir " + dir_.path() + "/" + kind +
                                     " -- shoal train --model cnn");
  }
  Result validate(const std::string& file) {
    return run_sh("SHOAL_NPM_DIR=" + npm_dir() + " node " + SHOAL_SOURCE_DIR +
                  "/tools/k8s_validate.mjs " + file);
  }
  shoal::testing::TempDir dir_{"k8s"};
};

TEST_F(K8s, ManifestsPassTheKubernetesSchemas) {
  if (run_sh("command -v node").code != 0) GTEST_SKIP() << "node is not installed";
  if (run_sh("test -d " + npm_dir() + "/node_modules/kubernetes-models").code != 0)
    GTEST_SKIP() << "npm kubernetes-models is not in " << npm_dir()
                 << " (tools/install-deps.sh installs it)";
  for (const char* kind : {"job", "pytorchjob", "mpijob"}) {
    Result r = submit(kind);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(has(r, "gang: placed on n1 n2")) << r.out;
    Result v = validate(dir_.path() + "/" + kind + "/gang.k8s.yaml");
    EXPECT_EQ(v.code, 0) << kind << ": " << v.out;
  }
  const std::string job = dir_.path() + "/job/gang.k8s.yaml";
  Result text = run_sh("cat " + job);
  EXPECT_TRUE(has(text, "completionMode: \"Indexed\"")) << text.out;
  EXPECT_TRUE(has(text, "minMember: 2")) << text.out;
  EXPECT_TRUE(has(text, "value: \"gang-0.gang\"")) << text.out;
  EXPECT_TRUE(has(text, "batch.kubernetes.io/job-completion-index")) << text.out;
  EXPECT_TRUE(has(text, "kind: \"Secret\"")) << text.out;  // the job token, to every pod
  EXPECT_TRUE(has(text, "name: \"SHOAL_JOB_TOKEN\"")) << text.out;
  // The check can fail: a port written as a number where Kubernetes wants
  // the string an env value is.
  ASSERT_EQ(
      run_sh("sed 's/value: \"29500\"/value: 29500/' " + job + " > " + dir_.path() + "/bad.yaml")
          .code,
      0);
  Result bad = validate(dir_.path() + "/bad.yaml");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_TRUE(has(bad, "document 3 (batch/v1/Job)")) << bad.out;
}

// Two "pods" of the Indexed Job, each with only the environment its
// manifest gives it, the Service's names on loopback in a private mount
// namespace. `late` seconds before the master starts; `kill_after`
// seconds before pod 1 is killed (0: never); `dns_late` seconds before the
// Service's names resolve (a headless Service publishes a pod's record
// after the pod starts).
Result pods(const std::string& dir, int late, int kill_after, int steps, bool rank = true,
            int dns_late = 0) {
  const std::string train = std::string(SHOAL_BINARY) +
                            " train --model mlp --limit-train 4096 --limit-test 256 --threads 1 "
                            "--no-checkpoints --no-plot --epochs 1000 --max-steps " +
                            std::to_string(steps) + " --out " + dir + "/run";
  const int port = shoal::testing::free_port();
  const std::string pod = "env -i PATH=/usr/bin:/bin HOME=" + dir +
                          " MASTER_ADDR=gang-0.gang MASTER_PORT=" + std::to_string(port) +
                          " WORLD_SIZE=2 SHOAL_JOB_TOKEN=" + std::string(64, 'a') + " ";
  const std::string script =
      "set -u; cp /etc/hosts " + dir + "/hosts && mount --bind " + dir +
      "/hosts /etc/hosts || exit 77\n" + "(sleep " + std::to_string(dns_late) +
      "; echo '127.0.0.1 gang-0.gang gang-1.gang' >> " + dir + "/hosts) &\n" +
      (dns_late > 0 ? "" : "wait\n") + pod + (rank ? "RANK=1 " : "") +
      "JOB_COMPLETION_INDEX=1 HOSTNAME=gang-1 " + train + " > " + dir +
      "/pod1.log 2>&1 & p1=$!\nsleep " + std::to_string(late) + "\n" + pod +
      (rank ? "RANK=0 " : "") + "JOB_COMPLETION_INDEX=0 HOSTNAME=gang-0 " + train + " > " + dir +
      "/pod0.log 2>&1 & p0=$!\n" +
      (kill_after > 0 ? "sleep " + std::to_string(kill_after) + "; kill -9 $p1\n" : "") +
      "wait $p0; e0=$?; wait $p1; e1=$?\necho pod0-exit=$e0 pod1-exit=$e1\n"
      "sed 's/^/pod0: /' " +
      dir + "/pod0.log; sed 's/^/pod1: /' " + dir + "/pod1.log\n";
  std::ofstream(dir + "/pods.sh") << script;
  return run_sh("timeout 180 unshare --mount sh " + dir + "/pods.sh");
}

TEST_F(K8s, PodsMeetThroughTheHeadlessServiceWhenTheMasterIsLate) {
  Result r = pods(dir_.path(), 3, 0, 30);
  if (r.code == 77 || has(r, "unshare failed"))
    GTEST_SKIP() << "no private mount namespace here (unshare --mount needs root): " << r.out;
  EXPECT_TRUE(has(r, "pod0-exit=0 pod1-exit=0")) << r.out;
  EXPECT_TRUE(has(r, "waiting for the store at gang-0.gang:")) << r.out;
  EXPECT_TRUE(has(r, "batch 64 per rank x 2 ranks")) << r.out;
  EXPECT_TRUE(has(r, "pod0: final: test accuracy")) << r.out;
}

// The Service's record appears 4 s after both pods start: rank 0 serves
// its store on the wildcard address and every rank keeps resolving the
// name within SHOAL_STORE_WAIT instead of failing the Job at once.
TEST_F(K8s, PodsWaitForTheServiceRecordToResolve) {
  Result r = pods(dir_.path(), 0, 0, 10, true, 4);
  if (r.code == 77 || has(r, "unshare failed"))
    GTEST_SKIP() << "no private mount namespace here (unshare --mount needs root): " << r.out;
  EXPECT_TRUE(has(r, "pod0-exit=0 pod1-exit=0")) << r.out;
  EXPECT_TRUE(has(r, "(the name does not resolve)")) << r.out;
  EXPECT_FALSE(has(r, "port in use")) << r.out;
  EXPECT_TRUE(has(r, "pod0: final: test accuracy")) << r.out;
}

// A manifest of the user's own that sets no RANK: the completion index is
// the rank.
TEST_F(K8s, TheCompletionIndexAloneIsTheRank) {
  Result r = pods(dir_.path(), 0, 0, 10, false);
  if (r.code == 77 || has(r, "unshare failed"))
    GTEST_SKIP() << "no private mount namespace here (unshare --mount needs root): " << r.out;
  EXPECT_TRUE(has(r, "pod0-exit=0 pod1-exit=0")) << r.out;
  EXPECT_TRUE(has(r, "batch 64 per rank x 2 ranks")) << r.out;
}

TEST_F(K8s, AKilledPodStopsItsPeerWithItsName) {
  Result r = pods(dir_.path(), 0, 6, 100000);
  if (r.code == 77 || has(r, "unshare failed"))
    GTEST_SKIP() << "no private mount namespace here (unshare --mount needs root): " << r.out;
  EXPECT_TRUE(has(r, "pod1-exit=137")) << r.out;
  EXPECT_FALSE(has(r, "pod0-exit=0")) << r.out;
  // Its address: the route to the store's name (127.0.0.1 in these pods' /etc/hosts,
  // a loopback alias of a name, so the first other interface; docs/comm.md).
  EXPECT_TRUE(has(r, "rank 1 (")) << r.out;
  EXPECT_TRUE(has(r, "closed the connection (process died?)")) << r.out;
  EXPECT_LT(r.seconds, 90) << r.out;
}

}  // namespace
