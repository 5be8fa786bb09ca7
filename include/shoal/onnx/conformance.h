// Runs the ONNX project's backend node tests (Debian libonnx-testdata:
// <dir>/model.onnx with test_data_set_*/input_*.pb and output_*.pb) through
// the importer and the CPU backend, comparing with the suite's tolerances
// (rtol 1e-3, atol 1e-7). Integer and bool inputs are known at import
// (Shoal's shapes are static); float inputs are fed at run time.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "shoal/core/status.h"

namespace shoal::onnx {

// The default location of the suite's node tests.
inline constexpr const char* kNodeTestDir = "/usr/share/libonnx-testdata/data/node";

struct NodeTest {
  std::string name;  // "test_add_bcast"
  std::string op;    // the op type of its single node
  bool passed = false;
  std::string error;  // why it failed
};

// Runs one node test directory.
NodeTest run_node_test(const std::string& dir);

// Every node test of the suite whose model is one node of an op in `ops`
// (all of the suite's tests when `ops` is empty), in name order.
Result<std::vector<NodeTest>> run_node_tests(const std::string& root,
                                             const std::vector<std::string>& ops);

// The operators whose every node test passes: the ones Shoal claims (see
// docs/onnx.md; the conformance test checks this list).
std::vector<std::string> claimed_ops();

}  // namespace shoal::onnx
