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
#include "shoal/net/shared_memory.h"
#include "shoal/net/shm.h"
#include "shoal/net/socket.h"
#include "shoal/net/store.h"
#include "shoal/tensor/dtype.h"

namespace shoal::comm {

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
  double timeout_seconds = 300;            // SHOAL_COMM_TIMEOUT
  Algorithm allreduce = Algorithm::kAuto;  // SHOAL_ALLREDUCE_ALGO
  std::size_t small_bytes = 64 << 10;  // deterministic auto: recursive doubling below, ring above
  // SHOAL_DETERMINISTIC=1: no timing-based choices (the α-β tuner is off and
  // the fixed threshold above decides), so reduction order never varies.
  bool deterministic = false;
  std::string host;                 // address to listen on ("" = loopback)
  std::string token;                // job token (SHOAL_JOB_TOKEN); "" = none
  std::string prefix = "shoal";     // store key prefix (sub-communicators)
  bool is_world = true;             // false for split(): once-per-job checks skip it
  std::string transport = "auto";   // SHOAL_TRANSPORT: auto (shm on one host) or tcp
  std::size_t shm_bytes = 4 << 20;  // ring size per direction per pair
  // SHOAL_SHM_SPIN_US: how long a rank waiting on shared memory spins before
  // it sleeps on the ring's futex (short: ranks often share cores).
  long shm_spin_us = 50;
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

// Where a rank finds its rank, world size and store: SHOAL_* first, then
// torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), OpenMPI
// (OMPI_COMM_WORLD_*), PMI/PMIx, a Slurm job step (SLURM_PROCID/
// SLURM_STEP_NUM_TASKS; a batch shell without SLURM_STEP_ID is one process).
struct EnvInfo {
  int rank = 0, world = 1, local_rank = 0;
  std::string store;   // host:port of the TCP store ("" when none is set)
  std::string source;  // which variables were used
};
Result<EnvInfo> env_info();

class Communicator {
 public:
  // Connects rank `rank` of `world` through `store`, which must outlive
  // the communicator (split() uses it again).
  static Result<std::unique_ptr<Communicator>> create(int rank, int world, net::Store& store,
                                                      CommOptions o);
  // Rank, world and store from the environment (see env_info); rank 0
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
  // Whether the last direct all-reduce read every peer's buffer through a
  // mapping (false: some or all through process_vm_readv/writev).
  bool last_direct_mapped() const { return last_mapped_; }

  const char* last_algorithm() const { return last_algo_; }
  // The α-β model fitted at start-up (0 when not calibrated): seconds per
  // message and per byte for one exchange around the ring.
  double alpha() const { return alpha_; }
  double beta() const { return beta_; }
  std::uint64_t sequence() const { return seq_; }
  Deadline deadline() const { return Deadline::after_seconds(o_.timeout_seconds); }

  // Internal: one transfer in an exchange (see comm.cc).
  struct Xfer {
    int peer;
    bool is_send;
    void* buf;
    std::size_t bytes;
    std::size_t done = 0;
    bool header_done = false;
    std::uint8_t hdr[net::kHeaderBytes] = {};
    // Receive-and-reduce: payload is combined into buf (dt, op) as it
    // arrives instead of copied; `carry` holds a split element.
    bool reduce = false;
    DType dt = DType::kF32;
    ReduceOp op = ReduceOp::kSum;
    std::size_t applied = 0, carry = 0;
    std::uint8_t carry_bytes[8] = {};
    std::uint32_t bell = 0;  // the shm ring's doorbell before the last look
  };

 private:
  Communicator() = default;
  static Result<std::unique_ptr<Communicator>> wrap_mpi(std::unique_ptr<MpiBackend> b,
                                                        CommOptions o);
  Status connect_mesh(net::Store& store);
  Status setup_shm(net::Store& store, Deadline dl);
  bool is_shm(int peer) const {
    return !shm_.empty() && shm_[static_cast<std::size_t>(peer)] != nullptr;
  }
  void progress_loop();
  Status run_one(const std::function<Status()>& fn);
  Status run_blocking(std::function<Status()> fn);
  Status exchange(std::vector<Xfer>& xs, std::uint64_t fp, const char* what);
  Status sendrecv(int to, const void* s, std::size_t sb, int from, void* r, std::size_t rb,
                  std::uint64_t fp, const char* what);
  Status send_to(int to, const void* s, std::size_t sb, std::uint64_t fp, const char* what);
  Status recv_from(int from, void* r, std::size_t rb, std::uint64_t fp, const char* what);
  void abort_peers(const Status& why);
  std::string abort_message(int peer, std::uint64_t length, bool from_ring, Deadline dl);

