// `shoal train --plan auto` (dist/plan.h): the job's rank 0 calibrates and
// plans on its host while the other ranks wait for the plan in the job's
// store; every rank then trains the same plan.
#include <fmt/format.h>

#include "dist/job_store.h"
#include "shoal/core/env.h"
#include "shoal/core/launch_env.h"
#include "shoal/dist/plan.h"

namespace shoal::dist {
namespace {

// The first layout that fits, as plan_yaml writes it, and a line saying so.
Result<std::string> plan_here(const train::TrainOptions& base, const PlanRequest& r) {
  SHOAL_ASSIGN_OR_RETURN(Calibration cal, calibrate(base, r));
  const auto cands = plan_layouts(r, cal);
  if (cands.empty())
    return invalid_argument("--plan auto: no layout of {} ranks splits {} samples per step",
                            r.ranks, r.global_batch);
  const Candidate& best = cands.front();
  fmt::print(
      "plan auto: {} ({} layouts, calibrated in {:.1f} s): predicted {:.1f} ms a step, "
      "{:.1f} MB per rank\n",
      best.flags(), cands.size(), cal.seconds, best.step_s * 1e3, best.memory_bytes / 1e6);
  std::fflush(stdout);
  return plan_yaml(best, r, base);
}

}  // namespace

Result<std::string> auto_plan(const train::TrainOptions& base) {
  SHOAL_ASSIGN_OR_RETURN(LaunchEnv le, launch_env());
  PlanRequest r;
  r.ranks = le.world;
  r.global_batch = base.batch * le.world;  // --batch per rank, as without a plan
  if (le.world == 1) return plan_here(base, r);
  // The calibration runs the job's ranks on this host: a job that spans
  // hosts is not what it measures.
  const std::string local = env::get("SHOAL_LOCAL_WORLD_SIZE").value_or("");
  if (local != std::to_string(le.world))
    return failed_precondition(
        "--plan auto calibrates the job's {} ranks on one host, and this job's ranks {} (plan "
        "on one host with shoal plan, then train with --plan FILE)",
        le.world,
        local.empty() ? "were not started by shoal run on this host"
                      : fmt::format("span hosts ({} here)", local));
  SHOAL_ASSIGN_OR_RETURN(auto store, connect_job_store(30));
  const std::string key = fmt::format("shoal/plan-auto/{}", le.restart);
  if (le.rank == 0) {
    Result<std::string> plan = plan_here(base, r);
    SHOAL_RETURN_IF_ERROR(
        store->set(key, plan.ok() ? "ok\n" + *plan : "error\n" + plan.status().to_string()));
    return plan;
  }
  // Rank 0's calibration and plan take seconds to a few minutes.
  store->set_io_timeout(std::chrono::milliseconds(660'000));
  SHOAL_ASSIGN_OR_RETURN(std::string got, store->get(key, Deadline::after_seconds(660)));
  if (got.starts_with("ok\n")) return got.substr(3);
  return failed_precondition("--plan auto: rank 0 could not plan: {}",
                             got.substr(got.find('\n') + 1));
}

}  // namespace shoal::dist
