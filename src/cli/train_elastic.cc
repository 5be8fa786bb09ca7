// An elastic job's rank (`shoal run --elastic`, dist/elastic.h): the
// generations it trains, each one as train_once does, and the lease the
// launcher watches it by.
#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "cli/train_generations.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/train/sources.h"

namespace shoal::cli {
namespace {

std::string steps_str(std::int64_t n) { return fmt::format("{} step{}", n, n == 1 ? "" : "s"); }

// A step that failed because a peer is gone (died, froze, cut off): what
// an elastic job's survivors go on from. Other errors end the rank.
bool peer_lost(const Status& st) {
  return st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kAborted ||
         st.code() == StatusCode::kDeadlineExceeded ||
         st.code() == StatusCode::kCancelled;  // a regroup: ranks wait to join
}

// `shoal run --elastic MIN`: generations of one job (dist/elastic.h). Each
// trains until done or until a peer is lost; then this rank checks in with
// the state it kept and continues in the next generation, which trains on
// the same global batch.
int train_generations(train::TrainOptions o, const dist::JoinOptions& jo,
                      const std::string& flags_yaml, dist::ElasticEnv el) {
  el.global_batch = o.global_batch > 0 ? o.global_batch : o.batch * el.world;
  if (Status st = dist::check_elastic(el, jo, el.global_batch); !st.ok()) {
    SHOAL_LOG_ERROR("shoal train: {}", st.message());
    return 2;
  }
  auto every = env::get_int("SHOAL_ELASTIC_COMMIT_EVERY", 0);
  if (!every.ok() || *every < 0) {
    SHOAL_LOG_ERROR(
        "shoal train: SHOAL_ELASTIC_COMMIT_EVERY must be a count of steps >= 0 "
        "(0: chosen from the measured costs)");
    return 2;
  }
  const int commit_every = static_cast<int>(*every);
  // Every generation trains on the same data: it is read once, not again
  // by each generation's trainer (that was most of a regrouping's second).
  if (!o.dataset) {
    auto data = train::load_data(o.data, o.gpt.context);
    if (!data.ok()) {
      SHOAL_LOG_ERROR("shoal train: {}", data.status().to_string());
      return 2;
    }
    o.dataset = std::make_shared<const train::DataSplits>(std::move(data).value());
  }
  // A peer lost while a generation connects costs seconds (then this rank
  // checks in again), not SHOAL_COMM_TIMEOUT. Not for a first generation
  // whose ranks something else starts: they may come minutes apart.
  if (!el.claimed) setenv("SHOAL_CONNECT_TIMEOUT", "10", 0);
  std::shared_ptr<const train::CheckpointState> carry;
  std::string note;
  // A replacement waits to be admitted; its state comes from rank 0's
  // start-up broadcast.
  if (el.joining) {
    auto in = dist::admit(el, 300);
    if (!in.ok()) {
      SHOAL_LOG_ERROR("shoal train: {}", in.status().message());
      return 1;
    }
  }
  while (true) {
    train::TrainOptions g = o;
    g.commit = true;
    g.commit_every = commit_every;
    g.global_batch = el.global_batch;  // shares of it, even or not
    g.resume_state = carry;
    g.resume = o.resume || carry != nullptr || el.joining;
    g.metrics_note = note;
    // Only rank 0 asks (the step's vote tells the others).
    std::unique_ptr<dist::RegroupWatch> watch;
    if (el.rank == 0) {
      auto w = dist::RegroupWatch::start(el.generation);
      if (!w.ok()) {
        SHOAL_LOG_ERROR("shoal train: {}", w.status().message());
        return 1;
      }
      watch = std::move(w).value();
      g.regroup = [&watch] { return watch->asked(); };
    }
    Ended end = train_once(g, jo, flags_yaml);
    if (end.code == 0 || end.failed.ok() || !peer_lost(end.failed)) return end.code;
    // Failed while the generation formed (a peer lost as it connected): the
    // state carried into it is still this rank's. None at all: nothing to
    // go on from.
    if (end.committed) carry = end.committed;
    if (!carry && !el.joining) return end.code;
    // A newcomer whose first generation failed before it received the
    // state checks in holding none (-1): it is admitted again as new.
    const std::int64_t step = carry ? carry->get_int("step", 0) : -1;
    if (end.failed.code() == StatusCode::kCancelled)
      SHOAL_LOG_INFO("generation {} ends after step {}: {}", el.generation, step,
                     end.failed.message());
    else
      SHOAL_LOG_WARN(
          "generation {} lost a peer after step {}; going on from the state after step {} ({} "
          "trained again)",
          el.generation, end.reached, step,
          steps_str(std::max<std::int64_t>(end.reached, step) - step + 1));
    // How long the launcher may take: its settling time and a margin.
    auto next = dist::next_generation(el, step, 60);
    if (!next.ok()) {
      SHOAL_LOG_ERROR("shoal train: {}", next.status().message());
      return 1;
    }
    note = *next;
    setenv("SHOAL_CONNECT_TIMEOUT", "10", 0);
  }
}

}  // namespace

// The generations under a lease (dist::ElasticLease): the launcher sees
// this rank live, and how it ended, where it cannot see the process.
int train_elastic(train::TrainOptions o, const dist::JoinOptions& jo, const std::string& flags_yaml,
                  dist::ElasticEnv el) {
  auto lease = dist::ElasticLease::start(el.id);
  if (!lease.ok()) {
    SHOAL_LOG_ERROR("shoal train: elastic rank id {}: {}", el.id, lease.status().message());
    return 1;
  }
  const int code = train_generations(std::move(o), jo, flags_yaml, el);
  (*lease)->end(code);
  return code;
}

}  // namespace shoal::cli