  Status calibrate();
  Algorithm choose_allreduce(std::size_t bytes) const;
  Status do_allreduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op);
  Status ring_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op, std::uint64_t fp);
  Status rd_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op, std::uint64_t fp);
  Status direct_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op, std::uint64_t fp);
  Status hd_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op, std::uint64_t fp);
  Result<int> fold_in(void* buf, std::size_t count, DType dt, ReduceOp op, std::uint64_t fp,
                      const char* what);
  Status fold_out(void* buf, std::size_t bytes_n, std::uint64_t fp, const char* what);
  int fold_p2() const;
  int fold_rank(int nr) const;
  Status hier_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op);
  Status setup_hierarchy();
  // Sends `bytes` of `mine` to every peer and receives each peer's into
  // theirs + peer * bytes, all at once.
  Status exchange_all(const void* mine, std::size_t bytes, void* theirs, std::uint64_t fp,
                      const char* what);
  Status probe_cma(net::Store& store, Deadline dl);
  // The peer's region `ref` mapped here, opened on first use and kept (up
  // to 16 per peer); nullptr when it cannot be mapped (then the caller
  // copies through CMA; the failure is logged once and remembered).
  net::PeerMapping* peer_mapping(int peer, const net::SharedRef& ref);
  // Copies between `local` and `remote` in a peer's address space (to_peer:
  // local -> remote), through process_vm_readv/writev.
  Status cma_copy(int peer, std::uint64_t remote, void* local, std::size_t bytes, bool to_peer,
                  const char* what);
  Status do_reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op, int root,
                   std::uint64_t fp);
  Status do_broadcast(void* buf, std::size_t bytes, int root, std::uint64_t fp);
  Status do_allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts,
                       DType dt, std::uint64_t fp);
  Status do_reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                           DType dt, ReduceOp op, std::uint64_t fp);

  int rank_ = 0, world_ = 1;
  CommOptions o_;
  std::vector<net::Socket> peers_;                     // peers_[r] for r != rank_
  std::vector<std::string> hosts_;                     // listening address of each rank
  std::vector<std::unique_ptr<net::ShmChannel>> shm_;  // same-host peers
  std::vector<int> cma_pid_;  // process ids of the peers, when direct reads work with all
  bool cma_ = false;
  // Two-level all-reduce: this host's ranks, and one leader per host.
  std::vector<std::string> host_of_;
  std::unique_ptr<Communicator> local_, leaders_;
  std::uint64_t cma_probe_ = 0x414d434c414f4853ull;  // "SHOALCMA", read by peers' probes
  std::uint64_t seq_ = 0;
  double alpha_ = 0, beta_ = 0;
  const char* current_ = "";  // name of the running collective
  const char* last_algo_ = "";
  std::vector<std::uint8_t> scratch_;
  std::vector<std::uint8_t> bounce_ = std::vector<std::uint8_t>(256 << 10);
  // Peers' shared regions mapped here, by (peer, region id); null = refused.
  std::map<std::pair<int, std::uint64_t>, std::unique_ptr<net::PeerMapping>> peer_maps_;
  bool last_mapped_ = false;
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
};

// Fingerprint of a call: op, dtype, reduce op, root and the low 24 bits of
// the count, packed so a mismatch can be described from the number alone.
std::uint64_t fingerprint(std::uint8_t op, DType dt, std::uint8_t rop, int root, std::size_t count);
std::string describe_fingerprint(std::uint64_t fp);

// dst[i] = dst[i] (op) src[i] for n elements (f16/bf16 through f32).
void reduce_into(void* dst, const void* src, std::size_t n, DType dt, ReduceOp op);

}  // namespace shoal::comm
