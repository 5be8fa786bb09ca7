// The simulator's event loop: arrivals, finishes, node failures and
// repairs; progress of running jobs; the accounting behind the report.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "cluster/sim_engine.h"

namespace shoal::cluster {

namespace {

// What `slots` ranks of s hold of what the report counts: chips (workers
// only), or CPUs on a chipless cluster.
double units_of(const JobSpec& s, int slots, bool chips) {
  return chips ? static_cast<double>(slots - s.servers) * s.accels_per_rank
               : static_cast<double>(slots) * s.cpus_per_rank;
}

}  // namespace

double goodput_ceiling(const Topology& t, const Trace& tr) {
  if (tr.jobs.empty()) return 0;
  const bool chips = t.total_accels() > 0;
  const double first = tr.jobs.front().submit, last = tr.jobs.back().submit;
  const double cap = (chips ? t.total_accels() : t.total_cpus()) * (last - first);
  if (cap <= 0) return 0;
  double work = 0;
  for (const TraceJob& j : tr.jobs) {
    const double held = std::min(last, j.submit + j.duration) - j.submit;
    if (held > 0) work += held * units_of(j.spec, j.spec.ranks + j.spec.servers, chips);
  }
  return std::min(1.0, work / cap);
}

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::kFifoFirstFit:
      return "fifo-first-fit";
    case Policy::kBackfill:
      return "backfill";
    case Policy::kTopoBackfill:
      return "backfill-topo";
    case Policy::kShoal:
      return "shoal";
  }
  return "?";
}

Engine::Engine(const Topology& t, const Trace& tr, Policy p, const SimOptions& o)
    : t_(t), tr_(tr), policy_(p), o_(o), s_(t), empty_(t), chips_(t.total_accels() > 0) {
  place_.best_fit = p == Policy::kShoal || p == Policy::kTopoBackfill;
  place_.adjacency = p == Policy::kShoal || o.baseline_adjacency;
  jobs_.resize(tr.jobs.size());
  node_ends_.resize(t.nodes.size());
  for (std::size_t j = 0; j < tr.jobs.size(); ++j) {
    auto [it, fresh] =
        queue_index_.emplace(tr.jobs[j].spec.queue, static_cast<int>(queue_index_.size()));
    jobs_[j].queue = it->second;
  }
  pending_.resize(p == Policy::kShoal ? queue_index_.size() : 1);
  backlog_.assign(queue_index_.size(), 0);
  usage_.assign(queue_index_.size(), {0, 0, 0});
  total_ = {static_cast<double>(t.total_cpus()), static_cast<double>(t.total_mem_mb()),
            static_cast<double>(t.total_accels())};
}

double Engine::units(const JobSpec& s, int slots) const { return units_of(s, slots, chips_); }

double Engine::dominant_share(int q) const {
  const auto& u = usage_[q];
  double share = 0;
  for (int r = 0; r < 3; ++r)
    if (total_[r] > 0) share = std::max(share, u[r] / total_[r]);
  return share;
}

void Engine::note_slots(int j, const std::vector<RankSlot>& slots, int sign) {
  const JobSpec& s = tr_.jobs[j].spec;
  auto& u = usage_[jobs_[j].queue];
  for (const RankSlot& r : slots) {
    u[0] += sign * s.cpus_per_rank;
    u[1] += sign * static_cast<double>(s.mem_mb_per_rank);
    u[2] += sign * std::popcount(r.accels);
    used_units_ += sign * (chips_ ? std::popcount(r.accels) : s.cpus_per_rank);
  }
}

void Engine::enqueue(int j) {
  Job& job = jobs_[j];
  const TraceJob& tj = tr_.jobs[j];
  int prio = policy_ == Policy::kFifoFirstFit ? 0 : -tj.spec.priority;
  pending_[policy_ == Policy::kShoal ? job.queue : 0].insert({prio, tj.submit, j});
  job.pending = true;
  ++backlog_[job.queue];
}

void Engine::dequeue(int j) {
  Job& job = jobs_[j];
  if (!job.pending) return;
  const TraceJob& tj = tr_.jobs[j];
  int prio = policy_ == Policy::kFifoFirstFit ? 0 : -tj.spec.priority;
  pending_[policy_ == Policy::kShoal ? job.queue : 0].erase({prio, tj.submit, j});
  job.pending = false;
  --backlog_[job.queue];
}

