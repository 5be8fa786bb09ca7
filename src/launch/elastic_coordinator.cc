#include "launch/elastic_coordinator.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>

#include "shoal/core/elastic_keys.h"

namespace shoal::launch {

namespace keys = elastic_keys;

namespace {

// How long the launcher waits, once a rank checked in or died, for the
// others still running to check in before it kills them as hung. Survivors
// of a death check in within a step; those of a frozen peer within a
// heartbeat tick of its naming. Longer than a rank takes to give up
// connecting to a generation whose peer died meanwhile
// (SHOAL_CONNECT_TIMEOUT, 10 s in an elastic job).
constexpr double kSettleSeconds = 15;

// Once its peers checked in, a member out of the launcher's sight whose
// lease has not moved for this long is taken for dead (its lease moves
// every 0.5 s), not waited for the whole settling time.
constexpr double kQuietSeconds = 2;

}  // namespace

Result<std::unique_ptr<ElasticCoordinator>> ElasticCoordinator::for_launcher(
    const std::string& host, int port, const std::string& token, int ranks, int min, int max,
    int replacements, bool claimed) {
  SHOAL_ASSIGN_OR_RETURN(auto client,
                         net::TcpStore::connect(host, port, Deadline::after_seconds(10), token));
  return start(std::move(client), ranks, min, max, kSettleSeconds, replacements, claimed);
}

std::string ElasticCoordinator::supervise(Members& m, int ranks) {
  std::string stop;
  for (const auto& line : tick(m, &stop)) fmt::print(stderr, "{}\n", line);
  // A newcomer (a replacement, or a rank asked for by `shoal join`) joins
  // at a step boundary and takes its state from rank 0.
  const int replace = stop.empty() ? to_replace() : 0;
  const int grow = stop.empty() ? to_grow() : 0;
  for (int k = 0; k < replace + grow; ++k) {
    auto given = store_->add(keys::ids(), 1);
    const int id = given.ok() ? static_cast<int>(*given - 1) : -1;
    Status st = given.ok() ? m.start(id, ranks) : given.status();
    if (!st.ok()) {
      fmt::print(stderr, "shoal run: starting a replacement: {}\n", st.message());
      break;
    }
    next_id_ = std::max(next_id_, id + 1);
    joined(id);
    fmt::print(stderr, "shoal run: started rank {} {}\n", id,
               k < replace ? "to replace a lost rank" : "(asked for by shoal join)");
  }
  return stop;
}

int ElasticCoordinator::to_grow() {
  auto asked = store_->add(keys::grow(), 0);
  if (!asked.ok() || *asked <= granted_) return 0;
  const int pending = static_cast<int>(*asked - granted_);
  const int running = static_cast<int>(members_.size() + joiners_.size());
  const int n = std::clamp(max_ - running, 0, pending);
  granted_ = *asked;  // what is refused now stays refused, as MAX says
  if (n < pending)
    fmt::print(stderr,
               "shoal run: {} more rank(s) asked for by shoal join, but {} train or are joining "
               "(--elastic max {}): {} refused\n",
               pending, running, max_, pending - n);
  return n;
}

int ElasticCoordinator::finish(Members& m, int ranks) const {
  int code = 0;
  for (int id = 0; id < next_id_; ++id)
    if (!left(id))
      if (const Seen s = m.seen(id); s.state == Seen::State::kFailed) code = s.code;
  if (!left_.empty()) {
    std::string lost;
    for (const auto& [id, w] : left_)
      lost += fmt::format("{}rank {} {}", lost.empty() ? "" : "; ", id, w);
    fmt::print(stderr,
               "shoal run: the job ended on {} ranks (it started on {}; generation {}); lost: "
               "{}\n",
               members(), ranks, gen_, lost);
  }
  return code;
}

Result<std::unique_ptr<ElasticCoordinator>> ElasticCoordinator::start(
    std::unique_ptr<net::Store> store, int ranks, int min, int max, double settle_s,
    int replacements, bool claimed) {
  std::unique_ptr<ElasticCoordinator> c(new ElasticCoordinator());
  c->store_ = std::move(store);
  c->min_ = min;
  c->max_ = std::max(max, ranks);
  c->settle_s_ = settle_s;
  c->replacements_ = replacements;
  c->first_ = c->next_id_ = ranks;
  for (int r = 0; r < ranks; ++r) c->members_.push_back(r);
  SHOAL_RETURN_IF_ERROR(c->store_->set(keys::members(0), keys::join_ids(c->members_)));
  SHOAL_RETURN_IF_ERROR(c->store_->set(keys::key("gen"), "0"));
  SHOAL_RETURN_IF_ERROR(c->store_->set(keys::max(), std::to_string(c->max_)));
  SHOAL_RETURN_IF_ERROR(c->store_->set(keys::min(), std::to_string(min)));
  SHOAL_RETURN_IF_ERROR(c->store_->set(keys::world(), std::to_string(ranks)));
  // Ids are given out by one counter: the launcher's own ranks hold the
  // first generation's, else the ranks claim them as they start.
  SHOAL_RETURN_IF_ERROR(c->store_->set(keys::ids(), std::to_string(claimed ? 0 : ranks)));
  SHOAL_RETURN_IF_ERROR(c->store_->set(keys::claims(), claimed ? "yes" : "no"));
  return c;
}

void ElasticCoordinator::end(const std::string& why) {
  (void)store_->set(keys::key("end_why"), why);
  (void)store_->set(keys::key("gen"), "end");
}

int ElasticCoordinator::to_replace() {
  const int n = std::min(owed_, replacements_);
  owed_ = 0;
  replacements_ -= n;
  return n;
}

void ElasticCoordinator::joined(int id) { joiners_.push_back(id); }

bool ElasticCoordinator::knows(int id) const {
  return std::find(members_.begin(), members_.end(), id) != members_.end() ||
         std::find(joiners_.begin(), joiners_.end(), id) != joiners_.end() || left_.count(id);
}

void ElasticCoordinator::find_claims() {
  auto given = store_->add(keys::ids(), 0);
  if (!given.ok()) return;
  for (int id = first_; id < *given; ++id) {
    if (knows(id)) continue;
    joined(id);
    const bool room = static_cast<int>(members_.size() + joiners_.size()) <= max_;
    fmt::print(stderr, "shoal run: rank id {} asks to join (started elsewhere){}\n", id,
               room ? ""
                    : fmt::format(": {} train at --elastic max {}, so it waits as a standby",
                                  members_.size(), max_));
  }
  next_id_ = std::max(next_id_, static_cast<int>(*given));
}

std::vector<std::string> ElasticCoordinator::tick(Members& m, std::string* stop) {
  using State = Seen::State;
  if (m.others_join()) find_claims();
  // Newcomers: gone before admission, or ready (then this generation is
  // asked to end after its step in progress).
  for (auto it = joiners_.begin(); it != joiners_.end();) {
    const Seen s = m.seen(*it);
    if (s.state == State::kEndedWell || s.state == State::kFailed) {
      left_[*it] = (s.state == State::kEndedWell ? "exited" : s.why) + " before it was admitted";
      announced_.erase(*it);
      it = joiners_.erase(it);
      continue;
    }
    auto v = store_->peek(keys::join(*it));
    if (v.ok() && !v->empty()) announced_.insert(*it);
    ++it;
  }
  // Every member ended well: the job is done, and a newcomer still
  // waiting is told so (it leaves, which is no failure of the job).
  if (!finished_ && std::all_of(members_.begin(), members_.end(),
                                [&](int id) { return m.seen(id).state == State::kEndedWell; })) {
    finished_ = true;
    end("the job finished before it was admitted");
    for (int id : joiners_) left_[id] = "was not admitted: the job finished first";
    joiners_.clear();
    announced_.clear();
    return {};
  }
  if (finished_) return {};
  // Newcomers are let in at a step boundary while there is room under MAX.
  if (!announced_.empty() && !regroup_asked_ && static_cast<int>(members_.size()) < max_) {
    regroup_asked_ = store_->set(keys::regroup(gen_), "1").ok();
  }
  for (int id : members_) {
    if (const Seen s = m.seen(id); s.state == State::kFailed && !left_.count(id)) {
      left_[id] = s.why;
      troubled_ = true;
    }
    if (checked_in_.count(id)) continue;
    auto v = store_->peek(keys::check_in(gen_, id));
    if (v.ok() && !v->empty()) {
      checked_in_[id] = std::atoll(v->c_str());
      troubled_ = true;
    }
  }
  if (!troubled_) return {};
  if (since_ == Clock::time_point{}) since_ = Clock::now();
  // Wait for every member still running to check in, or the settling time;
  // a silent one (stopped, its lease still) will not, whatever the wait.
  bool waiting = false;
  for (int id : members_)
    if (const Seen s = m.seen(id);
        !checked_in_.count(id) && s.state == State::kRunning && s.quiet_s < kQuietSeconds)
      waiting = true;
  if (waiting && Clock::now() - since_ < std::chrono::duration<double>(settle_s_)) return {};
  return reform(m, stop);
}

std::vector<std::string> ElasticCoordinator::reform(Members& m, std::string* stop) {
  std::vector<std::string> lines;
  std::vector<int> next;
  int again = 0;  // members that hold no state yet: newcomers once more
  for (int id : members_) {
    const Seen s = m.seen(id);
    if (s.state == Seen::State::kEndedWell || s.state == Seen::State::kFailed) continue;
    if (!checked_in_.count(id)) {
      const std::string why =
          s.state == Seen::State::kSilent ? s.why + " when its peers lost it"
          : s.quiet_s >= kQuietSeconds
              ? fmt::format(
                    "renewed no lease for {:.1f} s when its peers lost it (dead, "
                    "stopped or cut off)",
                    s.quiet_s)
              : fmt::format("did not check in within {} s of its peers (hung or cut off)",
                            settle_s_);
      left_[id] =
          why + (m.drop(id) ? ": killed" : ": dropped (refused by generation should it wake)");
      continue;
    }
    if (checked_in_.at(id) < 0) {
      announced_.insert(id);  // a newcomer that holds no state yet
      ++again;
      continue;
    }
    next.push_back(id);
  }
  // The newest state first: its holder becomes rank 0 and broadcasts it.
  std::stable_sort(next.begin(), next.end(),
                   [&](int a, int b) { return checked_in_.at(a) > checked_in_.at(b); });
  std::string who_left;
  for (int id : members_)
    if (left_.count(id) && std::find(next.begin(), next.end(), id) == next.end())
      who_left += fmt::format("{}rank {} {}", who_left.empty() ? "" : "; ", id, left_.at(id));
  const std::size_t survivors = next.size();
  const int lost_now = static_cast<int>(members_.size() - survivors) - again;
  // Newcomers last (rank 0 holds the state), up to MAX; those beyond it
  // wait as standbys for a place (a member lost later) or the job's end.
  std::vector<int> admitted;
  for (int id : announced_)
    if (static_cast<int>(next.size()) < max_) {
      next.push_back(id);
      admitted.push_back(id);
    }
  if (survivors == 0) {
    *stop = fmt::format("every rank of generation {} exited ({}): none is left to go on", gen_,
                        who_left);
  } else if (lost_now == 0 && again == 0 && admitted.empty()) {
    *stop = fmt::format(
        "every rank of generation {} failed its step with no rank lost: not a fault elastic "
        "training goes on from (the ranks' errors say why)",
        gen_);
  } else if (static_cast<int>(next.size()) < min_) {
    *stop = fmt::format("{} rank{} left after generation {} ({}), fewer than --elastic {}",
                        next.size(), next.size() == 1 ? "" : "s", gen_, who_left, min_);
  }
  if (!stop->empty()) {
    end(*stop);
    return lines;
  }
  ++gen_;
  std::string note = who_left;
  if (!admitted.empty())
    note += fmt::format("{}rank{} {} joined", note.empty() ? "" : "; ",
                        admitted.size() == 1 ? "" : "s", keys::join_ids(admitted));
  Status wrote = store_->set(keys::note(gen_), note);
  if (wrote.ok()) wrote = store_->set(keys::members(gen_), keys::join_ids(next));
  if (wrote.ok()) wrote = store_->set(keys::key("gen"), std::to_string(gen_));
  if (!wrote.ok()) {
    *stop = fmt::format("writing generation {} into the store: {}", gen_, wrote.message());
    return lines;
  }
  lines.push_back(fmt::format(
      "shoal run: generation {}: {} rank{} go on from step {} (ranks {} now ranks 0..{}); {}", gen_,
      next.size(), next.size() == 1 ? "" : "s", checked_in_.at(next.front()), keys::join_ids(next),
      next.size() - 1, note));
  members_ = std::move(next);
  for (int id : admitted) {
    if (auto it = std::find(joiners_.begin(), joiners_.end(), id); it != joiners_.end())
      joiners_.erase(it);
    announced_.erase(id);
  }
  for (int id : announced_)  // standbys (a member that must join anew among them)
    if (std::find(joiners_.begin(), joiners_.end(), id) == joiners_.end()) joiners_.push_back(id);
  regroup_asked_ = false;
  owed_ += lost_now;
  checked_in_.clear();
  troubled_ = false;
  since_ = {};
  return lines;
}

}  // namespace shoal::launch
