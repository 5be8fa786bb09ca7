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

#include "cli/cli_results.h"
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

bool has_node_schemas() {
  return run_sh("command -v node").code == 0 &&
         run_sh("test -d " + npm_dir() + "/node_modules/kubernetes-models").code == 0;
}
#define SKIP_WITHOUT_SCHEMAS()                                      \
  if (!has_node_schemas())                                          \
  GTEST_SKIP() << "node or npm kubernetes-models (in " << npm_dir() \
               << ") is missing: tools/install-deps.sh installs them"

TEST_F(K8s, ManifestsPassTheKubernetesSchemas) {
  SKIP_WITHOUT_SCHEMAS();
  for (const char* kind : {"job", "pytorchjob", "mpijob"}) {
    Result r = submit(kind);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(has(r, "gang: placed on n1 n2")) << r.out;
    Result v = validate(dir_.path() + "/" + kind + "/gang.k8s.yaml");
    EXPECT_EQ(v.code, 0) << kind << ": " << v.out;
    // The token: in a Secret of its own, private, never printed.
    const std::string secret = dir_.path() + "/" + kind + "/gang.secret.yaml";
    Result sv = validate(secret);
    EXPECT_EQ(sv.code, 0) << kind << ": " << sv.out;
    EXPECT_EQ(run_sh("stat -c %a " + secret).out, "600\n") << kind;
    Result token = run_sh("sed -n 's/^ *token: \"\\(.*\\)\"$/\\1/p' " + secret);
    ASSERT_EQ(token.out.size(), 65u) << token.out;  // 64 hex digits and a newline
    EXPECT_FALSE(has(r, token.out.substr(0, 64))) << "the token was printed: " << r.out;
    EXPECT_FALSE(
        has(run_sh("cat " + dir_.path() + "/" + kind + "/gang.k8s.yaml"), token.out.substr(0, 64)));
  }
  const std::string job = dir_.path() + "/job/gang.k8s.yaml";
  Result text = run_sh("cat " + job);
  EXPECT_TRUE(has(text, "completionMode: \"Indexed\"")) << text.out;
  EXPECT_TRUE(has(text, "minMember: 2")) << text.out;
  EXPECT_TRUE(has(text, "memory: \"8000M\"")) << text.out;   // megabytes, as the spec says
  EXPECT_TRUE(has(text, "memory: \"16000M\"")) << text.out;  // the gang's: 2 pods
  EXPECT_TRUE(has(text, "value: \"gang-0.gang\"")) << text.out;
  EXPECT_TRUE(has(text, "batch.kubernetes.io/job-completion-index")) << text.out;
  EXPECT_TRUE(has(text, "name: \"SHOAL_JOB_TOKEN\"")) << text.out;
  // Each check can fail: an env value written as a number, a Job's pods
  // restarting in place, a subdomain with no Service, a gang that never
  // starts or starts short, resources of one pod for a gang of two.
  const std::pair<const char*, const char*> broken[] = {
      {"s/value: \"29500\"/value: 29500/", "document 2 (batch/v1/Job)"},
      {"s/restartPolicy: \"Never\"/restartPolicy: \"Always\"/", "restartPolicy Always"},
      {"s/subdomain: \"gang\"/subdomain: \"gang2\"/", "subdomain gang2 names no Service"},
      {"s/minMember: 2/minMember: 3/", "minMember 3 > the Job's 2 pods"},
      {"s/minMember: 2/minMember: 1/", "tolerates no failure"},
      {"s/memory: \"16000M\"/memory: \"8000M\"/", "minResources memory 8000M"},
  };
  for (const auto& [sed, why] : broken) {
    ASSERT_EQ(
        run_sh("sed '" + std::string(sed) + "' " + job + " > " + dir_.path() + "/bad.yaml").code,
        0);
    Result bad = validate(dir_.path() + "/bad.yaml");
    EXPECT_EQ(bad.code, 1) << sed << ": " << bad.out;
    EXPECT_TRUE(has(bad, why)) << sed << ": " << bad.out;
  }
}