void Engine::advance(double t) {
  // Utilization is measured while jobs still arrive (first to last
  // submit): a finite trace's tail, a few long jobs alone, says nothing of
  // the policy. The backlog figures count whenever a job waits.
  const double dt = t - now_;
  const double in_window = std::min(t, window_end_) - std::min(now_, window_end_);
  now_ = t;
  if (dt <= 0) return;
  busy_ += used_units_ * in_window;
  useful_ += useful_units_ * in_window;
  frag_area_ += frag_now_ * in_window;
  double sum = 0, sq = 0;
  int n = 0;
  for (std::size_t q = 0; q < backlog_.size(); ++q) {
    if (backlog_[q] == 0) continue;
    double x = dominant_share(static_cast<int>(q));
    sum += x;
    sq += x * x;
    ++n;
  }
  (n >= 1 ? r_.idle_waiting : r_.idle_none_waiting) += (capacity_units() - used_units_) * in_window;
  if (n >= 1) {  // someone waits: every idle chip now is the policy's doing
    backlog_busy_ += used_units_ * dt;
    backlog_useful_ += useful_units_ * dt;
    backlog_time_ += dt;
  }
  if (n >= 2) {
    jain_area_ += (sq > 0 ? sum * sum / (n * sq) : 1) * dt;
    jain_time_ += dt;
  }
}

void Engine::update_progress(int j) {
  Job& job = jobs_[j];
  if (job.running) job.remaining = std::max(0.0, job.remaining - job.rate * (now_ - job.last));
  job.last = now_;
}

void Engine::drop_end(int j) {
  ++version_;
  Job& job = jobs_[j];
  if (job.planned_end < 0) return;
  for (auto it = ends_.lower_bound(job.planned_end); it != ends_.end(); ++it)
    if (it->second == j) {
      ends_.erase(it);
      break;
    }
  for (int n : job.end_nodes) node_ends_[n].erase(node_ends_[n].find(job.planned_end));
  job.end_nodes.clear();
  job.planned_end = -1;
}

void Engine::set_rate(int j) {
  Job& job = jobs_[j];
  const TraceJob& tj = tr_.jobs[j];
  const double stretch = slowdown(t_, tj.spec, job.p);
  useful_units_ -= job.useful;
  job.useful = units(tj.spec, static_cast<int>(job.p.ranks.size())) / stretch;
  useful_units_ += job.useful;
  job.rate = static_cast<double>(job.ranks) / tj.spec.ranks / (tj.duration * stretch);
  const double end = now_ + job.remaining / job.rate;
  drop_end(j);
  // Plan with the job's limit, unless it is known to run longer.
  job.planned_end =
      tj.spec.max_runtime_s > 0 ? std::max(end, job.run_start + tj.spec.max_runtime_s) : end;
  ends_.emplace(job.planned_end, j);
  for (const RankSlot& r : job.p.ranks)
    if (std::find(job.end_nodes.begin(), job.end_nodes.end(), r.node) == job.end_nodes.end())
      job.end_nodes.push_back(r.node);
  for (int n : job.end_nodes) node_ends_[n].insert(job.planned_end);
  events_.push({end, kFinish, j, ++job.gen});
}

bool Engine::start(int j, const Placement& p) {
  Job& job = jobs_[j];
  const TraceJob& tj = tr_.jobs[j];
  const int workers = static_cast<int>(p.ranks.size()) - tj.spec.servers;
  if (workers < tj.spec.fewest_ranks() || workers > tj.spec.ranks) {
    ++r_.partial_gangs;
    return false;
  }
  if (!s_.take(tj.spec, p.ranks).ok()) {
    ++r_.overcommits;
    return false;
  }
  dequeue(j);
  running_.insert(j);
  running_prio_.insert(tj.spec.priority);
  job.running = true;
  job.p = p;
  job.ranks = workers;
  job.run_start = job.last = now_;
  job.planned_end = -1;
  if (job.first_start < 0) {
    job.first_start = now_;
    waits_.push_back(now_ - tj.submit);
    if (now_ > tj.submit) {
      ++r_.waited[static_cast<int>(job.why)];
      r_.wait_s[static_cast<int>(job.why)] += now_ - tj.submit;
    }
  }
  if (tj.spec.links != LinkNeed::kNone) {
    ++r_.linked_jobs;
    r_.linked_adjacent += adjacent(t_, tj.spec, p);
    r_.linked_never += jobs_[j].adjacent_never;
  }
  if (workers > 1) {
    slow_sum_ += slowdown(t_, tj.spec, p);
    ++slow_n_;
  }
  note_slots(j, p.ranks, +1);
  set_rate(j);
  return true;
}

