// `shoal plan`: calibrate, rank the layouts, write the first as a file
// `shoal train --plan FILE` runs; and the check of that prediction against
// the run (dist/plan.h does the work).
#include "shoal/dist/plan.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cmath>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "shoal/comm/communicator.h"
#include "shoal/core/file.h"
#include "shoal/core/launch_env.h"
#include "shoal/core/logging.h"
#include "shoal/runtime/backend.h"
#include "shoal/train/trainer.h"

namespace shoal::cli {

PlanCommand add_plan_command(CLI::App& app) {
  PlanCommand c;
  c.flags = std::make_shared<PlanFlags>();
  PlanFlags& f = *c.flags;
  f.train = std::make_shared<train::TrainOptions>();
  train::TrainOptions& o = *f.train;
  CLI::App* p = app.add_subcommand(
      "plan",
      "Rank the layouts (--dp x --tp x --pp, --zero, --micro-batches) of a model on N ranks by "
      "predicted step time and memory, from a short measurement (on this host; started as a "
      "job's ranks, on theirs); write the best as a file for shoal train --plan");
  c.app = p;
  p->add_option("-n,--ranks", f.ranks,
                "Ranks the job will run (under a launcher: its ranks, the default)")
      ->check(CLI::Range(1, 64));
  p->add_option("--hosts", f.hosts,
                "Hosts the ranks span, checked against where they were measured (more than one: "
                "start shoal plan as a job on those hosts, e.g. shoal run --hosts ... -- shoal "
                "plan)")
      ->check(CLI::Range(1, 64));
  p->add_option("--batch", f.global_batch, "Samples per step over the job (default 64 x ranks)")
      ->check(positive());
  p->add_option("--mem-per-rank", f.mem_gb, "Memory a rank may hold, GB (0: no budget)")
      ->check(non_negative());
  p->add_option("--out", f.out, "The plan file to write")->capture_default_str();
  p->add_option("--calibration", f.calibration,
                "Read the calibration from this file instead of measuring (written by "
                "--save-calibration)");
  p->add_option("--save-calibration", f.save_calibration, "Write the calibration as JSON");
  p->add_option("--json", f.json, "Write every layout's prediction as JSON");
  p->add_option("--model", o.model, "As shoal train --model")
      ->check(model_name_check())
      ->capture_default_str();
  p->add_option("--data", o.data, "As shoal train --data")->capture_default_str();
  p->add_option("--layers", o.gpt.layers, "--model gpt: transformer blocks")->check(positive());
  p->add_option("--heads", o.gpt.heads, "--model gpt: attention heads")->check(positive());
  p->add_option("--dim", o.gpt.dim, "--model gpt: embedding width")->check(positive());
  p->add_option("--context", o.gpt.context, "--model gpt: tokens per sample")->check(positive());
  p->add_option("--optimizer", o.optimizer, "As shoal train --optimizer")
      ->check(CLI::IsMember({"sgd", "momentum", "nesterov", "adam", "adamw", "lars", "lamb"}))
      ->capture_default_str();
  p->add_option("--precision", o.precision,
                "f32 or bf16, as shoal train; auto: both searched (bf16 where the CPU has it)")
      ->check(CLI::IsMember({"f32", "bf16", "auto"}))
      ->capture_default_str();
  p->add_option("--recompute", f.recompute,
                "none, selective or full, as shoal train; auto: all three searched (where "
                "recomputing saves memory)")
      ->check(CLI::IsMember({"none", "selective", "full", "auto"}))
      ->capture_default_str();
  p->add_option("--threads", o.threads, "CPU threads per rank (0 = the cores / ranks)")
      ->check(non_negative());
  return c;
}

namespace {

// The calibration: read from --calibration, measured on the ranks of the
// job this process is one of, or on ranks forked here. `report` is false
// on a job's ranks other than 0 (rank 0 prints and writes the plan).
Result<dist::Calibration> obtain_calibration(PlanFlags& f, dist::PlanRequest& r, bool* report) {
  *report = true;
  SHOAL_ASSIGN_OR_RETURN(LaunchEnv le, launch_env());
  const bool in_job = f.calibration.empty() && le.world > 1;
  r.ranks = f.ranks > 0 ? f.ranks : in_job ? le.world : 0;
  if (r.ranks == 0)
    return invalid_argument("-n: how many ranks to plan for (or start shoal plan as a job)");
  r.global_batch = f.global_batch > 0 ? f.global_batch : 64LL * r.ranks;
  r.mem_per_rank = f.mem_gb * 1e9;
  if (f.recompute == "auto")
    r.recomputes = {"none", "selective", "full"};
  else
    r.recomputes = {f.recompute};
  if (f.train->precision == "auto") {
    r.precisions = {"f32"};
    if (runtime::bf16_support().ok()) r.precisions.push_back("bf16");
    f.train->precision = "f32";  // the base the others are measured against
  }
  Result<dist::Calibration> cal = internal_error("unset");
  if (!f.calibration.empty()) {
    SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(f.calibration));
    SHOAL_ASSIGN_OR_RETURN(cal, dist::parse_calibration(text));
    if (cal->ranks != r.ranks)
      return invalid_argument("--calibration {} was measured with {} ranks, not -n {}",
                              f.calibration, cal->ranks, r.ranks);
  } else if (in_job) {
    if (r.ranks != le.world)
      return invalid_argument("-n {}: this job ({}) has {} ranks, and they are what is measured",
                              r.ranks, le.source, le.world);
    SHOAL_ASSIGN_OR_RETURN(auto c, comm::Communicator::from_env());
    if (c->rank() == 0) {
      fmt::print("shoal plan: calibrating {} on the job's {} ranks...\n", f.train->model, r.ranks);
      std::fflush(stdout);
    }
    cal = dist::calibrate_job(*f.train, r, *c);
    *report = c->rank() == 0;
  } else {
    if (f.hosts > 1)
      return invalid_argument(
          "--hosts {}: shoal plan forks its ranks on this host; to measure {} ranks on {} hosts, "
          "start it as a job on them (shoal run --hosts ... -- shoal plan ..., srun, mpirun)",
          f.hosts, r.ranks, f.hosts);
    fmt::print("shoal plan: calibrating {} on {} ranks of this host...\n", f.train->model, r.ranks);
    std::fflush(stdout);
    cal = dist::calibrate(*f.train, r);
  }
  if (cal.ok() && f.hosts > 0 && cal->hosts != f.hosts)
    return invalid_argument("--hosts {}: the ranks were measured on {} host{}", f.hosts, cal->hosts,
                            cal->hosts == 1 ? "" : "s");
  return cal;
}

}  // namespace

