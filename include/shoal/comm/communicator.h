// Collectives over a full mesh of TCP connections between the ranks of a
// job. Rendezvous goes through a Store (each rank publishes its listening
// address); every connection is authenticated with an HMAC-SHA256
// challenge over the job token. Every call is queued on one progress
// thread per communicator, so calls run in program order; the blocking
// forms wait for their Work. Each frame carries the collective's sequence
// number and a fingerprint (op, dtype, reduce op, root, count) that the
// receiver checks, so ranks that disagree on the call get an error naming
// both calls instead of corrupted data. Every wait has a deadline
// (SHOAL_COMM_TIMEOUT, default 300 s); a peer that dies or aborts is named
// (rank, address, collective and sequence number) on every rank that
// talks to it or watches it while waiting.
//
// Buffers are raw pointers with a count and dtype; send == recv means in
// place. f16/bf16 reductions accumulate in f32. Thread-safe: calls from
// several threads are serialized in submission order (which must then be
// the same on every rank).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shoal/core/deadline.h"
#include "shoal/core/status.h"
#include "shoal/tensor/dtype.h"

namespace shoal {
class Storage;  // shoal/tensor/tensor.h
}
namespace shoal::net {
class Store;
class TcpStoreServer;
class SharedRegion;
}  // namespace shoal::net

namespace shoal::comm {

struct Topology;  // the tuner's picture of hosts and links (src/comm/tuner.h)

enum class ReduceOp : std::uint8_t { kSum, kProd, kMin, kMax, kAvg };
const char* reduce_op_name(ReduceOp op);

enum class Algorithm : std::uint8_t {
  kAuto,
  kRing,
  kRecursiveDoubling,
  kTree,
  kDirect,
  kHalvingDoubling,
  kHierarchical
};
// auto, ring, rd, tree, direct, hd (Rabenseifner), hier
Result<Algorithm> parse_algorithm(const std::string& s);

struct CommOptions {
  double timeout_seconds = 300;  // SHOAL_COMM_TIMEOUT
  // SHOAL_CONNECT_TIMEOUT: how long connecting to the peers may take (0 =
  // timeout_seconds). An elastic job's ranks set it short: a peer that dies
  // while a generation connects then costs seconds, not the whole timeout.
  double connect_seconds = 0;
  Algorithm allreduce = Algorithm::kAuto;  // SHOAL_ALLREDUCE_ALGO
  std::size_t small_bytes = 64 << 10;  // deterministic auto: recursive doubling below, ring above
  // The two-level all-reduce pipelines its phases in pieces of this size.
  std::size_t hier_piece_bytes = 4 << 20;
  // SHOAL_DETERMINISTIC=1: no timing-based choices (the α-β tuner is off and
  // the fixed threshold above decides), so reduction order never varies.
  bool deterministic = false;
  std::string host;                 // address to listen on ("" = loopback)
  std::string iface;                // where `host` came from, for messages
  std::string token;                // job token (SHOAL_JOB_TOKEN); "" = none
  std::string prefix = "shoal";     // store key prefix (sub-communicators)
  bool is_world = true;             // false for split(): once-per-job checks skip it
  std::string transport = "auto";   // SHOAL_TRANSPORT: auto (shm on one host) or tcp
  std::size_t shm_bytes = 4 << 20;  // ring size per direction per pair
  // SHOAL_SHM_SPIN_US: how long a rank waiting on shared memory spins before
  // it sleeps on the ring's futex (short: ranks often share cores).
  long shm_spin_us = 50;
  // Microseconds a rank waiting only on sockets polls without sleeping
  // (SHOAL_SOCKET_SPIN_US): a sleeping poll() costs a wake-up per message.
  long socket_spin_us = 50;
  // SHOAL_CMA=0 turns it off: when every rank is on this host and Linux
  // cross-memory attach works between them (probed at start-up), large
  // all-reduces read and write peers' buffers directly (process_vm_readv/
  // writev: one copy instead of two through a ring) from direct_bytes up. Its reduction
  // order is fixed, so SHOAL_DETERMINISTIC=1 keeps it.
  bool cma = true;
  // SHOAL_MAP_PEERS=0 turns it off: when a buffer of the direct all-reduce
  // lies in shared memory (Communicator::allocate_shared) on every rank,
  // each rank maps its peers' regions once and reduces from and writes into
  // them with plain loads and stores, no system call per byte.
  bool map_peers = true;
  // Which host this rank is on (SHOAL_HOST_ID; default hostname + boot id).
  // Ranks with the same id share memory; a job over several hosts with
  // several ranks on some of them gets the two-level all-reduce. Tests use
  // it to make one machine look like several.
  std::string host_id;
  std::size_t direct_bytes = 0;  // 0: 64 KiB at 2 ranks, 256 KiB at more
  // SHOAL_MAX_CLOCK_SKEW: ranks whose wall clocks differ by more (seconds)
  // are refused at start-up, naming both clocks; 0 turns the check off.
  double max_clock_skew = 60;
  // Reads SHOAL_COMM_TIMEOUT, SHOAL_ALLREDUCE_ALGO, SHOAL_JOB_TOKEN, SHOAL_IFACE_ADDR,
  // SHOAL_TRANSPORT, SHOAL_DETERMINISTIC, SHOAL_SHM_SPIN_US, SHOAL_SHM_BYTES, SHOAL_CMA,
  // SHOAL_MAP_PEERS, SHOAL_MAX_CLOCK_SKEW.
  static Result<CommOptions> from_env();
};

class MpiBackend;
class Mesh;
class Watchdog;

class Work {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  Status wait(Deadline dl);
  bool test();
  // When the progress thread started and finished the call (valid once
  // done): what a trace shows on the communication lane.
  TimePoint started() const { return started_; }
  TimePoint finished() const { return finished_; }

