// A pipeline's step as its ranks run it: the plan's price of its cuts.
//
// Each rank runs its work in mp::stage_work's order on its compute thread.
// A piece's output leaves through the rank's communicator (mp::pp_send:
// queued, not waited for), whose one progress thread sends, and receives,
// one message at a time (comm::Communicator::run_blocking queues a receive
// behind the sends before it). A message holds that thread for its cut's
// hop and arrives when the hop ends. Replaying that order with the hops,
// and again without them, gives what the cuts add to the step: on a fast
// link GPipe's fill and drain, and under 1F1B a hop wherever a rank's
// receive follows its own send (over 2 ranks, each micro-batch); on a slow
// one, a transfer at every micro-batch.
#include <algorithm>
#include <limits>
#include <vector>

#include "plan_internal.h"
#include "shoal/mp/pipeline.h"

namespace shoal::dist {

namespace {

struct Replay {
  int P, m, v;
  double f, b;                     // a piece's forward and backward seconds
  const std::vector<double>* hop;  // [rank]: to the next rank (the last: to rank 0)
  std::vector<std::vector<mp::Work>> order;
  // [piece][micro]: when its forward's output reaches the next piece's
  // rank, and its backward's the previous one's (< 0: not yet sent).
  std::vector<std::vector<double>> fwd_at, bwd_at;
  std::vector<double> compute_free, comm_free;
  std::vector<std::size_t> next;

  // When rank r's message from piece k (forward: to k + 1, else to k - 1)
  // leaves at `t`, the arrival.
  double send(int r, int k, bool forward, double t) {
    const int to = forward ? (k + 1) % P : (k - 1 + P) % P;
    const double h =
        forward ? (*hop)[static_cast<std::size_t>(r)] : (*hop)[static_cast<std::size_t>(to)];
    double& q = comm_free[static_cast<std::size_t>(r)];
    q = std::max(q, t) + h;
    return q;
  }

  // Runs rank r's next work if its input has arrived; false if it waits.
  bool step(int r) {
    const auto ru = static_cast<std::size_t>(r);
    if (next[ru] >= order[ru].size()) return false;
    const mp::Work w = order[ru][next[ru]];
    const int k = w.chunk * P + r, last = P * v - 1;
    const auto ku = static_cast<std::size_t>(k), mu = static_cast<std::size_t>(w.micro);
    double ready = compute_free[ru];
    const bool needs = w.forward ? k > 0 : k < last;
    if (needs) {
      const double at = w.forward ? fwd_at[ku - 1][mu] : bwd_at[ku + 1][mu];
      if (at < 0) return false;
      // The receive waits behind this rank's sends already queued.
      ready = std::max({ready, at, comm_free[ru]});
      comm_free[ru] = ready;
    }
    const double done = ready + (w.forward ? f : b);
    compute_free[ru] = done;
    if (w.forward && k < last) fwd_at[ku][mu] = send(r, k, true, done);
    if (!w.forward && k > 0) bwd_at[ku][mu] = send(r, k, false, done);
    ++next[ru];
    return true;
  }

  double run() {
    const auto pieces = static_cast<std::size_t>(P * v), micro = static_cast<std::size_t>(m);
    fwd_at.assign(pieces, std::vector<double>(micro, -1));
    bwd_at.assign(pieces, std::vector<double>(micro, -1));
    compute_free.assign(static_cast<std::size_t>(P), 0);
    comm_free.assign(static_cast<std::size_t>(P), 0);
    next.assign(static_cast<std::size_t>(P), 0);
    // Every pass runs at least one rank's work while any is left: a
    // schedule that deadlocks (none of them does) ends the replay.
    const std::size_t total = 2 * pieces * micro;
    for (std::size_t ran = 0; ran < total;) {
      std::size_t before = ran;
      for (int r = 0; r < P; ++r)
        while (step(r)) ++ran;
      if (ran == before) return std::numeric_limits<double>::infinity();
    }
    return *std::max_element(compute_free.begin(), compute_free.end());
  }
};

}  // namespace

double pipeline_transfer_s(const std::string& schedule, int P, int m, int v, double piece,
                           const std::vector<double>& hop) {
  if (P < 2 || m < 1 || static_cast<int>(hop.size()) != P) return 0;
  Replay r{P, m, v, piece / 3, 2 * piece / 3, &hop, {}, {}, {}, {}, {}, {}};
  const mp::Schedule s = schedule == "gpipe" ? mp::Schedule::kGPipe : mp::Schedule::k1F1B;
  for (int stage = 0; stage < P; ++stage) r.order.push_back(mp::stage_work(s, stage, P, m, v));
  const double with = r.run();
  const std::vector<double> none(hop.size(), 0.0);
  r.hop = &none;
  const double without = r.run();
  return std::max(0.0, with - without);
}

}  // namespace shoal::dist