// An elastic job: the gang is its fewest ranks, the Job outlives the
// failures it can afford and is done when as many pods as it trains on at
// least are; its ranks claim their places at a coordinator Job (`shoal run
// --engine external`); an MPIJob, which cannot lose a rank, is refused by
// name.
TEST_F(K8s, AnElasticJobsManifestsTolerateWhatItCanLose) {
  std::ofstream(dir_.path() + "/el.yaml") << "name: el\nkind: elastic\nranks: 8\nmin_ranks: "
                                             "2\ncpus_per_rank: 2\nmem_mb_per_rank: 8000\n";
  const std::string base = "submit " + dir_.path() +
                           "/el.yaml --engine kubernetes --dry-run --dir " + dir_.path() +
                           "/el --k8s-kind ";
  Result job = shoal::testing::run_shoal(base + "job -- shoal train");
  ASSERT_EQ(job.code, 0) << job.out;
  EXPECT_TRUE(has(job, "minMember: 2")) << job.out;
  EXPECT_TRUE(has(job, "cpu: \"4\"")) << job.out;  // 2 pods' worth, not 8
  EXPECT_TRUE(has(job, "backoffLimit: 6")) << job.out;
  EXPECT_TRUE(has(job, "succeededCount: 2")) << job.out;
  // Its ranks claim their places at a coordinator of their own.
  EXPECT_TRUE(has(job, "name: \"el-coord\"")) << job.out;
  EXPECT_TRUE(has(job, "- \"external\"")) << job.out;
  EXPECT_TRUE(has(job, "value: \"join\"")) << job.out;
  EXPECT_TRUE(has(job, "value: \"el-coord.el:29500\"")) << job.out;
  Result mpi = shoal::testing::run_shoal(base + "mpijob -- shoal train");
  EXPECT_EQ(mpi.code, 2) << mpi.out;
  EXPECT_TRUE(has(mpi, "is elastic (2 to 8 ranks), and mpirun cannot lose a rank")) << mpi.out;
  if (!has_node_schemas()) GTEST_SKIP() << "node or npm kubernetes-models is missing";
  Result v = validate(dir_.path() + "/el/el.k8s.yaml");
  EXPECT_EQ(v.code, 0) << v.out;
}

// The pod scripts exit 77 when they cannot bind-mount /etc/hosts.
#define SKIP_WITHOUT_MOUNT_NAMESPACE(r)             \
  if ((r).code == 77 || has((r), "unshare failed")) \
  GTEST_SKIP() << "no private mount namespace here (unshare --mount needs root): " << (r).out

// Two "pods", each with only the environment its manifest (or its
// operator) gives it, the Service's names on loopback in a private mount
// namespace.
struct Pods {
  int late = 0;        // seconds before the master starts
  int kill_after = 0;  // seconds before pod 1 is killed (0: never)
  int steps = 10;
  bool rank = true;  // RANK set (an Indexed Job of the user's own may set none)
  // Seconds before the Service's names resolve (a headless Service
  // publishes a pod's record after the pod starts).
  int dns_late = 0;
  std::string master = "gang-0.gang";             // MASTER_ADDR
  std::string names = "gang-0.gang gang-1.gang";  // what the Service publishes
};

Result pods(const std::string& dir, const Pods& o) {
  const std::string train = std::string(SHOAL_BINARY) +
                            " train --model mlp --limit-train 4096 --limit-test 256 --threads 1 "
                            "--no-checkpoints --no-plot --epochs 1000 --max-steps " +
                            std::to_string(o.steps) + " --out " + dir + "/run";
  const int port = shoal::testing::free_port();
  const std::string pod = "env -i PATH=/usr/bin:/bin HOME=" + dir + " MASTER_ADDR=" + o.master +
                          " MASTER_PORT=" + std::to_string(port) +
                          " WORLD_SIZE=2 SHOAL_JOB_TOKEN=" + std::string(64, 'a') + " ";
  const std::string script =
      "set -u; cp /etc/hosts " + dir + "/hosts && mount --bind " + dir +
      "/hosts /etc/hosts || exit 77\n" + "(sleep " + std::to_string(o.dns_late) +
      "; echo '127.0.0.1 " + o.names + "' >> " + dir + "/hosts) &\n" +
      (o.dns_late > 0 ? "" : "wait\n") + pod + (o.rank ? "RANK=1 " : "") +
      "JOB_COMPLETION_INDEX=1 HOSTNAME=gang-1 " + train + " > " + dir +
      "/pod1.log 2>&1 & p1=$!\nsleep " + std::to_string(o.late) + "\n" + pod +
      (o.rank ? "RANK=0 " : "") + "JOB_COMPLETION_INDEX=0 HOSTNAME=gang-0 " + train + " > " + dir +
      "/pod0.log 2>&1 & p0=$!\n" +
      (o.kill_after > 0 ? "sleep " + std::to_string(o.kill_after) + "; kill -9 $p1\n" : "") +
      "wait $p0; e0=$?; wait $p1; e1=$?\necho pod0-exit=$e0 pod1-exit=$e1\n"
      "sed 's/^/pod0: /' " +
      dir + "/pod0.log; sed 's/^/pod1: /' " + dir + "/pod1.log\n";
  std::ofstream(dir + "/pods.sh") << script;
  return run_sh("timeout 180 unshare --mount sh " + dir + "/pods.sh");
}

