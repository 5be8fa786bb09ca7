// Moving and suspending running jobs to make room for a gang, under
// Shoal's policy.
//
// As jobs end at random times the free chips of a busy cluster scatter: a
// ring gang that needs whole linked nodes, or a gang without links that
// waits for them rather than run spread (worth_waiting), can wait for days
// while enough chips are free in all, and those chips stay idle. Gandiva
// (OSDI '18) moves running jobs to defragment; so does this: the jobs on a
// run of nodes of one switch go to free chips elsewhere, each where it runs
// no slower than now, and the gang starts on the nodes they left. A moved
// job loses SimOptions::move_s of its time (a checkpoint written, its ranks
// restarted elsewhere), added back to its work. The run of nodes whose
// moves lose the fewest chip-seconds goes first; moving pays only when that
// loss is less than the gang's chips idle until its nodes free up by
// themselves (linked_at, from the running jobs' limits).
//
// Lending: the chips an EASY backfill reservation gathers sit idle until
// its holder fits. A job that would delay the holder may start on them
// when it can be checkpointed at will (stoppable; pass_backfill marks it
// with the reservation's number); the holder starts the moment it fits
// with borrowers suspended, the latest started first (reclaim_for), each
// losing move_s as a moved job does.
#include <algorithm>
#include <bit>

#include "cluster/sim_engine.h"

namespace shoal::cluster {

namespace {

// No job is moved or suspended more often: each costs it move_s, and a
// job stopped again and again would never end.
constexpr int kMaxDisturbed = 2;
constexpr std::size_t kRunsTried = 8;  // trial re-placements per call, cheapest first
constexpr double kSlower = 1 + 1e-9;   // "no slower", up to rounding

}  // namespace

double Engine::spread_cost(int j, const Placement& p) const {
  const JobSpec& s = tr_.jobs[j].spec;
  if (s.kind != JobKind::kSync || s.links != LinkNeed::kNone || s.total_accels() < 2) return 0;
  return std::max(0.0, slowdown(t_, s, p) - 1);
}

std::vector<Engine::NodeRun> Engine::runs_to_empty(int k, bool linked, double gain) const {
  // First from the free chips alone: a run's moves lose at least its held
  // chips' move_s, so most runs are ruled out before its jobs are looked at.
  struct Candidate {
    double least;
    const Switch* sw;
    std::size_t first, m;
  };
  std::vector<Candidate> cands;
  for_each_node_run(k, [&](const Switch& sw, std::size_t i, std::size_t m) {
    int held = 0;
    bool ok = true;
    for (std::size_t q = i; q < i + m && ok; ++q) {
      const int n = sw.nodes[q];
      ok = s_.up(n) && (!linked || t_.nodes[n].links == ChipLinks::kRing);
      held += t_.nodes[n].accels - std::popcount(s_.free_accels(n));
    }
    if (ok && held > 0 && held * o_.move_s < gain) cands.push_back({held * o_.move_s, &sw, i, m});
  });
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Candidate& x, const Candidate& y) { return x.least < y.least; });
  std::vector<NodeRun> runs;
  if (cands.empty()) return runs;
  std::vector<char> wanted(t_.nodes.size(), 0);
  for (const Candidate& c : cands)
    for (std::size_t q = c.first; q < c.first + c.m; ++q) wanted[c.sw->nodes[q]] = 1;
  std::vector<std::vector<int>> on(t_.nodes.size());  // node -> its running jobs
  for (int r : running_)
    for (const RankSlot& slot : jobs_[r].p.ranks) {
      if (!wanted[slot.node]) continue;
      auto& v = on[static_cast<std::size_t>(slot.node)];
      if (std::find(v.begin(), v.end(), r) == v.end()) v.push_back(r);
    }
  for (const Candidate& c : cands) {
    NodeRun run;
    bool ok = true;
    for (std::size_t q = c.first; q < c.first + c.m && ok; ++q) {
      const int n = c.sw->nodes[q];
      run.nodes.push_back(n);
      for (int r : on[static_cast<std::size_t>(n)]) {
        if (std::find(run.movers.begin(), run.movers.end(), r) != run.movers.end()) continue;
        ok = ok && stoppable(r);
        run.movers.push_back(r);
        run.lost += units(tr_.jobs[r].spec, jobs_[r].ranks) * o_.move_s;
      }
    }
    if (ok && run.lost < gain) runs.push_back(std::move(run));
  }
  std::stable_sort(runs.begin(), runs.end(),
                   [](const NodeRun& x, const NodeRun& y) { return x.lost < y.lost; });
  return runs;
}

