#include "shoal/core/version.h"

#include <fmt/format.h>

namespace shoal {

std::string build_id() {
  return fmt::format("shoal {} {} {} {}", SHOAL_VERSION, SHOAL_GIT_COMMIT, SHOAL_BUILD_TYPE,
                     __VERSION__);
}

}  // namespace shoal
