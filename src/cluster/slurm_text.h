// Reading the text Slurm's tools print: Key=Value tokens, and the blocks of
// `scontrol show nodes` (one per node, each starting at NodeName=).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "shoal/core/status.h"

namespace shoal::cluster {

using KeyValues = std::map<std::string, std::string>;

KeyValues key_values(const std::string& text);
// Calls fn with each node's tokens, in order; stops at its first error.
Status for_each_node(const std::string& scontrol_nodes,
                     const std::function<Status(KeyValues&)>& fn);

}  // namespace shoal::cluster
