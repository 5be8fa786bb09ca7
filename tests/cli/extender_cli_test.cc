// `shoal place --serve`: kube-scheduler's extender over HTTP, asked with
// curl about the pods of the Job `shoal submit --engine kubernetes` writes
// (the request built as kube-scheduler encodes ExtenderArgs), so the labels
// the manifests carry are the ones the extender reads.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli/run_shoal.h"
#include "temp_dir.h"

namespace {

using shoal::testing::run_sh;

bool has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

class Extender : public ::testing::Test {
 protected:
  void SetUp() override {
    if (run_sh("command -v curl").code != 0) GTEST_SKIP() << "curl is not installed";
    if (run_sh("python3 -c 'import yaml'").code != 0)
      GTEST_SKIP() << "python3 yaml is not installed (Debian python3-yaml)";
  }
  // Writes the job's manifests (kube-scheduler, no Volcano) into DIR/<name>.
  void submit(const std::string& name, const std::string& spec) {
    std::ofstream(dir_.path() + "/" + name + ".yaml") << spec;
    auto r = shoal::testing::run_shoal("submit " + dir_.path() + "/" + name +
                                       ".yaml --engine kubernetes --no-volcano --dry-run --dir " +
                                       dir_.path() + "/" + name + " -- shoal train");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  // A shell line that asks the extender at $URL about pod INDEX of `name`.
  std::string ask(const std::string& verb, const std::string& name, int index,
                  const std::string& form, const std::string& nodes) {
    return "python3 " SHOAL_SOURCE_DIR "/tests/cli/extender_args.py " + dir_.path() + "/" + name +
           "/" + name + ".k8s.yaml " + std::to_string(index) + " " + form + " " + nodes +
           " | curl -sS --max-time 10 -H 'Content-Type: application/json' --data-binary @- "
           "\"$URL/" +
           verb + "\"; echo; ";
  }
  // Starts the extender, runs `lines` against it, stops it with SIGTERM.
  shoal::testing::ShoalRun serve(const std::string& lines) {
    const std::string log = dir_.path() + "/serve.log";
    std::ofstream(dir_.path() + "/ask.sh")
        << SHOAL_BINARY " place --serve 127.0.0.1:0 --url-prefix /shoal --cluster " SHOAL_SOURCE_DIR
                        "/examples/cluster.yaml > "
        << log << " 2>&1 & pid=$!\nURL=\nfor i in $(seq 100); do\n  URL=$(grep -o "
        << "'http://127.0.0.1:[0-9]*/shoal' " << log
        << ")\n  [ -n \"$URL\" ] && break\n  sleep 0.1\ndone\n"
        << lines << "\nkill -TERM $pid\nwait $pid\necho \"exit=$?\"\ncat " << log << "\n";
    // Bounded: a server that does not stop fails the test, it does not hang it.
    return run_sh("timeout -k 5 60 sh " + dir_.path() + "/ask.sh");
  }
  shoal::testing::TempDir dir_{"extender"};
};

// examples/cluster.yaml: n1-n2 under s1, n3-n4 under s2, 8 ring-linked
// GPUs each. A 2-GPU job takes n1; then a 16-rank ring must take the
// whole switch s2, rank 0 on n3 and rank 9 on n4, whatever order the pods
// come in; kube-scheduler's own choice is only among the offered nodes.
TEST_F(Extender, KubeSchedulerIsSteeredToTheGangsPlacement) {
  submit("small", "name: small\nranks: 1\naccels_per_rank: 2\ncpus_per_rank: 2\n");
  submit("ring", "name: ring\nranks: 16\naccels_per_rank: 1\ncpus_per_rank: 1\nlinks: ring\n");
  auto r = serve(ask("filter", "small", 0, "names", "n1 n2 n3 n4") +
                 ask("filter", "ring", 9, "names", "n1 n2 n3 n4") +
                 ask("filter", "ring", 0, "nodes", "n1 n2 n3 n4") +
                 ask("prioritize", "ring", 0, "names", "n1 n2 n3 n4") +
                 "curl -s -o /dev/null -w 'get=%{http_code}\\n' \"$URL/filter\";" +
                 "curl -s -w ' bad=%{http_code}\\n' --data-binary '{\"Pod\":' \"$URL/filter\";");
  EXPECT_TRUE(has(r.out, "\"NodeNames\":[\"n1\"]")) << r.out;  // small
  EXPECT_TRUE(has(r.out, "\"NodeNames\":[\"n4\"]")) << r.out;  // ring rank 9
  EXPECT_TRUE(has(r.out, "Shoal places rank 9 of job default/ring (16 ranks, a ring) on n4"))
      << r.out;
  // Rank 0 asked with whole Node objects: only n3's comes back.
  EXPECT_TRUE(has(r.out,
                  "\"Nodes\":{\"items\":[{\"metadata\":{\"labels\":{\"kubernetes.io/"
                  "hostname\":\"n3\"},\"name\":\"n3\"}"))
      << r.out;
  EXPECT_TRUE(has(r.out, "{\"Host\":\"n3\",\"Score\":10}")) << r.out;
  EXPECT_TRUE(has(r.out, "{\"Host\":\"n4\",\"Score\":5}")) << r.out;
  EXPECT_TRUE(has(r.out, "get=405")) << r.out;
  EXPECT_TRUE(has(r.out, "the body is not JSON")) << r.out;
  EXPECT_TRUE(has(r.out, "bad=400")) << r.out;
  EXPECT_TRUE(has(r.out, "exit=0")) << r.out;
  EXPECT_TRUE(has(r.out, "stopped after 6 requests")) << r.out;
}

// A job larger than the cluster: every node unresolvable (preemption
// cannot help), with the placer's reason; a node the model does not know
// is named.
TEST_F(Extender, AJobThatCanNeverFitIsUnresolvableEverywhere) {
  submit("huge", "name: huge\nranks: 40\naccels_per_rank: 1\n");
  auto r = serve(ask("filter", "huge", 3, "names", "n1 n2 n3 n4 gpu-node-7"));
  EXPECT_TRUE(has(r.out,
                  "\"FailedAndUnresolvableNodes\":{\"n1\":\"job default/huge (40 ranks) "
                  "can never fit this cluster"))
      << r.out;
  EXPECT_TRUE(has(r.out, "room for 32 of 40 ranks")) << r.out;
  EXPECT_TRUE(has(r.out, "\"gpu-node-7\":\"gpu-node-7 is not in Shoal's cluster model\"")) << r.out;
  EXPECT_TRUE(has(r.out, "\"NodeNames\":[]")) << r.out;
}

TEST(ExtenderFlags, ServeWithoutAModelOrAnAddressIsRefused) {
  auto r = shoal::testing::run_shoal("place --serve 127.0.0.1:0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "give --cluster MODEL.yaml")) << r.out;
  r = shoal::testing::run_shoal("place --serve nowhere --cluster " SHOAL_SOURCE_DIR
                                "/examples/cluster.yaml");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "'nowhere' is not host:port")) << r.out;
  r = shoal::testing::run_shoal("place");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "give job spec files to place, or --serve HOST:PORT")) << r.out;
}

}  // namespace