void Engine::stop(int j, bool requeue) {
  Job& job = jobs_[j];
  const JobSpec& s = tr_.jobs[j].spec;
  s_.give(s, job.p.ranks);
  note_slots(j, job.p.ranks, -1);
  drop_end(j);
  running_.erase(j);
  running_prio_.erase(running_prio_.find(s.priority));
  useful_units_ -= job.useful;
  job.useful = 0;
  job.running = false;
  job.borrowed = -1;
  ++job.gen;  // its finish event is void
  job.p.ranks.clear();
  if (requeue) enqueue(j);
}

void Engine::restart(int j) {
  Job& job = jobs_[j];
  const JobSpec& s = tr_.jobs[j].spec;
  update_progress(j);
  const double ran = now_ - job.run_start;
  if (s.checkpoint_every_s > 0)
    job.remaining = std::min(1.0, job.remaining + job.rate * std::fmod(ran, s.checkpoint_every_s));
  else
    job.remaining = 1;
  stop(j, true);
}

void Engine::shrink(int j, int drop) {
  const int workers = static_cast<int>(jobs_[j].p.ranks.size()) - tr_.jobs[j].spec.servers;
  shrink_where(j, [&](int r, const RankSlot&) { return r >= workers - drop; });
}

void Engine::shrink_where(int j, const std::function<bool(int, const RankSlot&)>& leaves) {
  Job& job = jobs_[j];
  const JobSpec& s = tr_.jobs[j].spec;
  update_progress(j);
  const int workers = static_cast<int>(job.p.ranks.size()) - s.servers;
  std::vector<RankSlot> keep, gone;
  for (int r = 0; r < static_cast<int>(job.p.ranks.size()); ++r)
    (r < workers && leaves(r, job.p.ranks[r]) ? gone : keep).push_back(job.p.ranks[r]);
  job.p.ranks = std::move(keep);
  s_.give(s, gone);
  note_slots(j, gone, -1);
  job.ranks -= static_cast<int>(gone.size());
  ++r_.shrinks;
  set_rate(j);
}

void Engine::arrive(int j) {
  const JobSpec& s = tr_.jobs[j].spec;
  // Only Shoal's policy starts an elastic job smaller than asked.
  const int least = policy_ == Policy::kShoal ? s.fewest_ranks() : s.ranks;
  // Refused means bigger than the whole cluster, the same rule for every
  // policy: links are not asked here. A ring that cannot be adjacent even
  // on the empty cluster (chip links none) is placed without adjacency by
  // a policy that keeps it (try_place).
  if (!place(empty_, s, least, {.best_fit = false, .adjacency = false})) {
    ++r_.never_fit;
    jobs_[j].done = true;
    return;
  }
  jobs_[j].adjacent_never =
      place_.adjacency && s.links != LinkNeed::kNone && !place(empty_, s, least, place_);
  enqueue(j);
}

void Engine::finish(int j) {
  update_progress(j);
  stop(j, false);
  jobs_[j].done = true;
  ++r_.finished;
  last_end_ = now_;
  r_.end[j] = now_;
}

void Engine::fail(int n) {
  if (!s_.up(n)) return;
  ++version_;  // linked_at_ is stale
  s_.set_up(n, false);
  const std::vector<int> running(running_.begin(), running_.end());
  for (int j : running) {
    Job& job = jobs_[j];
    const JobSpec& s = tr_.jobs[j].spec;
    int on_node = 0, last = static_cast<int>(job.p.ranks.size()) - s.servers;
    bool server_lost = false;
    for (int r = 0; r < static_cast<int>(job.p.ranks.size()); ++r)
      if (job.p.ranks[r].node == n) (r < last ? ++on_node : server_lost = true);
    if (on_node == 0 && !server_lost) continue;
    if (s.kind == JobKind::kSync || server_lost || job.ranks - on_node < s.min_ranks) {
      restart(j);
      ++r_.restarts;
      continue;
    }
    // Elastic: the ranks on the dead node leave, the rest go on.
    shrink_where(j, [n](int, const RankSlot& slot) { return slot.node == n; });
  }
}

