// libFuzzer over the cluster module's parsers of untrusted text: job specs
// and cluster models (YAML), Slurm's topology.conf with `scontrol show
// nodes`; what parses is then placed, so the placer meets odd shapes too;
// a sharded checkpoint's index (JSON); and kube-scheduler's ExtenderArgs
// (JSON off the network) through the extender's verbs. The first byte picks the parser. Built and
// run by tools/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "shoal/cluster/extender.h"
#include "shoal/cluster/placer.h"
#include "shoal/train/checkpoint_index.h"

using namespace shoal::cluster;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > 4096) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto split = text.find('\0');
  const std::string a = text.substr(0, split),
                    b = split == std::string::npos ? "" : text.substr(split + 1);
  switch (data[0] % 5) {
    case 0: {
      auto j = parse_job_spec(a, "fuzz");
      auto t = parse_topology(b, "fuzz");
      if (j.ok() && t.ok() && t->nodes.size() <= 64 && j->ranks <= 256) {
        ClusterState s(*t);
        if (auto p = place(s, *j, j->ranks, {})) {
          (void)s.take(*j, p->ranks);
          (void)slowdown(*t, *j, *p);
          (void)adjacent(*t, *j, *p);
        }
      }
      break;
    }
    case 1:
      (void)parse_topology(a, "fuzz");
      break;
    case 2: {
      auto t = from_slurm(a, b);
      if (t.ok()) (void)to_topology_conf(*t);
      break;
    }
    case 3: {  // a sharded checkpoint's index: what it accepts names plain files only
      auto ix = shoal::train::parse_checkpoint_index(text, "fuzz");
      if (ix.ok()) {
        if (ix->shards < 1) std::abort();
        for (const auto& [file, tensors] : ix->files)
          if (file.empty() || file[0] == '.' || file.find('/') != std::string::npos) std::abort();
      }
      break;
    }
    case 4: {  // the extender: what it answers is JSON of the shape asked for
      static SchedulerExtender ext(generate_topology(4, 2, 8, 64000, 4, ChipLinks::kRing));
      if (auto f = ext.filter(text, 0); f.ok() && !nlohmann::json::parse(*f).is_object())
        std::abort();
      if (auto p = ext.prioritize(text, 0); p.ok() && !nlohmann::json::parse(*p).is_array())
        std::abort();
      break;
    }
  }
  return 0;
}