TEST_F(K8s, PodsMeetThroughTheHeadlessServiceWhenTheMasterIsLate) {
  Result r = pods(dir_.path(), {.late = 3, .steps = 30});
  SKIP_WITHOUT_MOUNT_NAMESPACE(r);
  EXPECT_TRUE(has(r, "pod0-exit=0 pod1-exit=0")) << r.out;
  EXPECT_TRUE(has(r, "waiting for the store at gang-0.gang:")) << r.out;
  EXPECT_TRUE(has(r, "batch 64 per rank x 2 ranks")) << r.out;
  EXPECT_TRUE(has(r, "pod0: final: test accuracy")) << r.out;
}

// The Service's record appears 4 s after both pods start: rank 0 serves
// its store on the wildcard address and every rank keeps resolving the
// name within SHOAL_STORE_WAIT instead of failing the Job at once.
TEST_F(K8s, PodsWaitForTheServiceRecordToResolve) {
  Result r = pods(dir_.path(), {.dns_late = 4});
  SKIP_WITHOUT_MOUNT_NAMESPACE(r);
  EXPECT_TRUE(has(r, "pod0-exit=0 pod1-exit=0")) << r.out;
  EXPECT_TRUE(has(r, "(the name does not resolve)")) << r.out;
  EXPECT_FALSE(has(r, "port in use")) << r.out;
  EXPECT_TRUE(has(r, "pod0: final: test accuracy")) << r.out;
}

// A manifest of the user's own that sets no RANK: the completion index is
// the rank.
TEST_F(K8s, TheCompletionIndexAloneIsTheRank) {
  Result r = pods(dir_.path(), {.rank = false});
  SKIP_WITHOUT_MOUNT_NAMESPACE(r);
  EXPECT_TRUE(has(r, "pod0-exit=0 pod1-exit=0")) << r.out;
  EXPECT_TRUE(has(r, "batch 64 per rank x 2 ranks")) << r.out;
}

TEST_F(K8s, AKilledPodStopsItsPeerWithItsName) {
  Result r = pods(dir_.path(), {.kill_after = 6, .steps = 100000});
  SKIP_WITHOUT_MOUNT_NAMESPACE(r);
  EXPECT_TRUE(has(r, "pod1-exit=137")) << r.out;
  EXPECT_FALSE(has(r, "pod0-exit=0")) << r.out;
  // Its address: the route to the store's name (127.0.0.1 in these pods' /etc/hosts,
  // a loopback alias of a name, so the first other interface; docs/comm.md).
  EXPECT_TRUE(has(r, "rank 1 (")) << r.out;
  EXPECT_TRUE(has(r, "closed the connection (process died?)")) << r.out;
  EXPECT_LT(r.seconds, 90) << r.out;
}

// A PyTorchJob's pods, with what the Kubeflow operator sets: MASTER_ADDR
// <job>-master-0 (its Service), MASTER_PORT from the port named
// pytorchjob-port, WORLD_SIZE and RANK.
TEST_F(K8s, PyTorchJobPodsTrainWithTheOperatorsEnvironment) {
  Result m = submit("pytorchjob");
  ASSERT_EQ(m.code, 0) << m.out;
  EXPECT_TRUE(has(m, "name: \"pytorchjob-port\"")) << m.out;
  Result r = pods(dir_.path(), {.master = "gang-master-0", .names = "gang-master-0 gang-worker-0"});
  SKIP_WITHOUT_MOUNT_NAMESPACE(r);
  EXPECT_TRUE(has(r, "pod0-exit=0 pod1-exit=0")) << r.out;
  EXPECT_TRUE(has(r, "batch 64 per rank x 2 ranks")) << r.out;
}

