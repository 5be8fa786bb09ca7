// One scheduling pass under each policy. FIFO: the head starts or everyone
// waits. Backfill (EASY, as Slurm's backfill does it): the first job that
// does not fit gets a reservation at the earliest time enough resources
// free up (the shadow time), and later jobs start now only if they end
// before it or use only what the reservation leaves over, so a waiting
// gang is never starved. Shoal adds fair share (the queue with the smallest
// dominant share goes next), best-fit adjacent placement, elastic jobs
// that start smaller, and for a higher-priority job: shrink elastic jobs
// first, kill (back to checkpoint) only when shrinking is not enough. It
// also weighs time: a gang without links waits for linked chips when they
// free up before running spread would cost it more (worth_waiting), and an
// elastic job takes the rank count that does the most work a second.
#include <algorithm>
#include <bit>
#include <limits>

#include "cluster/sim_engine.h"

namespace shoal::cluster {

void Engine::schedule() {
  if (policy_ == Policy::kFifoFirstFit) return pass_fifo();
  pass_backfill(policy_ == Policy::kShoal);
  if (policy_ == Policy::kShoal) grow_elastic();
}

PlaceOptions Engine::options_for(int j) const {
  PlaceOptions po = place_;
  po.adjacency = po.adjacency && !jobs_[j].adjacent_never;
  return po;
}

std::optional<Placement> Engine::try_place(int j, double* declined) const {
  const JobSpec& s = tr_.jobs[j].spec;
  const PlaceOptions po = options_for(j);
  if (s.kind == JobKind::kElastic && policy_ == Policy::kShoal) return elastic_place(j);
  auto p = place(s_, s, s.ranks, po);
  if (p && policy_ == Policy::kShoal) {
    if (double lost = worth_waiting(j, *p); lost > 0) {
      if (declined) *declined = lost;
      return std::nullopt;
    }
  }
  return p;
}

std::optional<Placement> Engine::elastic_place(int j) const {
  // The rank count, at least its minimum, whose placement does the most
  // work a second (ranks over slowdown): four ranks on linked chips beat
  // eight spread over the leaf switch. Counted down; no count below the
  // best rate found can beat it (the rate never exceeds the count).
  const JobSpec& s = tr_.jobs[j].spec;
  const PlaceOptions po = options_for(j);
  std::optional<Placement> best;
  double best_rate = 0;
  for (int c = s.ranks; c >= s.min_ranks && c > best_rate; --c) {
    auto q = place(s_, s, c, po);
    if (!q) continue;
    const double rate = c / slowdown(t_, s, *q);
    if (rate > best_rate) best = std::move(q), best_rate = rate;
  }
  return best;
}

double Engine::time_limit(int j) const {
  const TraceJob& tj = tr_.jobs[j];
  return tj.spec.max_runtime_s > 0 ? tj.spec.max_runtime_s : tj.duration;
}

double Engine::linked_at(const JobSpec& s) const {
  const int k = s.total_accels();
  if (linked_at_.stamp != std::pair{version_, now_}) {
    linked_at_.most_free = 0;
    for (std::size_t n = 0; n < t_.nodes.size(); ++n)
      if (s_.up(static_cast<int>(n)) && t_.nodes[n].links == ChipLinks::kRing)
        linked_at_.most_free =
            std::max(linked_at_.most_free, std::popcount(s_.free_accels(static_cast<int>(n))));
    linked_at_.by_chips.clear();
    linked_at_.stamp = {version_, now_};
  }
  if (auto it = linked_at_.by_chips.find(k); it != linked_at_.by_chips.end()) return it->second;
  const double never = std::numeric_limits<double>::infinity();
  auto idle_at = [&](int n) {
    if (!s_.up(n) || t_.nodes[n].links != ChipLinks::kRing) return never;
    // When the node is next idle: its jobs' planned ends (their limits).
    return node_ends_[n].empty() ? now_ : std::max(now_, *node_ends_[n].rbegin());
  };
  double best = never;  // when the earliest run of nodes is all idle
  for_each_node_run(k, [&](const Switch& sw, std::size_t i, std::size_t m) {
    double at = 0;
    for (std::size_t q = i; q < i + m; ++q) at = std::max(at, idle_at(sw.nodes[q]));
    best = std::min(best, at);
  });
  return linked_at_.by_chips[k] = best;
}

double Engine::worth_waiting(int j, const Placement& p) const {
  const TraceJob& tj = tr_.jobs[j];
  const JobSpec& s = tj.spec;
  if (s.links != LinkNeed::kNone || s.kind != JobKind::kSync || s.total_accels() < 2 ||
      !place_.adjacency)
    return 0;
  const double lost = slowdown(t_, s, p) - 1;
  if (lost <= 1e-9) return 0;
  const double limit = time_limit(j);
  // Waited so far and still to wait, against what running slow would cost.
  return linked_at(s) - tj.submit < lost * limit ? lost : 0;
}

bool Engine::still_declined(int j) const {
  const TraceJob& tj = tr_.jobs[j];
  const JobSpec& s = tj.spec;
  const double at = linked_at(s);  // refreshes linked_at_.most_free
  if (at <= now_ || linked_at_.most_free >= s.total_accels()) return false;
  const double limit = time_limit(j);
  return at - tj.submit < jobs_[j].declined * limit;
}

void Engine::blame(int j) {
  const JobSpec& s = tr_.jobs[j].spec;
  const int ranks = policy_ == Policy::kShoal ? s.fewest_ranks() : s.ranks;
  const double free = chips_ ? s_.free_accels_total() : s_.free_cpus_total();
  jobs_[j].why = free < units(s, ranks + s.servers) ? WaitReason::kNoRoom : WaitReason::kShape;
}

void Engine::pass_fifo() {
  auto& q = pending_[0];
  while (!q.empty()) {
    int j = std::get<2>(*q.begin());
    auto p = try_place(j);
    if (!p || !start(j, *p)) return blame(j);
  }
}

int Engine::pick_queue(const std::vector<std::set<Key>::iterator>& it) const {
  int best = -1;
  double share = 0;
  for (std::size_t q = 0; q < it.size(); ++q) {
    if (it[q] == pending_[q].end()) continue;
    double s = dominant_share(static_cast<int>(q));
    if (best < 0 || s < share) best = static_cast<int>(q), share = s;
  }
  return best;
}

Engine::Reservation Engine::reserve(int j) const {
  const JobSpec& s = tr_.jobs[j].spec;
  const double need = units(s, s.ranks + s.servers);
  double free = chips_ ? s_.free_accels_total() : s_.free_cpus_total();
  // Counted from the next end on: when enough is free now but the job
  // does not fit (scattered, or not adjacent), it waits for that end.
  for (const auto& [end, r] : ends_) {
    free += units(tr_.jobs[r].spec, static_cast<int>(jobs_[r].p.ranks.size()));
    if (free >= need) return {end, free - need};
  }
  return {std::numeric_limits<double>::infinity(), 0};
}

namespace {

// What decides whether a job's gang fits: everything it asks of the nodes.
struct GangShape {
  int ranks, cpus_per_rank;
  std::int64_t mem_mb_per_rank;
  int accels_per_rank, links, kind, servers;
  auto operator<=>(const GangShape&) const = default;
};

GangShape gang_shape(const JobSpec& s) {
  return {s.ranks,           s.cpus_per_rank,           s.mem_mb_per_rank,
          s.accels_per_rank, static_cast<int>(s.links), static_cast<int>(s.kind),
          s.servers};
}

}  // namespace

void Engine::pass_backfill(bool drf) {
  std::optional<Reservation> res;
  // The shapes of gangs that did not fit in this pass: a job of the same
  // shape cannot either, and is not tried again.
  std::set<GangShape> failed;
  // The reservation stays with the job that first got it until it starts:
  // under fair share the head changes from pass to pass, and a reservation
  // that moved with it would starve the big gangs of every queue in turn.
  if (holder_ >= 0 && !jobs_[holder_].pending) holder_ = -1;
  if (holder_ >= 0) {
    double declined = 0;
    auto p = try_place(holder_, &declined);
    const double lost = p ? spread_cost(holder_, *p) : declined;
    if ((drf && (!p || lost > 0) && move_for(holder_, lost)) || (p && start(holder_, *p)) ||
        (drf && declined == 0 && reclaim_for(holder_)) ||
        (drf && declined == 0 && preempt_for(holder_))) {
      holder_ = -1;
    } else if (declined > 0) {  // it can start now, slowly: it holds nothing
      blame(holder_);
      jobs_[holder_].declined = declined;
      holder_ = -1;
    } else {
      blame(holder_);
      res = reserve(holder_);
    }
  }
  std::vector<std::set<Key>::iterator> it;  // after the holder's start: it leaves pending_
  for (auto& q : pending_) it.push_back(q.begin());
  // Tries count placements attempted; a job skipped for its shape or the
  // reservation costs nothing (bounded all the same).
  for (int tries = 0, looked = 0; tries < o_.max_tries && looked < 100000; ++looked) {
    int q = drf ? pick_queue(it) : (it[0] == pending_[0].end() ? -1 : 0);
    if (q < 0) break;
    const int j = std::get<2>(*it[q]++);
    if (j == holder_) continue;
    const TraceJob& tj = tr_.jobs[j];
    const JobSpec& s = tj.spec;
    const double need = units(s, s.ranks + s.servers);
    const double limit = time_limit(j);
    const bool before_shadow = res && now_ + limit <= res->shadow;
    // Under Shoal a job that would delay the reservation may borrow its
    // chips until the holder can start (reclaim_for).
    const bool borrow = res && !before_shadow && need > res->extra;
    if (borrow && !(drf && holder_ >= 0 && stoppable(j))) {
      jobs_[j].why = WaitReason::kReservation;
      continue;
    }
    const GangShape shape = gang_shape(s);
    if (s.kind == JobKind::kSync && failed.contains(shape)) {
      blame(j);
      continue;
    }
    if (jobs_[j].declined > 0 && still_declined(j)) continue;
    ++tries;
    double declined = 0;
    auto p = try_place(j, &declined);
    // Shoal moves running jobs before it starts a gang spread out, or to
    // give it its shape (move_for).
    const double lost = p ? spread_cost(j, *p) : declined;
    if ((drf && !borrow && (!p || lost > 0) && move_for(j, lost)) || (p && start(j, *p))) {
      if (borrow)
        jobs_[j].borrowed = reservation_;
      else if (res && !before_shadow)
        res->extra -= need;
      continue;
    }
    blame(j);
    jobs_[j].declined = declined;
    if (declined > 0) continue;  // it could start, slowly: no reservation for it
    failed.insert(shape);
    // A job of higher priority than some running one may preempt, with or
    // without a reservation in place.
    if (drf && !running_prio_.empty() && *running_prio_.begin() < s.priority && preempt_for(j))
      continue;
    if (res) continue;
    res = reserve(j);
    holder_ = j;
    ++reservation_;  // whoever borrowed before holds its chips as any job does
  }
}

bool Engine::preempt_for(int j) {
  const JobSpec& h = tr_.jobs[j].spec;
  const double need = units(h, h.ranks + h.servers);
  double free = chips_ ? s_.free_accels_total() : s_.free_cpus_total();
  // Victims: lower priority only. Elastic jobs shrink toward their
  // minimum; sync jobs are killed back to their checkpoint.
  std::vector<std::pair<double, int>> shrinkable, killable;
  double can_shrink = 0, can_kill = 0;
  for (int r : running_) {
    const Job& v = jobs_[r];
    const JobSpec& vs = tr_.jobs[r].spec;
    if (vs.priority >= h.priority) continue;
    const double per_rank = units(vs, vs.servers + 1);
    if (vs.kind == JobKind::kElastic && v.ranks > vs.min_ranks) {
      shrinkable.push_back({(v.ranks - vs.min_ranks) * per_rank, r});
      can_shrink += shrinkable.back().first;
    } else if (vs.kind == JobKind::kSync) {
      killable.push_back({-v.run_start, r});  // latest started first
      can_kill += units(vs, static_cast<int>(v.p.ranks.size()));
    }
  }
  if (free + can_shrink + can_kill < need || (can_shrink == 0 && can_kill == 0)) return false;
  // Choose the victims on a copy first: preempt only when the job then
  // fits (else a killed job restarts in the same place, and again).
  struct Cut {
    int job, drop;  // drop −1: kill
  };
  std::vector<Cut> cuts;
  ClusterState trial = s_;
  std::sort(shrinkable.rbegin(), shrinkable.rend());
  for (const auto& [surplus, r] : shrinkable) {
    if (free >= need) break;
    const JobSpec& vs = tr_.jobs[r].spec;
    const double per_rank = units(vs, vs.servers + 1);
    int drop = std::min(jobs_[r].ranks - vs.min_ranks,
                        per_rank > 0 ? static_cast<int>(std::ceil((need - free) / per_rank)) : 0);
    if (drop <= 0) continue;
    auto last = jobs_[r].p.ranks.end() - vs.servers;
    trial.give(vs, std::vector<RankSlot>(last - drop, last));
    cuts.push_back({r, drop});
    free += drop * per_rank;
  }
  std::sort(killable.begin(), killable.end());
  for (const auto& [when, r] : killable) {
    if (free >= need) break;
    free += units(tr_.jobs[r].spec, static_cast<int>(jobs_[r].p.ranks.size()));
    trial.give(tr_.jobs[r].spec, jobs_[r].p.ranks);
    cuts.push_back({r, -1});
  }
  if (!place(trial, h, h.ranks, options_for(j))) return false;
  for (const Cut& c : cuts) {
    if (c.drop > 0) {
      shrink(c.job, c.drop);
    } else {
      restart(c.job);
      ++r_.kills;
    }
  }
  // It takes what it preempted for, linked or not: declining it now
  // (worth_waiting) would leave the victims' chips idle, and they would
  // restart where they were, to be preempted again.
  auto p = h.kind == JobKind::kElastic ? try_place(j) : place(s_, h, h.ranks, options_for(j));
  return p && start(j, *p);
}

void Engine::grow_elastic() {
  for (const auto& q : pending_)
    if (!q.empty()) return;  // room goes to waiting jobs first
  for (int j : running_) {   // growing changes jobs and s_, never running_
    Job& job = jobs_[j];
    const JobSpec& s = tr_.jobs[j].spec;
    if (s.kind != JobKind::kElastic || job.ranks >= s.ranks) continue;
    std::optional<Placement> more;
    for (int extra = s.ranks - job.ranks; extra > 0 && !more; extra /= 2)
      more = place(s_, s, extra, place_);
    if (!more) continue;
    // Only when the job then does more work a second (under Shoal's
    // placer a spread-out growth can slow every step by more than it adds).
    Placement grown = job.p;
    grown.ranks.insert(grown.ranks.end() - s.servers, more->ranks.begin(), more->ranks.end());
    const int n = job.ranks + static_cast<int>(more->ranks.size());
    if (n / slowdown(t_, s, grown) <= job.ranks / slowdown(t_, s, job.p)) continue;
    if (!s_.take(s, more->ranks).ok()) continue;
    update_progress(j);
    job.p = std::move(grown);  // workers before servers, as shrink() expects
    note_slots(j, more->ranks, +1);
    job.ranks += static_cast<int>(more->ranks.size());
    set_rate(j);
  }
}

}  // namespace shoal::cluster