int run_plan(PlanFlags& f) {
  dist::PlanRequest r;
  bool report = true;
  Result<dist::Calibration> cal = obtain_calibration(f, r, &report);
  if (!cal.ok()) {
    SHOAL_LOG_ERROR("shoal plan: {}", cal.status().to_string());
    return 1;
  }
  if (!report) return 0;
  if (!f.save_calibration.empty())
    if (Status st = write_file_atomic(f.save_calibration, dist::calibration_json(*cal)); !st.ok()) {
      SHOAL_LOG_ERROR("shoal plan: --save-calibration: {}", st.to_string());
      return 1;
    }
  for (const auto& [t, s] : cal->tp)
    if (!s.refused.empty()) fmt::print("  --tp {}: not possible: {}\n", t, s.refused);
  for (const auto& [t, s] : cal->tp_sequence)
    if (!s.refused.empty() && cal->tp.count(t) && cal->tp.at(t).refused.empty())
      fmt::print("  --tp {} --sequence-parallel: not possible: {}\n", t, s.refused);
  for (const auto& [p, s] : cal->pp)
    if (!s.refused.empty()) fmt::print("  --pp {}: not possible: {}\n", p, s.refused);
  const auto cands = dist::plan_layouts(r, *cal);
  if (cands.empty()) {
    SHOAL_LOG_ERROR("shoal plan: no layout of {} ranks splits {} samples per step", r.ranks,
                    r.global_batch);
    return 1;
  }
  fmt::print("{} ranks x {} threads on {} host{}, {} samples per step, calibrated in {:.1f} s\n",
             cal->ranks, cal->threads, cal->hosts, cal->hosts == 1 ? "" : "s", r.global_batch,
             cal->seconds);
  fmt::print("{}", dist::plan_table(cands));
  if (!f.json.empty())
    if (Status st = write_file_atomic(f.json, dist::candidates_json(cands)); !st.ok()) {
      SHOAL_LOG_ERROR("shoal plan: --json: {}", st.to_string());
      return 1;
    }
  if (!cands.front().fits) {
    double least = cands.front().memory_bytes;
    for (const auto& c : cands) least = std::min(least, c.memory_bytes);
    SHOAL_LOG_ERROR(
        "shoal plan: no layout fits --mem-per-rank {} GB: the smallest needs {:.3f} GB per rank",
        f.mem_gb, least / 1e9);
    return 1;
  }
  const dist::Candidate& best = cands.front();
  if (Status st = write_file_atomic(f.out, dist::plan_yaml(best, r, *f.train)); !st.ok()) {
    SHOAL_LOG_ERROR("shoal plan: --out: {}", st.to_string());
    return 1;
  }
  fmt::print("plan: {} (predicted {:.1f} ms a step, {:.1f} MB per rank) written to {}\n",
             best.flags(), best.step_s * 1e3, best.memory_bytes / 1e6, f.out);
  if (cal->hosts > 1)
    fmt::print("run it on the same {} hosts, {} ranks each: shoal train --plan {}\n", cal->hosts,
               r.ranks / cal->hosts, f.out);
  else
    fmt::print("run it: shoal run -n {} shoal train --plan {}\n", r.ranks, f.out);
  return 0;
}

