// `shoal onnx conformance`: the ONNX backend node tests through the
// importer, a table of passed/failed per operator.
#include <CLI/CLI.hpp>
#include <map>

#include "cli/commands.h"
#include "shoal/onnx/conformance.h"
#include "shoal/onnx/import.h"

namespace shoal::cli {

OnnxCommand add_onnx_command(CLI::App& app) {
  OnnxCommand c;
  c.flags = std::make_shared<OnnxFlags>();
  c.flags->data = onnx::kNodeTestDir;
  auto* onnx = app.add_subcommand("onnx", "ONNX import: conformance against the ONNX test suite");
  onnx->require_subcommand(1);
  c.conformance = onnx->add_subcommand(
      "conformance", "Run the ONNX project's node tests of the operators Shoal imports");
  c.conformance->add_option("--data", c.flags->data, "Node test directory (libonnx-testdata)")
      ->capture_default_str();
  c.conformance->add_option("--op", c.flags->ops,
                            "Operators to test (default: every operator Shoal imports)");
  c.conformance->add_flag("-v,--verbose", c.flags->verbose, "Print why each failure failed");
  return c;
}

int run_onnx_conformance(const OnnxFlags& f) {
  auto ops = f.ops.empty() ? onnx::supported_ops() : f.ops;
  auto tests = onnx::run_node_tests(f.data, ops);
  if (!tests.ok()) {
    fmt::print(stderr, "shoal onnx conformance: {}\n", tests.status().message());
    return 2;
  }
  std::map<std::string, std::pair<int, int>> per_op;  // passed, failed
  for (const auto& op : ops) per_op[op];
  int failed = 0;
  for (const auto& t : *tests) {
    auto& [p, q] = per_op[t.op];
    (t.passed ? p : q)++;
    if (!t.passed) {
      ++failed;
      if (f.verbose) fmt::print("FAIL {} ({}): {}\n", t.name, t.op, t.error);
    }
  }
  fmt::print("{:<20} {:>6} {:>6}\n", "operator", "passed", "failed");
  for (const auto& [op, n] : per_op) fmt::print("{:<20} {:>6} {:>6}\n", op, n.first, n.second);
  fmt::print("{} passed, {} failed ({} node tests)\n",
             tests->size() - static_cast<std::size_t>(failed), failed, tests->size());
  return failed == 0 ? 0 : 1;
}

}  // namespace shoal::cli
