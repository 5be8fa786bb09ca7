// One parameter server's part of the model (the MXNet KVStore model, issue
// 14): the keys it holds, their optimizer state, and the rules that keep
// pushes from many workers correct, independent of the network that
// carries them. The failures ps-lite and MXNet users reported are what the
// rules exclude:
// - sync rounds count distinct live workers, never requests: a round of
//   (key, step) closes when every worker live when it opened (and still
//   live) has pushed once; a second push from the same worker to that round is
//   refused by name; a worker that leaves no longer holds rounds open.
// - a push carries the worker's sequence number; a server keeps each
//   worker's high-water mark, so a retried or duplicated push (a reconnect,
//   a restart) is recognized and not applied twice.
// - bounded staleness: no worker's push runs more than `staleness` steps
//   ahead of the slowest live worker (the caller waits and retries).
// - the optimizer runs on the server with the same update kernels as
//   training (train/optim.h), chosen by name with parameters as data.
// - snapshots (atomic, checksummed: the checkpoint format) hold values,
//   optimizer state, versions and high-water marks, so a restarted server
//   loses nothing and applies nothing twice.
// Not thread-safe: one serving thread owns a shard.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/ps/codec.h"
#include "shoal/tensor/tensor.h"
#include "shoal/train/checkpoint.h"
#include "shoal/train/optim.h"

namespace shoal::ps {

enum class Mode { kSync, kAsync, kBounded };
Result<Mode> parse_mode(const std::string& s);  // sync, async, bounded
const char* mode_name(Mode m);

struct ShardOptions {
  Mode mode = Mode::kSync;
  int staleness = 2;  // kBounded: steps a worker may run ahead of the slowest
  train::OptimizerOptions optimizer;
  double lr = 0.01;
  // How workers' pushes and pulls travel; the servers keep f32 values.
  Compression compression;
  // Keys of at least this many elements are sliced over all servers (0 =
  // never): MXNET_KVSTORE_BIGARRAY_BOUND, as in MXNet.
  std::int64_t slice_bound = 1000000;
  // Async and bounded: divide each push's learning rate by its staleness,
  // the updates the key received since the worker was last sent its value
  // (Zhang et al. 2016, "Staleness-aware async-SGD"): a straggler's old
  // gradient moves the weights less. A push with at most one update in
  // between keeps the full rate.
  bool stale_lr = false;
};

// Options that can run at all: under bounded staleness 0 every worker
// would wait for the others forever (a worker's own last step counts among
// the slowest), so it is refused with the flag named; 0 is sync mode.
Status check_options(const ShardOptions& o);

// The options as one line of text ("mode=sync staleness=2 optimizer=sgd
// ..."): what a worker sends, so that servers started without options adopt
// the job's, and what a server compares a worker's options with.
std::string config_text(const ShardOptions& o);
Result<ShardOptions> parse_config(const std::string& text);
// "" when the options agree on everything that changes the math; else the
// first field that differs with both values.
std::string config_diff(const ShardOptions& server, const ShardOptions& worker);

// What became of one push.
enum class PushResult {
  kApplied,    // async/bounded: the update is applied
  kCollected,  // sync: kept for its round, which is still open
  kClosed,     // sync: this push closed the round; the update is applied
  kDuplicate,  // seen before (sequence number <= the worker's mark): ignored
  kWait,       // bounded: too far ahead of the slowest worker; retry later
};
const char* push_result_name(PushResult r);

struct ShardStats {
  std::uint64_t applied = 0;               // updates applied to values
  std::uint64_t pushes = 0;                // pushes accepted (collected or applied)
  std::uint64_t duplicates = 0;            // pushes recognized as seen before
  std::uint64_t row_pushes = 0;            // of `pushes`, row-sparse
  std::uint64_t rounds = 0;                // sync rounds closed
  std::map<int, std::uint64_t> by_worker;  // pushes accepted per worker
  double round_seconds = 0;                // sync: first push to close, summed over rounds
  std::uint64_t staleness_sum = 0;     // async/bounded: updates since each push's value was sent
  std::uint64_t staleness_pushes = 0;  // pushes whose value's version was known
  std::map<int, std::int64_t> lag;     // live worker -> steps behind the most advanced
};

class Shard {
 public:
  static Result<std::unique_ptr<Shard>> create(const ShardOptions& o);
  ~Shard();