namespace {

// The prediction's field a plan-* key names (null: none).
double* plan_field(PlanPrediction& p, const std::string& key) {
  for (const auto& [name, field] : dist::plan_keys())
    if (key == name) return &(p.*field);
  return nullptr;
}

// A plan file's mapping (`where` names it): its plan-* keys into `p`, the
// rest as --config's flags.
Result<std::vector<std::string>> plan_node_args(const YAML::Node& root, const std::string& where,
                                                CLI::App& t, const std::vector<std::string>& cli,
                                                PlanPrediction* p) {
  if (!root.IsMap()) return invalid_argument("{}: not a mapping of option: value", where);
  YAML::Node flags(YAML::NodeType::Map);
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      if (key == "plan-ranks")
        p->ranks = kv.second.as<int>();
      else if (double* field = plan_field(*p, key); field != nullptr)
        *field = kv.second.as<double>();
      else
        flags[key] = kv.second;
    }
  } catch (const YAML::Exception& e) {
    return invalid_argument("{}: a plan-* value is not a number: {}", where, e.msg);
  }
  return config_node_args(flags, where, t, cli);
}

}  // namespace

Result<std::vector<std::string>> plan_file_args(const std::string& plan, CLI::App& t,
                                                const train::TrainOptions& o,
                                                std::vector<std::string>& cli, PlanPrediction* p) {
  if (plan != "auto") return plan_args(plan, t, cli, p);
  // Planned now, for this job, by its rank 0. --batch set the samples per
  // step (x ranks); the plan's per-rank share of them replaces it.
  SHOAL_ASSIGN_OR_RETURN(std::string text, dist::auto_plan(o));
  for (auto it = cli.begin(); it != cli.end();) {
    if (*it == "--batch" && it + 1 != cli.end())
      it = cli.erase(it, it + 2);
    else if (it->rfind("--batch=", 0) == 0)
      it = cli.erase(it);
    else
      ++it;
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return internal_error("--plan auto: the plan written is not YAML: {}", e.msg);
  }
  return plan_node_args(root, "--plan auto", t, cli, p);
}

Result<std::vector<std::string>> plan_args(const std::string& path, CLI::App& t,
                                           const std::vector<std::string>& cli, PlanPrediction* p) {
  SHOAL_ASSIGN_OR_RETURN(YAML::Node root, load_yaml_file("--plan", path));
  return plan_node_args(root, "--plan " + path, t, cli, p);
}