void Engine::repair(int n) {
  ++version_;
  s_.set_up(n, true);
}

SimReport Engine::run() {
  auto wall0 = std::chrono::steady_clock::now();
  r_.policy = policy_name(policy_);
  r_.jobs = static_cast<int>(tr_.jobs.size());
  r_.end.assign(tr_.jobs.size(), -1);
  first_submit_ = now_ = tr_.jobs.empty() ? 0 : tr_.jobs.front().submit;
  window_end_ = tr_.jobs.empty() ? 0 : tr_.jobs.back().submit;
  for (std::size_t j = 0; j < tr_.jobs.size(); ++j)
    events_.push({tr_.jobs[j].submit, kArrive, static_cast<int>(j), 0});
  for (const NodeFailure& f : tr_.failures) events_.push({f.at, kFail, f.node, 0});
  // Bounded: every event is an arrival, a failure, a repair or the finish of
  // a start; starts are bounded by arrivals plus restarts plus shrinks.
  const long limit = 1000L * static_cast<long>(tr_.jobs.size() + tr_.failures.size()) + 100000;
  for (long steps = 0; !events_.empty() && steps < limit; ++steps) {
    Event e = events_.top();
    events_.pop();
    advance(e.t);
    if (e.kind == kArrive) arrive(e.id);
    if (e.kind == kFinish && jobs_[e.id].running && e.gen == jobs_[e.id].gen) finish(e.id);
    if (e.kind == kFail) {
      fail(e.id);
      for (const NodeFailure& f : tr_.failures)
        if (f.node == e.id && f.at == e.t) events_.push({e.t + f.repair_s, kRepair, e.id, 0});
    }
    if (e.kind == kRepair) repair(e.id);
    if (events_.empty() || events_.top().t > now_) {
      schedule();
      frag_now_ = s_.fragmentation();
    }
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return report(wall);
}

SimReport Engine::report(double wall) {
  r_.makespan_s = last_end_ - first_submit_;
  const double window = window_end_ - first_submit_;
  const double units_total = capacity_units(), cap = units_total * window;
  r_.utilization = cap > 0 ? busy_ / cap : 0;
  r_.goodput = cap > 0 ? useful_ / cap : 0;
  if (backlog_time_ > 0) {
    r_.backlog_utilization = backlog_busy_ / (units_total * backlog_time_);
    r_.backlog_goodput = backlog_useful_ / (units_total * backlog_time_);
  }
  r_.backlog_share = r_.makespan_s > 0 ? backlog_time_ / r_.makespan_s : 0;
  std::sort(waits_.begin(), waits_.end());
  auto pct = [&](double q) {
    return waits_.empty() ? 0.0
                          : waits_[std::min(waits_.size() - 1, std::size_t(q * waits_.size()))];
  };
  r_.wait_p50 = pct(0.5);
  r_.wait_p90 = pct(0.9);
  r_.wait_p99 = pct(0.99);
  r_.fragmentation = window > 0 ? frag_area_ / window : 0;
  r_.jain = jain_time_ > 0 ? jain_area_ / jain_time_ : 1;
  r_.mean_slowdown = slow_n_ ? slow_sum_ / slow_n_ : 1;
  r_.wall_s = wall;
  r_.first_start.resize(jobs_.size());
  r_.wait_reason.resize(jobs_.size());
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    r_.first_start[j] = jobs_[j].first_start;
    r_.wait_reason[j] = jobs_[j].why;
  }
  return r_;
}

SimReport simulate(const Topology& t, const Trace& trace, Policy p, const SimOptions& o) {
  Engine e(t, trace, p, o);
  return e.run();
}

