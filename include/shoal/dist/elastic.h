// Elastic data parallelism, the rank's side (`shoal run --elastic MIN`).
// The launcher serves the job's store and decides each generation's
// membership (launch/elastic_coordinator.h); a rank trains in generation 0
// as its launcher rank, and when a step fails because a peer died, froze or
// became unreachable, it keeps its state in memory (Trainer::committed),
// checks in with the step it holds, and waits for the next generation: the
// survivors, ordered so that the one holding the newest step is rank 0 and
// broadcasts it. The rank then joins again under that generation's rank,
// world and store keys; nothing is read from a checkpoint.
//
// A replacement (started by the launcher for a lost rank) announces itself
// and waits; the launcher then asks generation G to regroup, its ranks end
// run() after the step in progress (CANCELLED), check in, and the next
// generation admits the newcomer, which receives the state from rank 0's
// start-up broadcast (parameters, optimizer state, step, data position).
//
// The store keys: core/elastic_keys.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "shoal/core/status.h"

namespace shoal::net {
class Store;
}

namespace shoal::dist {

struct JoinOptions;

struct ElasticEnv {
  int min = 0;  // SHOAL_ELASTIC: the fewest ranks the job trains on
  int max = 0;  // SHOAL_ELASTIC_MAX: the most (`shoal join` adds up to it)
  // SHOAL_ELASTIC_ID: this process's name for good (its rank in generation
  // 0; a replacement's is above the first ranks').
  int id = 0;
  bool joining = false;           // SHOAL_ELASTIC_JOIN: a replacement, admitted later
  int generation = 0;             // SHOAL_ELASTIC_GENERATION
  int rank = 0, world = 0;        // this rank, and the ranks, in this generation
  std::int64_t global_batch = 0;  // what every generation trains on per step
  // Whether the launcher gave SHOAL_LOCAL_WORLD_SIZE (its local engine: every
  // rank on one host); each generation then says its ranks are local too.
  bool one_host = false;
  // SHOAL_ELASTIC=join: started by something else (Kubernetes, `shoal join
  // --job DIR -- CMD`), this rank claimed its id in the store.
  bool claimed = false;
};

// SHOAL_ELASTIC and the launcher's rank variables, or nullopt when the job
// is not elastic. An elastic job needs `shoal run`'s store (SHOAL_STORE).
// SHOAL_ELASTIC=join (ranks that `shoal run --engine external` did not
// start): the rank claims the next id in the store, a place in the first
// generation while one is free, else a newcomer's, and reads the job's
// MIN, MAX and first size there.
Result<std::optional<ElasticEnv>> elastic_env();

// What elastic training supports: data parallelism (ZeRO-1/2 too) over
// `shoal run`'s ranks, with a global batch of at least one sample for
// each rank of the largest allowed world. Sizes it does not divide train
// on uneven, weighted shares (TrainOptions::global_batch): the same step.
// The error names the flag or the sizes.
Status check_elastic(const ElasticEnv& e, const JoinOptions& j, std::int64_t global_batch);

// After generation e.generation failed: checks in with `step` (the state
// this rank holds), waits up to `wait_s` for the launcher's next
// generation, and enters it (the environment the next dist::Job::join
// reads: SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_COMM_PREFIX...). Returns what
// changed, as a metrics record (JSON). Fails, saying why, when this rank
// was dropped or the launcher ended the job.
Result<std::string> next_generation(ElasticEnv& e, std::int64_t step, double wait_s);

// A replacement's start: announces itself and waits up to `wait_s` for a
// generation that admits it, then enters it as next_generation does.
Result<std::string> admit(ElasticEnv& e, double wait_s);

// Rank 0's question after each step (TrainOptions::regroup): whether ranks
// wait to join this generation. A thread of its own reads the store every
// 200 ms; asked() only reads a flag. (Measured: a store read on the
// training thread after every step cost ~2 ms a step with 4 ranks on 2
// cores, the launcher's store thread waiting for a core; see
// docs/elastic.md.)
class RegroupWatch {
 public:
  static Result<std::unique_ptr<RegroupWatch>> start(int generation);
  ~RegroupWatch();
  bool asked() const { return asked_.load(std::memory_order_relaxed); }

 private:
  RegroupWatch() = default;
  void loop();
  std::unique_ptr<net::Store> store_;
  int generation_ = 0;
  std::atomic<bool> asked_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// A rank's lease for as long as its process lives (every generation, and
// the waits between them): a thread raises elastic_keys::alive(id) every
// 500 ms; end() writes how the rank ended (elastic_keys::exit). The launcher
// reads both where it cannot see the process (srun's tasks, ranks on
// other hosts): a lease that stops moving is a rank dead, stopped or cut
// off, without waiting for its peers' heartbeat.
class ElasticLease {
 public:
  static Result<std::unique_ptr<ElasticLease>> start(int id);
  ~ElasticLease();
  // Stops the lease and records `code` (0: ended well) in the store.
  void end(int code);

 private:
  ElasticLease() = default;
  void loop();
  void stop();
  std::unique_ptr<net::Store> store_;
  int id_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shoal::dist
