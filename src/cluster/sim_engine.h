// The simulator's event loop and scheduler state (sim.cc: events and
// accounting; sim_sched.cc: the scheduling pass of each policy).
#pragma once

#include <array>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include "shoal/cluster/sim.h"

namespace shoal::cluster {

class Engine {
 public:
  Engine(const Topology& t, const Trace& tr, Policy p, const SimOptions& o);
  SimReport run();

 private:
  enum Kind { kRepair = 0, kFinish = 1, kFail = 2, kArrive = 3 };  // same-time order
  struct Event {
    double t;
    int kind, id, gen;
    bool operator>(const Event& e) const {
      return std::tie(t, kind, id) > std::tie(e.t, e.kind, e.id);
    }
  };
  struct Job {
    int queue = 0;
    bool pending = false, running = false, done = false;
    double remaining = 1;  // fraction of the work left
    double rate = 0;       // fraction per second while running
    double useful = 0;     // its chips (CPUs) divided by its slowdown
    double last = 0;       // when remaining was last brought up to date
    double run_start = 0, first_start = -1, planned_end = -1;
    int gen = 0, ranks = 0;
    int disturbed = 0;            // times moved or suspended (sim_move.cc)
    int borrowed = -1;            // the reservation_ whose chips it started on; -1: none
    bool adjacent_never = false;  // its links cannot be had on this cluster
    std::vector<int> end_nodes;   // where planned_end is noted in node_ends_
    double declined = 0;  // > 0: declined a start this much slower than ideal (worth_waiting)
    WaitReason why = WaitReason::kQueued;  // of its last failed try
    Placement p;
  };
  using Key = std::tuple<int, double, int>;  // (−priority, submit, id)

  // sim.cc
  void advance(double t);
  void arrive(int j);
  void finish(int j);
  void fail(int n);
  void update_progress(int j);
  bool start(int j, const Placement& p);
  void stop(int j, bool requeue);
  void restart(int j);  // back to its last checkpoint, to the queue
  void repair(int n);
  void note_slots(int j, const std::vector<RankSlot>& slots, int sign);
  void shrink(int j, int drop);  // its last `drop` workers leave
  // The workers for which `leaves` holds give their slots back.
  void shrink_where(int j, const std::function<bool(int, const RankSlot&)>& leaves);
  void set_rate(int j);
  void drop_end(int j);  // out of ends_
  void enqueue(int j);
  void dequeue(int j);
  double units(const JobSpec& s, int ranks) const;  // chips (CPUs on a chipless cluster)
  double capacity_units() const { return chips_ ? total_[2] : total_[0]; }  // the cluster's
  double dominant_share(int q) const;
  SimReport report(double wall);

