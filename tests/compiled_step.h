// One step of a graph on the CPU backend for the fusion tests: every input
// drawn from N(0, 1) with a fixed seed, compiled with the backend's fusion
// passes on or off, run once. `inspect` sees the executable before it runs
// (its graph after the passes, its kernels).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shoal/graph/graph.h"
#include "shoal/runtime/backend.h"
#include "shoal/tensor/philox.h"

namespace shoal::testing {

inline std::vector<Tensor> compiled_step(
    const graph::Graph& g, bool fuse, std::uint64_t seed,
    const std::function<void(runtime::Executable&)>& inspect = {}) {
  PhiloxRng rng(seed, 1);
  std::map<std::string, Tensor> feeds;
  for (int id : g.input_nodes()) {
    const graph::Node& n = g.node(id);
    Tensor t = Tensor::empty(n.outputs[0].shape, n.outputs[0].dtype);
    rng.fill_normal(t, 0, 1);
    feeds[n.name] = t;
  }
  runtime::CompileOptions o;
  o.fuse = fuse;
  auto exe = (*runtime::make_backend("cpu"))->compile(g, o);
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  if (!exe.ok()) return {};
  if (inspect) inspect(**exe);
  runtime::Executor ex(**exe);
  auto out = ex.run(feeds);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : std::vector<Tensor>{};
}

}  // namespace shoal::testing