  // A key and its initial value (f32). Initializing a key again with the
  // same shape keeps the current value (a worker that joins late); another
  // shape is an error naming both.
  Status init(const std::string& key, const Tensor& value);

  Status add_worker(int worker);
  // The worker leaves (finished, or its heartbeat deadline passed): sync
  // rounds stop waiting for it, and those it alone held open close now.
  Status remove_worker(int worker);
  const std::set<int>& workers() const { return live_; }
  const ShardOptions& options() const { return o_; }

  // A gradient for `key` from `worker` at its `step`, with its sequence
  // number `seq` (strictly increasing per worker over all its pushes).
  // Errors name the worker, key, step and values: an unknown worker or
  // key, a gradient of another shape or type, a second push to one round,
  // a push for a round that closed or has not opened. `lr` > 0 is this
  // step's learning rate (a schedule on the workers), else the options'.
  Result<PushResult> push(int worker, const std::string& key, std::int64_t step, std::uint64_t seq,
                          const Tensor& grad, double lr = 0);

  // A row-sparse push (embedding tables): `values` holds rows `rows` of
  // the key's gradient, shape [rows.size(), the key's other dimensions];
  // every other row is zero, and a row listed twice adds. The rules and the
  // update are those of push() with that dense gradient, so the result
  // equals dense training (the update itself is dense: the saving is on
  // the wire). Errors name the key, the row and the key's row count.
  Result<PushResult> push_rows(int worker, const std::string& key, std::int64_t step,
                               std::uint64_t seq, const std::vector<std::int64_t>& rows,
                               const Tensor& values, double lr = 0);
  // The server sent `worker` the key's value at `version` (a pull or a
  // push-pull's answer): what the worker's next gradient for it is computed
  // from, which staleness is counted against.
  void sent(int worker, const std::string& key, std::uint64_t version);

  // Rows `rows` of the key's value, and its version.
  Result<std::pair<std::uint64_t, Tensor>> pull_rows(const std::string& key,
                                                     const std::vector<std::int64_t>& rows) const;

  // The key's value and version (updates applied so far).
  Result<std::pair<std::uint64_t, Tensor>> pull(const std::string& key) const;
  // The same without a copy: valid until the next call that changes the
  // shard. Servers encode replies straight from it.
  Result<std::pair<std::uint64_t, const Tensor*>> peek(const std::string& key) const;
  // Steps the worker is behind the most advanced live worker (bounded
  // staleness reports this per worker).
  std::int64_t lag(int worker) const;
  const ShardStats& stats() const { return stats_; }

  Status snapshot(const std::string& path) const;
  // What a snapshot holds, copied: the shard may change while it is written.
  train::CheckpointState capture() const;
  // Restores values, optimizer state, versions, members and marks from a
  // snapshot; the options must match the ones it was written with.
  Status restore(const std::string& path);
  // The same from a snapshot already read (`path` names it in errors).
  Status restore(const train::CheckpointState& s, const std::string& path);

 private:
  struct Key;
  Shard() = default;
  // Runs the update on k.grad (filled by the caller).
  Status apply(Key& k, double lr);
  // Async/bounded: this push's rate (divided by its staleness under
  // stale_lr), and the staleness counted in the stats.
  double stale_rate(int worker, const Key& k, double lr);
  Status close_ready_rounds();

  ShardOptions o_;
  std::map<std::string, std::unique_ptr<Key>> keys_;
  std::set<int> live_;
  std::map<int, std::uint64_t> mark_;  // worker -> highest sequence number seen
  std::map<int, std::int64_t> step_;   // worker -> highest step pushed
  // (worker, key) -> the version last sent to it; not in snapshots (after a
  // restart a push's staleness counts as unknown: the full rate)
  std::map<std::pair<int, std::string>, std::uint64_t> sent_;
  ShardStats stats_;
};

}  // namespace shoal::ps