  // sim_sched.cc
  void schedule();
  void pass_fifo();
  void pass_backfill(bool drf);
  int pick_queue(const std::vector<std::set<Key>::iterator>& it) const;
  // Under Shoal, nullopt with *declined > 0 when the job waits for linked
  // chips rather than run slowly (worth_waiting).
  std::optional<Placement> try_place(int j, double* declined = nullptr) const;
  // Whether a gang without links, offered `p`, does better to wait for
  // linked chips: they free up (linked_at, from running jobs' limits)
  // before its own wait plus now would exceed what p's slowdown costs.
  // Returns p's slowdown - 1 if so, else 0.
  double worth_waiting(int j, const Placement& p) const;
  // Whether a job that declined stays declined: no ring node has the chips
  // free (nor whole nodes idle), and waiting is still worth it. Cheap: a
  // declined job is asked again after every event.
  bool still_declined(int j) const;
  std::optional<Placement> elastic_place(int j) const;
  // When `s`'s chips could be linked: a ring node, or enough consecutive
  // ones of one switch, all idle by their jobs' planned ends. Conservative
  // for a ring inside a node (an arc may free up before the whole node).
  double linked_at(const JobSpec& s) const;
  // Each run of consecutive nodes of one switch that k linked chips would
  // take (one node when k fits in one, k / its chips nodes when k is a
  // multiple of them): f(the switch, the run's first index, its length).
  template <class F>
  void for_each_node_run(int k, F&& f) const {
    for (const Switch& sw : t_.switches) {
      if (sw.nodes.empty()) continue;
      const int a = t_.nodes[sw.nodes[0]].accels;
      if (a <= 0 || (k > a && k % a != 0)) continue;
      const std::size_t m = k <= a ? 1 : static_cast<std::size_t>(k / a);
      for (std::size_t i = 0; i + m <= sw.nodes.size(); ++i) f(sw, i, m);
    }
  }
  double time_limit(int j) const;          // max_runtime_s, else the duration
  struct LinkedAtCache {                   // valid while nothing starts, stops or is re-planned
    std::pair<long, double> stamp{-1, 0};  // (version_, now_)
    int most_free = 0;                     // free chips of the freest ring node
    std::map<int, double> by_chips;
  };
  mutable LinkedAtCache linked_at_;
  // Bumped when a planned end or a node's state changes (drop_end, which
  // set_rate and stop call; fail; repair).
  long version_ = 0;
  PlaceOptions options_for(int j) const;  // place_, without adjacency it can never have
  void blame(int j);                      // its try failed: no room, or no room in its shape
  bool preempt_for(int j);
  // sim_move.cc. Under Shoal: a gang that waits for linked chips while
  // enough are free in all gets them by moving running jobs off a run of
  // nodes, each to a place where it runs no slower (see the file).
  // `lost`: for a gang without links, how much slower than ideal it would
  // run where it can start now, or the placement it declined
  // (worth_waiting); it moves others only when lost > 0.
  bool move_for(int j, double lost);
  struct NodeRun {
    double lost = 0;          // chip-seconds the moves cost
    std::vector<int> nodes;   // to be emptied for the gang
    std::vector<int> movers;  // the running jobs on them
  };
  // Runs of nodes of one switch that k linked chips (or not) could take
  // if their jobs moved, the moves losing less than `gain` chip-seconds;
  // cheapest first.
  std::vector<NodeRun> runs_to_empty(int k, bool linked, double gain) const;
  // slowdown - 1 of a sync gang without links under p; else 0.
  double spread_cost(int j, const Placement& p) const;
  void move(const std::vector<std::pair<int, Placement>>& moves);
  // Whether j can be stopped at a moment's notice (a checkpoint written
  // then, SimOptions::move_s lost), to move it or send it back to the queue.
  bool stoppable(int j) const;
  // The holder of the reservation starts as soon as it fits with the jobs
  // that borrowed its chips suspended (the latest started first).
  bool reclaim_for(int j);
  void suspend(int j);
  void lose_move_time(int j);  // move_s of j's time, to redo
  void grow_elastic();
  struct Reservation {
    double shadow = 0, extra = 0;
  };
  Reservation reserve(int j) const;

  const Topology& t_;
  const Trace& tr_;
  Policy policy_;
  SimOptions o_;
  PlaceOptions place_;
  ClusterState s_, empty_;
  bool chips_;
  std::vector<Job> jobs_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::vector<std::set<Key>> pending_;  // per queue (one queue unless fair share)
  std::set<int> running_;
  std::multiset<int> running_prio_;  // priorities of running jobs
  int holder_ = -1;                  // the job holding the backfill reservation
  // Jobs started on holder_'s reserved chips (Shoal) are marked with the
  // reservation's number; a new holder, a new number.
  int reservation_ = 0;
  // reclaim_for's last try that failed: (holder, reservation_, chips it
  // could have, borrowers).
  std::tuple<int, int, double, std::size_t> reclaim_failed_{-1, -1, 0, 0};
  std::multimap<double, int> ends_;               // planned end → running job
  std::vector<std::multiset<double>> node_ends_;  // per node: its jobs' planned ends
  std::map<std::string, int> queue_index_;
  std::vector<int> backlog_;                  // pending jobs per real queue
  std::vector<std::array<double, 3>> usage_;  // per real queue: CPUs, MB, chips in use
  std::array<double, 3> total_{};             // the cluster's CPUs, MB, chips
  double now_ = 0, busy_ = 0, frag_area_ = 0, jain_area_ = 0, jain_time_ = 0;
  double backlog_busy_ = 0, backlog_time_ = 0, backlog_useful_ = 0;
  double frag_now_ = 0, used_units_ = 0, useful_units_ = 0, useful_ = 0, window_end_ = 0,
         first_submit_ = 0, last_end_ = 0;
  SimReport r_;
  std::vector<double> waits_;
  double slow_sum_ = 0;
  int slow_n_ = 0;
};

}  // namespace shoal::cluster