bool Engine::move_for(int j, double lost) {
  const JobSpec& h = tr_.jobs[j].spec;
  const bool linked = h.links != LinkNeed::kNone;
  if (policy_ != Policy::kShoal || o_.move_s < 0 || !chips_ || !place_.adjacency ||
      h.kind != JobKind::kSync || h.servers > 0 || jobs_[j].adjacent_never ||
      (!linked && lost <= 0))
    return false;
  const int k = h.total_accels();
  if (s_.free_accels_total() < k) return false;
  // What the moves may cost: its chips idle until its nodes free up by
  // themselves, or (a gang without links that can start now) the time it
  // would lose running spread, whichever is less. linked_at last: the
  // dearest to ask.
  double gain = linked ? linked_at(h) - now_ : lost * time_limit(j);
  if (gain <= 0) return false;
  std::vector<NodeRun> runs = runs_to_empty(k, linked, gain * k);
  if (!linked && !runs.empty()) {
    gain = std::min(gain, linked_at(h) - now_) * k;
    std::erase_if(runs, [&](const NodeRun& r) { return r.lost >= gain; });
  }

  for (std::size_t w = 0; w < std::min(runs.size(), kRunsTried); ++w) {
    NodeRun& run = runs[w];
    ClusterState trial = s_;
    for (int r : run.movers) trial.give(tr_.jobs[r].spec, jobs_[r].p.ranks);
    for (int n : run.nodes) trial.set_up(n, false);  // none of them may land there
    // The biggest first: they have the fewest places to go.
    std::sort(run.movers.begin(), run.movers.end(), [&](int x, int y) {
      return std::tie(jobs_[y].ranks, y) < std::tie(jobs_[x].ranks, x);
    });
    std::vector<std::pair<int, Placement>> plan;
    for (int r : run.movers) {
      const JobSpec& s = tr_.jobs[r].spec;
      auto q = place(trial, s, jobs_[r].ranks, options_for(r));
      if (!q || slowdown(t_, s, *q) > kSlower * slowdown(t_, s, jobs_[r].p) ||
          !trial.take(s, q->ranks).ok())
        break;
      plan.emplace_back(r, std::move(*q));
    }
    if (plan.size() != run.movers.size()) continue;
    for (int n : run.nodes) trial.set_up(n, true);
    auto p = place(trial, h, h.ranks, options_for(j));
    // A gang without links moves others only for the placement it waits for.
    if (!p || (!linked && slowdown(t_, h, *p) > kSlower)) continue;
    move(plan);
    return start(j, *p);
  }
  return false;
}

void Engine::lose_move_time(int j) {
  // Work to redo, not capped at the whole job: a job moved a second after
  // its start still spends move_s writing and reading its checkpoint. Those
  // seconds are no work done: out of the goodput already counted for them.
  Job& job = jobs_[j];
  job.remaining += job.rate * o_.move_s;
  useful_ -= job.useful * std::max(0.0, std::min(o_.move_s, window_end_ - now_));
}

bool Engine::stoppable(int j) const {
  const JobSpec& s = tr_.jobs[j].spec;
  return o_.move_s >= 0 && jobs_[j].disturbed < kMaxDisturbed && s.servers == 0 &&
         s.checkpoint_every_s > 0;
}

bool Engine::reclaim_for(int j) {
  std::vector<int> borrowers;  // the latest started first
  for (int r : running_)
    if (jobs_[r].borrowed == reservation_) borrowers.push_back(r);
  if (borrowers.empty()) return false;
  std::sort(borrowers.begin(), borrowers.end(), [&](int x, int y) {
    return std::tie(jobs_[y].run_start, y) < std::tie(jobs_[x].run_start, x);
  });
  const JobSpec& h = tr_.jobs[j].spec;
  const double need = units(h, h.ranks + h.servers);
  auto free = [&](const ClusterState& c) {
    return chips_ ? c.free_accels_total() : c.free_cpus_total();
  };
  double could = free(s_);
  for (int r : borrowers)
    could += units(tr_.jobs[r].spec, static_cast<int>(jobs_[r].p.ranks.size()));
  if (could < need) return false;  // not even with every borrower gone
  // Most often it does not fit even then (its shape): one try, and none
  // again until the chips it could have change.
  const std::tuple<int, int, double, std::size_t> tried{j, reservation_, could, borrowers.size()};
  if (tried == reclaim_failed_) return false;
  {
    ClusterState all = s_;
    for (int r : borrowers) all.give(tr_.jobs[r].spec, jobs_[r].p.ranks);
    auto p = place(all, h, h.ranks, options_for(j));
    if (!p || worth_waiting(j, *p) > 0) {
      reclaim_failed_ = tried;
      return false;
    }
  }
  ClusterState trial = s_;
  for (std::size_t n = 0; n < borrowers.size(); ++n) {
    const int r = borrowers[n];
    trial.give(tr_.jobs[r].spec, jobs_[r].p.ranks);
    if (free(trial) < need) continue;
    auto p = place(trial, h, h.ranks, options_for(j));
    // Not for a placement it would decline (spread while linked chips come).
    if (!p || worth_waiting(j, *p) > 0) continue;
    for (std::size_t q = 0; q <= n; ++q) suspend(borrowers[q]);
    return start(j, *p);  // planned on a copy of s_ as it now is
  }
  return false;
}

void Engine::suspend(int j) {
  Job& job = jobs_[j];
  update_progress(j);
  lose_move_time(j);
  stop(j, true);
  ++job.disturbed;
  ++r_.suspends;
}

void Engine::move(const std::vector<std::pair<int, Placement>>& moves) {
  // All leave first: one may go where another was.
  for (const auto& [r, q] : moves) {
    update_progress(r);
    s_.give(tr_.jobs[r].spec, jobs_[r].p.ranks);
    note_slots(r, jobs_[r].p.ranks, -1);
  }
  for (const auto& [r, q] : moves) {
    Job& job = jobs_[r];
    if (!s_.take(tr_.jobs[r].spec, q.ranks).ok()) ++r_.overcommits;  // planned on a copy of s_
    note_slots(r, q.ranks, +1);
    lose_move_time(r);
    job.p = q;
    job.run_start = now_;  // restarted from a fresh checkpoint
    ++job.disturbed;
    ++r_.moves;
    set_rate(r);
  }
}

}  // namespace shoal::cluster