// The MPIJob's launcher command, as the manifest writes it, run by
// OpenMPI's mpirun with only the launcher pod's environment (the token from
// the Secret): its ranks find the store on the first worker's name (here on
// loopback in a private mount namespace) and train.
TEST_F(K8s, MpiJobLauncherCommandTrainsUnderOpenMpi) {
  if (run_sh("command -v mpirun.openmpi").code != 0)
    GTEST_SKIP() << "mpirun.openmpi is not installed (Debian openmpi-bin)";
  if (run_sh("python3 -c 'import yaml'").code != 0)
    GTEST_SKIP() << "python3 yaml is not installed (Debian python3-yaml)";
  const std::string d = dir_.path();
  const int port = shoal::testing::free_port();
  Result m = shoal::testing::run_shoal(
      "submit " + d + "/gang.yaml --engine kubernetes --k8s-kind mpijob --dry-run --dir " + d +
      "/mpi --store-port " + std::to_string(port) + " -- " + SHOAL_BINARY +
      " train --model mlp --limit-train 4096 --limit-test 256 --threads 1 --no-checkpoints "
      "--no-plot --max-steps 10 --out " +
      d + "/run");
  ASSERT_EQ(m.code, 0) << m.out;
  std::ofstream(d + "/launcher.py")
      << "import shlex, sys, yaml\n"
         "docs = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x]\n"
         "job = next(x for x in docs if x['kind'] == 'MPIJob')\n"
         "c = job['spec']['mpiReplicaSpecs']['Launcher']['template']['spec']['containers'][0]\n"
         "token = next(yaml.safe_load_all(open(sys.argv[2])))['stringData']['token']\n"
         "print('SHOAL_JOB_TOKEN=' + shlex.quote(token) + ' ' + shlex.join(c['command']))\n";
  Result cmd = run_sh("python3 " + d + "/launcher.py " + d + "/mpi/gang.k8s.yaml " + d +
                      "/mpi/gang.secret.yaml");
  ASSERT_EQ(cmd.code, 0) << cmd.out;
  EXPECT_TRUE(has(cmd, "SHOAL_STORE=gang-worker-0.gang-worker.default.svc:")) << cmd.out;
  std::ofstream(d + "/launcher.sh")
      << "set -u; cp /etc/hosts " << d << "/hosts && mount --bind " << d
      << "/hosts /etc/hosts || exit 77\n"
      << "echo '127.0.0.1 gang-worker-0.gang-worker.default.svc' >> " << d << "/hosts\n"
      << "mkdir -p " << d << "/bin && ln -sf \"$(command -v mpirun.openmpi)\" " << d
      << "/bin/mpirun\n"
      << "env -i PATH=" << d << "/bin:/usr/bin:/bin HOME=" << d << " " << cmd.out;
  Result r = run_sh("timeout 180 unshare --mount sh " + d + "/launcher.sh 2>&1");
  SKIP_WITHOUT_MOUNT_NAMESPACE(r);
  EXPECT_EQ(r.code, 0) << r.out;
  // On one host OpenMPI's ranks could derive a store; across pods they
  // cannot, so the test holds them to the one the manifest names.
  EXPECT_TRUE(has(r, "rank 0 serves the store at gang-worker-0.gang-worker.default.svc:")) << r.out;
  EXPECT_TRUE(has(r, "batch 64 per rank x 2 ranks")) << r.out;
  EXPECT_TRUE(has(r, "final: test accuracy")) << r.out;
}

