// What this build is: ranks of one job must run the same one.
#pragma once

#include <string>

namespace shoal {

// "shoal <version> <git commit> <build type> <compiler version>".
std::string build_id();

}  // namespace shoal
