// The transport under a communicator (Gloo's split of transport from
// algorithms): the authenticated connections to every peer, shared-memory
// rings to the peers on this host, their mapped buffers and cross-memory
// copies, and framed sends and receives with deadlines, sequence numbers,
// call fingerprints and abort frames. The all-reduce algorithms
// (comm/algorithms.h) are free functions over a Mesh; Communicator is the
// public front (queue, tuner, MPI). The parameter server reuses the same
// framing. Private to comm. Not thread-safe: one call at a time (the
// communicator serializes them).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shoal/comm/communicator.h"
#include "shoal/net/shared_memory.h"
#include "shoal/net/shm.h"
#include "shoal/net/socket.h"
#include "shoal/net/store.h"

namespace shoal::comm {

// Call kinds, the first byte of a call's fingerprint.
enum Op : std::uint8_t {
  kAllreduce = 1,
  kReduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kGather,
  kScatter,
  kAllToAll,
  kBarrier,
  kSendRecv,
  kSplit
};

// Point-to-point frames carry this instead of the call sequence number.
inline constexpr std::uint64_t kP2pSeq = ~std::uint64_t{0};

inline std::uint8_t* bytes(void* p) { return static_cast<std::uint8_t*>(p); }
inline const std::uint8_t* bytes(const void* p) { return static_cast<const std::uint8_t*>(p); }

// One transfer in an exchange.
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

class Mesh {
 public:
  // Connects rank `rank` of `world` with every other through `store`:
  // claims the rank, publishes its address, proves the job token both ways
  // (net/auth.h), checks clocks and hosts (peer_checks.h), then opens
  // shared-memory rings and probes cross-memory attach between ranks of
  // one host. A world of one connects nothing.
  static Result<std::unique_ptr<Mesh>> connect(int rank, int world, net::Store& store,
                                               const CommOptions& o);
  ~Mesh();  // tells the peers this close is a clean shutdown
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return world_; }
  const CommOptions& options() const { return o_; }
  Deadline deadline() const { return Deadline::after_seconds(o_.timeout_seconds); }
  // Each rank's host identity (ranks with equal ones share memory).
  const std::vector<std::string>& host_of() const { return host_of_; }
  bool is_shm(int peer) const {
    return !shm_.empty() && shm_[static_cast<std::size_t>(peer)] != nullptr;
  }
  // Whether cross-memory attach works with every peer (all on this host).
  bool cma() const { return cma_; }
  const std::string& peer_name(int peer) const {
    return peers_[static_cast<std::size_t>(peer)].peer();
  }

  // The sequence number of the current call, carried by its frames; the
  // front advances it once per collective.
  std::uint64_t seq = 0;
  // Whether the last direct all-reduce reached every peer through a mapping.
  bool last_mapped = false;
  // Payload bytes this rank has sent to its peers, over sockets and rings.
  std::uint64_t bytes_sent = 0;
  // Per-call work buffers of the algorithms (grown on demand, kept).
  std::vector<std::uint8_t> scratch;
  // The ring reduce-scatter's blocks, apart from `scratch`: fold_in sizes
  // that to each call, so sharing it would re-zero the grown part each time.
  std::vector<std::uint8_t> ring_blocks;
  std::vector<std::uint8_t> bounce = std::vector<std::uint8_t>(256 << 10);

  // Runs sends and receives on several peers at once, polling every other
  // peer too: an abort frame or a closed connection there fails the call
  // at once instead of at the deadline. `fp` is the call's fingerprint.
  Status exchange(std::vector<Xfer>& xs, std::uint64_t fp, const char* what);
  Status sendrecv(int to, const void* s, std::size_t sb, int from, void* r, std::size_t rb,
                  std::uint64_t fp, const char* what);
  Status send_to(int to, const void* s, std::size_t sb, std::uint64_t fp, const char* what);
  Status recv_from(int from, void* r, std::size_t rb, std::uint64_t fp, const char* what);
  // Sends `bytes` of `mine` to every peer and receives each peer's into
  // theirs + peer * bytes, all at once.
  Status exchange_all(const void* mine, std::size_t bytes, void* theirs, std::uint64_t fp,
                      const char* what);
  // Tells every peer why this rank gave up (an abort frame, best effort).
  void abort_peers(const Status& why);
  // Shuts every peer connection down from another thread: a call waiting
  // in exchange() sees its peers close and fails at once (an elastic job's
  // watchdog ends the step in flight this way instead of exiting).
  void cut();

  // MPICH's fold for non-powers of two (recursive doubling and halving-
  // doubling): see mesh.cc.
  Result<int> fold_in(void* buf, std::size_t count, DType dt, ReduceOp op, std::uint64_t fp,
                      const char* what);
  Status fold_out(void* buf, std::size_t bytes_n, std::uint64_t fp, const char* what);
  int fold_p2() const;
  int fold_rank(int nr) const;

  // The peer's region `ref` mapped here, opened on first use and kept (up
  // to 16 per peer); nullptr when it cannot be mapped (then the caller
  // copies through CMA; the failure is logged once and remembered).
  net::PeerMapping* peer_mapping(int peer, const net::SharedRef& ref);
  // Copies between `local` and `remote` in a peer's address space (to_peer:
  // local -> remote), through process_vm_readv/writev.
  Status cma_copy(int peer, std::uint64_t remote, void* local, std::size_t bytes, bool to_peer,
                  const char* what);

 private:
  Mesh() = default;
  Status connect_mesh(net::Store& store);
  Status accept_peer(net::Socket s, net::Store& store, Deadline dl);
  // How long an accepted connection has to complete its handshake: a real
  // rank sends its hello at once; a silent prober is dropped after this.
  static constexpr int kHelloMs = 5000;
  Status setup_shm(net::Store& store, Deadline dl);
  Status probe_cma(net::Store& store, Deadline dl);
  std::string abort_message(int peer, std::uint64_t length, bool from_ring, Deadline dl);
  // exchange()'s phases (mesh_exchange.cc), over one call's state.
  struct Exchange;
  void arm(Exchange& e);
  Status pump_shm(Exchange& e, bool& progressed, bool& pending);
  bool poll_set(Exchange& e);
  Status on_watched(Exchange& e, int peer);
  Status on_writable(Exchange& e, Xfer& x);
  Status on_readable(Exchange& e, Xfer& x);
  Status check_header(const Exchange& e, Xfer& x);
  Status fail_peer(const Exchange& e, int peer, const std::string& why) const;
  Status timed_out(const Exchange& e) const;
  void nap_on_ring(const Exchange& e);

  int rank_ = 0, world_ = 1;
  CommOptions o_;
  std::vector<net::Socket> peers_;                     // peers_[r] for r != rank_
  std::vector<std::string> hosts_;                     // listening address of each rank
  std::vector<std::unique_ptr<net::ShmChannel>> shm_;  // same-host peers
  std::vector<int> cma_pid_;  // process ids of the peers, when direct reads work with all
  bool cma_ = false;
  std::vector<std::string> host_of_;
  std::uint64_t cma_probe_ = 0x414d434c414f4853ull;  // "SHOALCMA", read by peers' probes
  // Peers' shared regions mapped here, by (peer, region id); null = refused.
  std::map<std::pair<int, std::uint64_t>, std::unique_ptr<net::PeerMapping>> peer_maps_;
};

}  // namespace shoal::comm