namespace {

// Measured against predicted, each class of the step; the one whose
// estimate was most off (by time) comes first.
std::string misjudged(const PlanPrediction& p, const train::StepProfile& m, double step) {
  const double kernels =
      m.product_s + m.other_s + m.update_s + m.allreduce_s + m.transfer_s + m.shard_s;
  const double parts =
      p.product_s + p.other_s + p.update_s + p.allreduce_s + p.transfer_s + p.shard_s;
  struct Part {
    const char* name;
    double measured, predicted;
  };
  std::vector<Part> v = {
      {"products (matmul, convolution)", m.product_s, p.product_s},
      {"other kernels", m.other_s, p.other_s},
      {"the optimizer update", m.update_s, p.update_s},
      {"all-reduces (data and tensor parallelism)", m.allreduce_s, p.allreduce_s},
      {"the pipeline's sends and receives", m.transfer_s, p.transfer_s},
      {"ZeRO's gathers and reduce-scatters", m.shard_s, p.shard_s},
      {"the rest of the step (waiting for peers or a core, the pipeline's bubble)",
       std::max(0.0, step - kernels), std::max(0.0, p.step_s - parts)}};
  std::stable_sort(v.begin(), v.end(), [](const Part& a, const Part& b) {
    return std::abs(a.measured - a.predicted) > std::abs(b.measured - b.predicted);
  });
  std::string s = fmt::format(
      "the estimate most off is {}: {:.1f} ms measured against {:.1f} ms "
      "predicted (then",
      v[0].name, v[0].measured * 1e3, v[0].predicted * 1e3);
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i].measured > 0 || v[i].predicted > 0)
      s += fmt::format("{} {} {:.1f}/{:.1f}", i == 1 ? "" : ",", v[i].name, v[i].measured * 1e3,
                       v[i].predicted * 1e3);
  return s + " ms)";
}

}  // namespace

void check_plan(const PlanPrediction& p, const train::Trainer& tr, int rank, int world) {
  if (p.step_s <= 0) return;
  if (p.ranks > 0 && p.ranks != world && rank == 0)
    SHOAL_LOG_WARN("plan check: the plan was made for {} ranks, this job has {}", p.ranks, world);
  // The step: the median period of the last steps (warm-up left out), else
  // (a run of a few steps) the mean over the run.
  const train::StepProfile prof = tr.step_profile(2);
  double step = prof.period_s;
  if (step <= 0) {
    double secs = 0;
    for (const auto& e : tr.history()) secs += e.train_seconds;
    const std::int64_t steps = tr.history().empty() ? 0 : tr.history().back().step;
    step = steps > 0 ? secs / static_cast<double>(steps) : 0;
  }
  const double bytes = static_cast<double>(prof.bytes());
  const double mem_gap = p.memory_bytes > 0 ? bytes / p.memory_bytes - 1 : 0;
  // Every rank says what it holds (the prediction is the largest rank's).
  SHOAL_LOG_INFO("plan check: rank {} holds {:.2f} MB, {:.2f} MB predicted for the largest rank",
                 rank, bytes / 1e6, p.memory_bytes / 1e6);
  if (mem_gap > 0.10)
    SHOAL_LOG_WARN("plan check: rank {} holds {:+.0f}% more than the plan said", rank,
                   100 * mem_gap);
  if (rank != 0 || step <= 0) return;
  const double gap = step / p.step_s - 1;
  SHOAL_LOG_INFO("plan check: step {:.2f} ms measured, {:.2f} ms predicted ({:+.0f}%)", step * 1e3,
                 p.step_s * 1e3, 100 * gap);
  if (std::abs(gap) <= 0.25) return;
  if (prof.steps < 3) {
    SHOAL_LOG_WARN(
        "plan check: the step is {:+.0f}% off the prediction (compute {:.1f} ms, communication "
        "{:.1f} ms predicted); run with --trace FILE to see which part was misjudged",
        100 * gap, p.compute_s * 1e3, p.comm_s * 1e3);
    return;
  }
  SHOAL_LOG_WARN("plan check: the step is {:+.0f}% off; {}", 100 * gap, misjudged(p, prof, step));
}

}  // namespace shoal::cli