// An elastic job's Indexed Job, run as Kubernetes would run it: the
// coordinator pod (`shoal run --engine external`) and three rank pods, each
// with exactly the command and environment of its manifest (the token from
// the Secret), el-coord.el resolving to loopback. Pod 1 is killed once
// training runs and the Job controller's new pod for that index (the same
// manifest) joins as a newcomer; the coordinator's Job and every live pod
// end with 0, the last generation of 3 ranks.
TEST_F(K8s, AnElasticJobsPodsClaimTheirPlacesAndAReplacementPodJoins) {
  if (run_sh("python3 -c 'import yaml'").code != 0)
    GTEST_SKIP() << "python3 yaml is not installed (Debian python3-yaml)";
  const std::string d = dir_.path();
  const int port = shoal::testing::free_port();
  std::ofstream(d + "/el.yaml") << "name: el\nkind: elastic\nranks: 3\nmin_ranks: 2\n"
                                   "cpus_per_rank: 1\nmem_mb_per_rank: 500\n";
  Result m = shoal::testing::run_shoal(
      "submit " + d + "/el.yaml --engine kubernetes --k8s-kind job --dry-run --dir " + d +
      "/el --store-port " + std::to_string(port) + " -- " + SHOAL_BINARY +
      " train --model mlp --limit-train 12000 --limit-test 256 --threads 1 --no-plot --quiet "
      "--batch 16 --epochs 4 --out " +
      d + "/run");
  ASSERT_EQ(m.code, 0) << m.out;
  // Each Job's pod: `env -i` with its variables, then its command.
  std::ofstream(d + "/pods.py")
      << "import shlex, sys, yaml\n"
         "docs = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x]\n"
         "token = next(yaml.safe_load_all(open(sys.argv[2])))['stringData']['token']\n"
         "for name in ('el-coord', 'el'):\n"
         "  job = next(x for x in docs if x['kind'] == 'Job' and x['metadata']['name'] == name)\n"
         "  c = job['spec']['template']['spec']['containers'][0]\n"
         "  env = ['SHOAL_JOB_TOKEN=' + token if e['name'] == 'SHOAL_JOB_TOKEN' else\n"
         "         e['name'] + '=' + e['value'] for e in c.get('env', [])]\n"
         "  print(name.replace('-', '_') + '=' + shlex.quote(shlex.join(env + c['command'])))\n";
  Result cmds =
      run_sh("python3 " + d + "/pods.py " + d + "/el/el.k8s.yaml " + d + "/el/el.secret.yaml");
  ASSERT_EQ(cmds.code, 0) << cmds.out;
  EXPECT_TRUE(has(cmds, "SHOAL_ELASTIC=join")) << cmds.out;
  EXPECT_TRUE(has(cmds, "SHOAL_STORE=el-coord.el:" + std::to_string(port))) << cmds.out;
  const std::string pod = "env -i PATH=/usr/bin:/bin HOME=" + d + " SHOAL_ELASTIC_COMMIT_EVERY=4 ";
  std::ofstream(d + "/pods.sh")
      << "set -u; cp /etc/hosts " << d << "/hosts && mount --bind " << d
      << "/hosts /etc/hosts || exit 77\n"
      << "echo '127.0.0.1 el-coord.el' >> " << d << "/hosts\n"
      << cmds.out << "cd " << d << "\n"
      << "timeout -s KILL 150 " << pod << "$el_coord > coord.log 2>&1 & coord=$!\n"
      << "for k in 0 1 2; do timeout -s KILL 150 " << pod
      << "JOB_COMPLETION_INDEX=$k $el > pod$k.log 2>&1 & eval p$k=$!; done\n"
      << "i=0; while [ $i -lt 3000 ] && ! grep -q 'kind\":\"train' run/metrics.jsonl 2>/dev/null; "
         "do sleep 0.01; i=$((i+1)); done\n"
      << "pkill -KILL -P $p1; wait $p1\n"
      << "timeout -s KILL 150 " << pod << "JOB_COMPLETION_INDEX=1 $el > pod1b.log 2>&1 & p1=$!\n"
      << "wait $coord; echo coord-exit=$?; for k in 0 1 2; do wait $(eval echo \\$p$k); echo "
         "pod-exit=$?; done\ncat coord.log; sed 's/^/pod1b: /' pod1b.log\n";
  Result r = run_sh("timeout 180 unshare --mount sh " + d + "/pods.sh 2>&1");
  SKIP_WITHOUT_MOUNT_NAMESPACE(r);
  EXPECT_TRUE(has(r, "coord-exit=0")) << r.out;
  const auto exits = shoal::testing::numbers_after(r.out, "pod-exit=");
  ASSERT_EQ(exits.size(), 3u) << r.out;
  for (double e : exits) EXPECT_EQ(e, 0) << r.out;
  EXPECT_TRUE(has(r, "pod1b: ")) << r.out;
  EXPECT_TRUE(has(r, "claimed: a newcomer, admitted at a step boundary")) << r.out;
  EXPECT_TRUE(has(r, "rank id 3 asks to join (started elsewhere)")) << r.out;
  EXPECT_TRUE(has(r, "the job ended on 3 ranks (it started on 3; generation ")) << r.out;
}

}  // namespace
