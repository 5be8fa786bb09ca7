// `shoal train --plan auto` (dist/plan.h): the job's ranks calibrate
// together in their own places (one host or several), rank 0 plans and
// sends the plan to the others; every rank then trains the same plan over
// the communicator the calibration joined.
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>

#include "shoal/core/env.h"
#include "shoal/core/launch_env.h"
#include "shoal/dist/plan.h"

namespace shoal::dist {
namespace {

std::mutex g_mu;
std::unique_ptr<comm::Communicator> g_comm;  // joined by auto_plan, for Job::join

// The first layout that fits, as plan_yaml writes it, and a line saying so.
Result<std::string> best_plan(const train::TrainOptions& base, const PlanRequest& r,
                              const Calibration& cal) {
  const auto cands = plan_layouts(r, cal);
  if (cands.empty())
    return invalid_argument("--plan auto: no layout of {} ranks splits {} samples per step",
                            r.ranks, r.global_batch);
  const Candidate& best = cands.front();
  fmt::print(
      "plan auto: {} ({} layouts, {} ranks on {} host{}, calibrated in {:.1f} s): predicted "
      "{:.1f} ms a step, {:.1f} MB per rank\n",
      best.flags(), cands.size(), r.ranks, cal.hosts, cal.hosts == 1 ? "" : "s", cal.seconds,
      best.step_s * 1e3, best.memory_bytes / 1e6);
  std::fflush(stdout);
  return plan_yaml(best, r, base);
}

// Rank 0's text (the plan, or why there is none) to every rank.
Result<std::string> share(comm::Communicator& c, std::string text) {
  std::int64_t n = static_cast<std::int64_t>(text.size());
  SHOAL_RETURN_IF_ERROR(c.broadcast(&n, 1, DType::kI64, 0));
  if (n < 0 || n > (64 << 20)) return internal_error("--plan auto: a plan of {} bytes", n);
  text.resize(static_cast<std::size_t>(n));
  SHOAL_RETURN_IF_ERROR(c.broadcast(text.data(), text.size(), DType::kU8, 0));
  return text;
}

}  // namespace

Result<std::string> auto_plan(const train::TrainOptions& base) {
  SHOAL_ASSIGN_OR_RETURN(LaunchEnv le, launch_env());
  PlanRequest r;
  r.ranks = le.world;
  r.global_batch = base.batch * le.world;        // --batch per rank, as without a plan
  r.recomputes = {"none", "selective", "full"};  // exact: searched where it saves memory
  if (le.world == 1) {
    SHOAL_ASSIGN_OR_RETURN(Calibration cal, calibrate(base, r));
    return best_plan(base, r, cal);
  }
  if (env::get("SHOAL_ELASTIC"))
    return failed_precondition(
        "--plan auto plans for a fixed set of ranks, and this job is elastic (--elastic): plan "
        "with shoal plan and train with --plan FILE");
  if (base.deterministic) setenv("SHOAL_DETERMINISTIC", "1", 1);  // read as the ranks join
  auto joined = comm::Communicator::from_env();
  if (!joined.ok()) return joined.status().with_context("--plan auto: joining the job's ranks");
  std::unique_ptr<comm::Communicator> c = std::move(joined).value();
  Result<Calibration> cal = calibrate_job(base, r, *c);
  if (!cal.ok()) return cal.status().with_context("--plan auto: calibrating");
  std::string text;
  if (c->rank() == 0) {
    Result<std::string> plan = best_plan(base, r, *cal);
    text = plan.ok() ? "ok\n" + *plan : "error\n" + plan.status().to_string();
  }
  SHOAL_ASSIGN_OR_RETURN(text, share(*c, std::move(text)));
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_comm = std::move(c);
  }
  if (text.starts_with("ok\n")) return text.substr(3);
  return failed_precondition("--plan auto: rank 0 could not plan: {}",
                             text.substr(text.find('\n') + 1));
}

std::unique_ptr<comm::Communicator> take_plan_communicator() {
  std::lock_guard<std::mutex> lk(g_mu);
  return std::move(g_comm);
}

}  // namespace shoal::dist
