#include "dist/layout_binding.h"

#include "shoal/core/cpus.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"

namespace shoal::dist {

Status bind_to_layout(int rank, int world, int tp, int pp) {
  const std::string mode = env::get("SHOAL_BIND").value_or("");
  if (mode.empty() || mode == "none") return ok_status();
  if (mode != "layout")
    return invalid_argument(
        "SHOAL_BIND={} is not layout or none (shoal run --bind cores binds "
        "in the launcher)",
        mode);
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> cpus, allowed_cpus());
  SHOAL_ASSIGN_OR_RETURN(std::int64_t local, env::get_int("SHOAL_LOCAL_RANK", rank));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t locals, env::get_int("SHOAL_LOCAL_WORLD_SIZE", world));
  if (local < 0 || local >= locals)
    return invalid_argument(
        "--bind layout: SHOAL_LOCAL_RANK={} is not a rank of "
        "SHOAL_LOCAL_WORLD_SIZE={}",
        local, locals);
  const auto [g, s, t] = place_in_layout(rank, tp, pp);
  const auto c = static_cast<std::int64_t>(cpus.size());
  std::vector<int> mine;
  if (locals <= c)
    mine = cpu_blocks(cpus, static_cast<int>(locals))[static_cast<std::size_t>(local)];
  else
    mine = {cpus[static_cast<std::size_t>((g + s + t) % c)]};
  SHOAL_RETURN_IF_ERROR(bind_process(mine).with_context("--bind layout"));
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> now, allowed_cpus());
  SHOAL_LOG_INFO("bound to CPU {} of {} (data group {}, stage {}, tensor rank {})", cpu_list(now),
                 cpu_list(cpus), g, s, t);
  return ok_status();
}

}  // namespace shoal::dist
