// `shoal run --elastic`: the launcher's side of an elastic job's
// generations (the ranks' side: dist/elastic.h; the store keys: core/elastic_keys.h). The
// launcher serves the store, so it decides who is in the next generation:
// each member that checked in (its step failed because a peer was lost)
// and still runs; a member that ended is out, and one that has not checked
// in within the settling time, or is silent (stopped, or its lease gone
// still), is dropped (killed where the launcher can). What it knows of each
// member comes from a Members view (launch/members.h: the local engine's
// processes, or srun's tasks and the ranks' leases). The members are
// ordered by the step they hold, newest first, so the new rank 0 holds
// the state every rank continues from. Private to launch.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "launch/members.h"
#include "shoal/core/status.h"
#include "shoal/net/store.h"

namespace shoal::launch {

class ElasticCoordinator {
 public:
  // `store` is a client of the launcher's own store; `ranks` the processes
  // of generation 0, `min` the fewest the job goes on with, `max` the most
  // it grows to when `shoal join` asks for more (elastic_keys::grow).
  // `replacements`: how many lost ranks the launcher replaces in all.
  // `claimed`: the ranks claim their ids in the store (--engine external),
  // the first generation's included.
  static Result<std::unique_ptr<ElasticCoordinator>> start(std::unique_ptr<net::Store> store,
                                                           int ranks, int min, int max,
                                                           double settle_s, int replacements,
                                                           bool claimed = false);
  // The same as a client of the launcher's store at host:port, with the
  // launcher's settling time.
  static Result<std::unique_ptr<ElasticCoordinator>> for_launcher(const std::string& host, int port,
                                                                  const std::string& token,
                                                                  int ranks, int min, int max,
                                                                  int replacements, bool claimed);

  // One turn of the launcher's supervision: tick(), then a newcomer
  // started through `m` for each rank lost while --max-restarts allows and
  // each asked for by `shoal join`. Returns why the job must end, "" to go on.
  std::string supervise(Members& m, int ranks);
  // The job ran to its end on the ranks that remained: their exit code is
  // the job's, and the lost ranks are named on stderr.
  int finish(Members& m, int ranks) const;

  // One look at the members. Returns lines for the user; sets `stop` to why
  // the job must end ("" = go on).
  std::vector<std::string> tick(Members& m, std::string* stop);
  // Whether rank id `id` left the job (its failure is not the job's).
  bool left(int id) const { return left_.count(id) != 0; }
  const std::map<int, std::string>& lost() const { return left_; }
  int generation() const { return gen_; }
  // Every member ended well: what else still runs is no part of the job.
  bool finished() const { return finished_; }
  int members() const { return static_cast<int>(members_.size()); }
  // Tells ranks waiting for a generation that none comes, and why.
  void end(const std::string& why);
  // How many replacements to start now (lost ranks, while any are left).
  int to_replace();
  // How many ranks `shoal join` asked for that may start now (up to MAX
  // with those training or joining; the rest refused, once, on stderr).
  int to_grow();
  void joined(int id);

 private:
  using Clock = std::chrono::steady_clock;
  ElasticCoordinator() = default;
  // The next generation from the members that checked in.
  std::vector<std::string> reform(Members& m, std::string* stop);
  // Ranks that claimed an id in the store since the last look (started by
  // something else): newcomers, standbys beyond MAX.
  void find_claims();
  bool knows(int id) const;
  std::unique_ptr<net::Store> store_;
  int min_ = 1, max_ = 1;
  int first_ = 0;             // ranks of generation 0 (ids below are theirs)
  int next_id_ = 0;           // one past the highest id given out
  std::int64_t granted_ = 0;  // of the grow requests: answered so far
  double settle_s_ = 5;
  int gen_ = 0;
  std::vector<int> members_;
  std::vector<int> joiners_;                // started, not admitted yet
  std::set<int> announced_;                 // joiners ready to be admitted
  bool regroup_asked_ = false;              // this generation was asked to regroup
  int replacements_ = 0;                    // left to start
  int owed_ = 0;                            // lost ranks not replaced yet
  std::map<int, std::string> left_;         // id -> why it left
  std::map<int, std::int64_t> checked_in_;  // this generation's: id -> step held
  bool troubled_ = false;                   // a member failed or checked in
  bool finished_ = false;                   // every member ended well
  Clock::time_point since_{};
};

}  // namespace shoal::launch