std::string format_reports(const std::vector<SimReport>& rs) {
  std::string out = fmt::format(
      "{:<15} {:>6} {:>6} {:>7} {:>9} {:>7} {:>7} {:>15} {:>9} {:>9} {:>9} {:>6} {:>6} {:>8} "
      "{:>9} {:>8} {:>26} {:>7}\n",
      "policy", "jobs", "done", "refused", "makespan", "util", "goodput", "waiting: util/good",
      "wait p50", "wait p90", "wait p99", "frag", "jain", "partial", "adjacent", "slowdown",
      "shrink/kill/rest/move/susp", "wall s");
  for (const SimReport& r : rs)
    out += fmt::format(
        "{:<15} {:>6} {:>6} {:>7} {:>8.0f}s {:>6.1f}% {:>6.1f}% {:>6.1f}%/{:>5.1f}% {:>8.0f}s "
        "{:>8.0f}s {:>8.0f}s {:>6.2f} {:>6.3f} {:>8} {:>4}/{:<4} {:>8.3f} {:>26} {:>7.3f}\n",
        r.policy, r.jobs, r.finished, r.never_fit, r.makespan_s, 100 * r.utilization,
        100 * r.goodput, 100 * r.backlog_utilization, 100 * r.backlog_goodput, r.wait_p50,
        r.wait_p90, r.wait_p99, r.fragmentation, r.jain, r.partial_gangs + r.overcommits,
        r.linked_adjacent, r.linked_jobs, r.mean_slowdown,
        fmt::format("{}/{}/{}/{}/{}", r.shrinks, r.kills, r.restarts, r.moves, r.suspends),
        r.wall_s);
  return out + report_legend();
}

const char* wait_reason_text(WaitReason r) {
  switch (r) {
    case WaitReason::kQueued:
      return "not tried (queue order, fair share, pass limit)";
    case WaitReason::kNoRoom:
      return "too few free chips in all";
    case WaitReason::kShape:
      return "room, but not in its ranks' and links' shape";
    case WaitReason::kReservation:
      return "would delay the backfill reservation";
  }
  return "?";
}

std::string format_wait_reasons(const std::vector<SimReport>& rs) {
  std::string out =
      "why jobs waited (the reason of each one's last failed try; jobs, mean wait):\n";
  for (const SimReport& r : rs) {
    out += fmt::format("  {:<15}", r.policy);
    for (int k = 0; k < kWaitReasons; ++k)
      out += fmt::format("{}{} {} ({:.0f} s)", k ? "; " : " ", r.waited[k],
                         wait_reason_text(static_cast<WaitReason>(k)),
                         r.waited[k] ? r.wait_s[k] / r.waited[k] : 0.0);
    out += "\n";
  }
  out += "idle chip-hours (CPU-hours on a chipless cluster) in the arrival window:\n";
  for (const SimReport& r : rs)
    out += fmt::format("  {:<15} {:.0f} while some job waited, {:.0f} while none did\n", r.policy,
                       r.idle_waiting / 3600, r.idle_none_waiting / 3600);
  return out;
}

std::string report_legend() {
  return "  refused: jobs larger than the whole cluster (links aside), the same rule for every "
         "policy\n"
         "  makespan: first submit to last end\n"
         "  util, goodput: chips (CPUs on a chipless cluster) held, and held divided by the\n"
         "    placement's slowdown (the work done), over the arrival window\n"
         "  waiting: util/good: the same two while some job waits\n"
         "  wait p50/p90/p99: submit to first start\n"
         "  frag: time-weighted fragmentation of the free chips\n"
         "  jain: time-weighted Jain index of the waiting queues' dominant shares (1 = fair)\n"
         "  partial: gangs started short or resources overcommitted (must be 0)\n"
         "  adjacent: ring/mesh jobs placed on linked chips / all ring/mesh jobs started\n"
         "  slowdown: mean step time over the ideal placement's, multi-rank jobs\n"
         "  shrink/kill/rest/move/susp: elastic shrinks, preemptions back to a checkpoint, "
         "restarts after\n    failures, running jobs moved to make room for a gang, jobs on a "
         "reservation's chips\n    stopped for its holder (a checkpoint each)\n"
         "  wall s: the simulation's own run time\n";
}

}  // namespace shoal::cluster