 private:
  friend class Communicator;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  TimePoint started_{}, finished_{};
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  // Connects rank `rank` of `world` through `store`, which must outlive
  // the communicator (split() uses it again).
  static Result<std::unique_ptr<Communicator>> create(int rank, int world, net::Store& store,
                                                      CommOptions o);
  // Rank, world and store from the environment (core/launch_env.h); rank 0
  // starts the TCP store when SHOAL_STORE/MASTER_ADDR names this host and
  // nobody serves it yet (SHOAL_STORE_SERVE=1 forces it).
  static Result<std::unique_ptr<Communicator>> from_env();
  ~Communicator();
  const char* backend() const;  // "native" or "mpi"

  int rank() const { return rank_; }
  int size() const { return world_; }
  // Ranks on this rank's host, itself included. The MPI backend reads
  // OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS, else says 1.
  int local_size() const;

  // Blocking collectives (each = the async form + wait with the timeout).
  Status allreduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op);
  Status reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op, int root);
  Status broadcast(void* buf, std::size_t count, DType dt, int root);
  Status allgather(const void* send, void* recv, std::size_t count, DType dt);
  Status allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dt);
  Status reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                        DType dt, ReduceOp op);
  Status gather(const void* send, void* recv, std::size_t count, DType dt, int root);
  Status scatter(const void* send, void* recv, std::size_t count, DType dt, int root);
  Status all_to_all(const void* send, void* recv, std::size_t count, DType dt);
  Status all_to_allv(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                     const std::vector<std::size_t>& recv_counts, DType dt);
  Status barrier();
  Status send(const void* buf, std::size_t count, DType dt, int dst, int tag = 0);
  Status recv(void* buf, std::size_t count, DType dt, int src, int tag = 0);

  // Async forms: the call is queued; buffers must stay valid until wait().
  WorkPtr allreduce_async(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op);
  WorkPtr reduce_async(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op,
                       int root);
  WorkPtr broadcast_async(void* buf, std::size_t count, DType dt, int root);
  WorkPtr allgather_async(const void* send, void* recv, std::size_t count, DType dt);
  WorkPtr allgatherv_async(const void* send, void* recv, std::vector<std::size_t> counts, DType dt);
  WorkPtr reduce_scatter_async(const void* send, void* recv, std::vector<std::size_t> counts,
                               DType dt, ReduceOp op);
  WorkPtr gather_async(const void* send, void* recv, std::size_t count, DType dt, int root);
  WorkPtr scatter_async(const void* send, void* recv, std::size_t count, DType dt, int root);
  WorkPtr all_to_all_async(const void* send, void* recv, std::size_t count, DType dt);
  WorkPtr barrier_async();
  WorkPtr send_async(const void* buf, std::size_t count, DType dt, int dst, int tag = 0);
  WorkPtr recv_async(void* buf, std::size_t count, DType dt, int src, int tag = 0);
  // Any callable, run in order with the other calls (it may call blocking ones).
  WorkPtr submit(std::function<Status()> fn);

  // Sub-communicator of the ranks with the same color, ordered by (key, rank).
  // Collective over this communicator. color < 0: this rank is in none (nullptr).
  Result<std::unique_ptr<Communicator>> split(int color, int key);

  // Memory the direct all-reduce reaches without system calls from the
  // other ranks on this host (net::SharedRegion): give collectives buffers
  // in it (e.g. an executable's arena) and large all-reduces between ranks
  // of one host run over mapped memory. Any buffer works with every call;
  // these are only faster.
  static Result<std::shared_ptr<net::SharedRegion>> allocate_shared(std::size_t bytes);
  // A training step's arena (TrainOptions::arena_allocator) in such a
  // region, so that peers on this host (ranks, parameter servers) read and
  // write its buffers in place; where memfd is refused, private memory, with
  // a warning (everything still works, through system calls).
  static Result<std::shared_ptr<Storage>> shared_arena(std::size_t bytes);
  // Whether the last direct all-reduce read every peer's buffer through a
  // mapping (false: some or all through process_vm_readv/writev).
  bool last_direct_mapped() const;

  const char* last_algorithm() const { return last_algo_; }
  // Payload bytes this rank has sent to its peers so far (frames' headers
  // and cross-memory copies not counted).
  std::uint64_t bytes_sent() const;
  // The α-β model fitted at start-up (0 when not calibrated): seconds per
  // message and per byte for one exchange around the ring.
  double alpha() const { return alpha_; }
  double beta() const { return beta_; }
  // Across hosts with several ranks on some host: the same fit between
  // ranks of one host (the slowest host's), which the tuner prices the
  // steps inside a host with (0 otherwise).
  double host_alpha() const;
  double host_beta() const;
  std::uint64_t sequence() const;
  Deadline deadline() const { return Deadline::after_seconds(o_.timeout_seconds); }
  // From another thread: every call in flight or to come fails at once, as
  // if every peer had closed (an elastic job's survivors end the step this
  // way when the watchdog names a silent rank, then form the next
  // generation; dist/elastic.h). The native backend only.
  void cut();

 private:
  Communicator() = default;
  static Result<std::unique_ptr<Communicator>> wrap_mpi(std::unique_ptr<MpiBackend> b,
                                                        CommOptions o);
  void progress_loop();
  Status run_one(const std::function<Status()>& fn);
  Status run_blocking(std::function<Status()> fn);

  Status calibrate();
  static constexpr int kSampledHosts = 4;  // hosts whose own links are fitted
  Status fit_hosts_in_turn();
  Algorithm choose_allreduce(std::size_t bytes) const;
  Algorithm tuned_allreduce(std::size_t bytes, std::size_t count);  // across hosts, cached
  Status do_allreduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op);
  Status hier_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op);
  Status hier_sliced(void* buf, std::size_t count, DType dt, ReduceOp op);  // op: not avg
  std::string hier_where(const char* part) const;  // error context: which phase
  Status setup_hierarchy();
  Status do_reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op, int root,
                   std::uint64_t fp);
  Status do_broadcast(void* buf, std::size_t bytes, int root, std::uint64_t fp);
  // Whether a reduce-scatter or all-gather of `total_bytes` goes direct;
  // `part` (this rank's, `part_bytes`) must sit at `part_offset` of `whole`
  // or apart from it.
  bool gather_scatter_direct(std::size_t total_bytes, const void* part, std::size_t part_bytes,
                             const void* whole, std::size_t part_offset) const;
  Status do_allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts,
                       DType dt, std::uint64_t fp);
  Status do_reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                           DType dt, ReduceOp op, std::uint64_t fp);

  int rank_ = 0, world_ = 1;
  CommOptions o_;
  std::unique_ptr<Mesh> mesh_;  // the transport (native backend)
  // Two-level all-reduce: this host's ranks, and the ranks of the other
  // hosts at this rank's place in theirs (every host as many ranks:
  // uniform_) or, otherwise, one leader per host (null on the others).
  std::unique_ptr<Communicator> local_, columns_;
  bool uniform_ = false;
  std::vector<std::uint8_t> hier_slice_;  // this rank's slice (uniform)
  double alpha_ = 0, beta_ = 0;
  // Hosts and their links, for the tuner across hosts (src/comm/tuner.h).
  std::unique_ptr<Topology> topo_;
  std::map<std::pair<std::size_t, std::size_t>, Algorithm> tuned_;  // (bytes, count) -> choice
  const char* current_ = "";  // name of the running collective
  const char* last_algo_ = "";
  bool aborted_ = false;
  Status abort_status_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<Status()>, WorkPtr>> queue_;
  bool stop_ = false;
  bool busy_ = false;  // a call is running (worker or inline)
  std::thread worker_;
  net::Store* store_ = nullptr;
  std::unique_ptr<MpiBackend> mpi_;  // SHOAL_COMM_BACKEND=mpi
  std::unique_ptr<net::TcpStoreServer> own_store_;
  std::unique_ptr<net::Store> own_client_;
  std::unique_ptr<Watchdog> watchdog_;  // heartbeats (from_env, world > 1)
};

// Fingerprint of a call: op, dtype, reduce op, root and the low 24 bits of
// the count, packed so a mismatch can be described from the number alone.
std::uint64_t fingerprint(std::uint8_t op, DType dt, std::uint8_t rop, int root, std::size_t count);
std::string describe_fingerprint(std::uint64_t fp);

// dst[i] = dst[i] (op) src[i] for n elements (f16/bf16 through f32).
void reduce_into(void* dst, const void* src, std::size_t n, DType dt, ReduceOp op);

}  // namespace shoal::comm
