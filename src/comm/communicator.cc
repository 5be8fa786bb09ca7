#include "shoal/comm/communicator.h"

#include <poll.h>
#include <sched.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "comm/mpi_backend.h"
#include "comm/peer_checks.h"
#include "comm/reduce_internal.h"
#include "comm/rendezvous.h"
#include "shoal/comm/handshake.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/net/auth.h"

namespace shoal::comm {

namespace {

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

constexpr std::uint64_t kP2pSeq = ~std::uint64_t{0};

std::uint8_t* bytes(void* p) { return static_cast<std::uint8_t*>(p); }
const std::uint8_t* bytes(const void* p) { return static_cast<const std::uint8_t*>(p); }

Status send_msg(net::Socket& s, net::FrameType t, const std::string& payload, Deadline dl) {
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(t);
  h.length = payload.size();
  return s.send_frame(h, payload.data(), dl);
}

Result<std::string> recv_msg(net::Socket& s, net::FrameType want, std::size_t max, Deadline dl) {
  SHOAL_ASSIGN_OR_RETURN(net::FrameHeader h, s.recv_header(max, dl));
  std::string p(h.length, '\0');
  SHOAL_RETURN_IF_ERROR(s.recv_all(p.data(), p.size(), dl));
  if (h.type == static_cast<std::uint16_t>(net::FrameType::kAbort))
    return aborted("{} refused the connection: {}", s.peer(), p);
  if (h.type != static_cast<std::uint16_t>(want))
    return invalid_argument("handshake with {}: expected frame type {}, got {}", s.peer(),
                            static_cast<int>(want), h.type);
  return p;
}

}  // namespace

// ---------------------------------------------------------------- Work

Status Work::wait(Deadline dl) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_until(lk, dl.when(), [&] { return done_; }))
    return deadline_exceeded("collective did not finish before the deadline");
  return status_;
}

bool Work::test() {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

// ---------------------------------------------------------------- options / env

Result<Algorithm> parse_algorithm(const std::string& s) {
  if (s == "auto" || s.empty()) return Algorithm::kAuto;
  if (s == "ring") return Algorithm::kRing;
  if (s == "rd" || s == "recursive-doubling") return Algorithm::kRecursiveDoubling;
  if (s == "tree") return Algorithm::kTree;
  if (s == "direct") return Algorithm::kDirect;
  if (s == "hd" || s == "halving-doubling" || s == "rabenseifner")
    return Algorithm::kHalvingDoubling;
  if (s == "hier" || s == "hierarchical") return Algorithm::kHierarchical;
  return invalid_argument(
      "allreduce algorithm '{}' is not one of auto, ring, rd, tree, direct, hd, hier", s);
}

Result<CommOptions> CommOptions::from_env() {
  CommOptions o;
  SHOAL_ASSIGN_OR_RETURN(o.timeout_seconds, env::get_double("SHOAL_COMM_TIMEOUT", 300.0));
  SHOAL_ASSIGN_OR_RETURN(o.max_clock_skew,
                         env::get_double("SHOAL_MAX_CLOCK_SKEW", o.max_clock_skew));
  if (!(o.max_clock_skew >= 0))
    return invalid_argument("SHOAL_MAX_CLOCK_SKEW={} must be >= 0 seconds", o.max_clock_skew);
  SHOAL_ASSIGN_OR_RETURN(std::int64_t ring,
                         env::get_int("SHOAL_SHM_BYTES", static_cast<std::int64_t>(o.shm_bytes)));
  if (ring < 4096 || ring > (std::int64_t{1} << 30))
    return invalid_argument("SHOAL_SHM_BYTES={} must be in [4096, 1 GiB]", ring);
  o.shm_bytes = static_cast<std::size_t>(ring);
  if (auto h = env::get("SHOAL_HOST_ID")) o.host_id = *h;
  SHOAL_ASSIGN_OR_RETURN(std::int64_t cma, env::get_int("SHOAL_CMA", 1));
  o.cma = cma != 0;
  SHOAL_ASSIGN_OR_RETURN(o.map_peers, env::get_bool("SHOAL_MAP_PEERS", true));
  SHOAL_ASSIGN_OR_RETURN(double spin, env::get_double("SHOAL_SHM_SPIN_US", o.shm_spin_us));
  if (!(spin >= 0)) return invalid_argument("SHOAL_SHM_SPIN_US={} must be >= 0", spin);
  o.shm_spin_us = static_cast<long>(spin);
  if (!(o.timeout_seconds > 0))
    return invalid_argument("SHOAL_COMM_TIMEOUT={} must be > 0", o.timeout_seconds);
  if (auto a = env::get("SHOAL_ALLREDUCE_ALGO")) {
    auto alg = parse_algorithm(*a);
    if (!alg.ok()) return alg.status().with_context("SHOAL_ALLREDUCE_ALGO");
    o.allreduce = *alg;
  }
  if (auto t = env::get("SHOAL_JOB_TOKEN")) o.token = *t;
  if (auto h = env::get("SHOAL_IFACE_ADDR")) o.host = *h;
  SHOAL_ASSIGN_OR_RETURN(o.deterministic, env::get_bool("SHOAL_DETERMINISTIC", false));
  if (auto t = env::get("SHOAL_TRANSPORT")) {
    if (*t != "auto" && *t != "tcp")
      return invalid_argument("SHOAL_TRANSPORT={} is not one of auto, tcp", *t);
    o.transport = *t;
  }
  return o;
}

Result<EnvInfo> env_info() {
  EnvInfo e;
  auto pick = [&](const char* r, const char* w, const char* lr, const char* src) -> Result<bool> {
    auto rv = env::get(r);
    auto wv = env::get(w);
    if (!rv || !wv) return false;
    SHOAL_ASSIGN_OR_RETURN(std::int64_t rank, env::parse_int(*rv, r));
    SHOAL_ASSIGN_OR_RETURN(std::int64_t world, env::parse_int(*wv, w));
    if (world < 1 || rank < 0 || rank >= world)
      return invalid_argument("{}={} / {}={}: rank must be in [0, world size)", r, rank, w, world);
    e.rank = static_cast<int>(rank);
    e.world = static_cast<int>(world);
    if (lr) {
      SHOAL_ASSIGN_OR_RETURN(std::int64_t l, env::get_int(lr, 0));
      e.local_rank = static_cast<int>(l);
    }
    e.source = src;
    return true;
  };
  struct Src {
    const char *r, *w, *lr, *name;
  } srcs[] = {
      {"SHOAL_RANK", "SHOAL_WORLD_SIZE", "SHOAL_LOCAL_RANK", "SHOAL_*"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun (RANK/WORLD_SIZE)"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OpenMPI"},
      {"PMIX_RANK", "PMI_SIZE", nullptr, "PMIx"},
      {"PMI_RANK", "PMI_SIZE", nullptr, "PMI"},
      {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "Slurm"},
  };
  // A batch script's shell (sbatch -n 2) has SLURM_PROCID=0 and
  // SLURM_NTASKS=2 but is no job step: a process started there is one
  // process, not rank 0 of 2 waiting for peers that srun never started.
  const auto step = env::get("SLURM_STEP_ID");
  const bool slurm_step = step && *step != "batch" && *step != "extern" && *step != "4294967294" &&
                          *step != "4294967293";
  bool found = false;
  for (const auto& s : srcs) {
    if (std::string_view(s.name) == "Slurm" && !slurm_step) continue;
    SHOAL_ASSIGN_OR_RETURN(found, pick(s.r, s.w, s.lr, s.name));
    if (found) break;
  }
  if (!found)
    e.source = env::get("SLURM_PROCID") && !slurm_step
                   ? "none (single process: a Slurm batch shell, not a job step)"
                   : "none (single process)";
  if (auto st = env::get("SHOAL_STORE")) {
    e.store = *st;
  } else if (auto ma = env::get("MASTER_ADDR")) {
    auto mp = env::get("MASTER_PORT");
    if (!mp) return invalid_argument("MASTER_ADDR is set but MASTER_PORT is not");
    e.store = (ma->find(':') != std::string::npos ? "[" + *ma + "]" : *ma) + ":" + *mp;
  }
  return e;
}

// ---------------------------------------------------------------- set-up

Result<std::unique_ptr<Communicator>> Communicator::create(int rank, int world, net::Store& store,
                                                           CommOptions o) {
  if (world < 1 || rank < 0 || rank >= world)
    return invalid_argument("communicator: rank {} of world {} is out of range", rank, world);
  if (world > 65535) return invalid_argument("communicator: world {} > 65535", world);
  if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
  std::unique_ptr<Communicator> c(new Communicator());
  c->rank_ = rank;
  c->world_ = world;
  c->o_ = std::move(o);
  c->store_ = &store;
  if (world > 1) SHOAL_RETURN_IF_ERROR(c->connect_mesh(store));
  if (world > 1) SHOAL_RETURN_IF_ERROR(c->setup_hierarchy());
  if (world > 1 && c->o_.allreduce == Algorithm::kAuto && !c->o_.deterministic)
    SHOAL_RETURN_IF_ERROR(c->calibrate());
  c->worker_ = std::thread([p = c.get()] { p->progress_loop(); });
  return c;
}

Status Communicator::connect_mesh(net::Store& store) {
  Deadline dl = deadline();
  SHOAL_ASSIGN_OR_RETURN(net::Socket listener, net::Socket::listen(o_.host, 0));
  SHOAL_ASSIGN_OR_RETURN(int port, listener.local_port());
  SHOAL_ASSIGN_OR_RETURN(std::string host, listener.local_host());
  std::string me = host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                                       : fmt::format("{}:{}", host, port);
  const std::string& px = o_.prefix;
  // Claim the rank first: a rank started twice (a wrong SHOAL_RANK, two
  // launchers on one store) is refused by name instead of overwriting the
  // first one's address and leaving both waiting.
  char hostname[256] = {0};
  (void)gethostname(hostname, sizeof hostname - 1);
  const std::string claim = fmt::format("pid {} on {} ({})", getpid(), hostname, me);
  SHOAL_ASSIGN_OR_RETURN(std::string owner,
                         store.compare_set(fmt::format("{}/claim/{}", px, rank_), "", claim));
  if (owner != claim)
    return failed_precondition(
        "rank {} of {} is already taken by {}: is this rank started twice (SHOAL_RANK or the "
        "launcher's -n), or does the store hold an earlier job's keys?",
        rank_, world_, owner);
  SHOAL_RETURN_IF_ERROR(store.set(fmt::format("{}/addr/{}", px, rank_), me));
  peers_.resize(static_cast<std::size_t>(world_));
  hosts_.resize(static_cast<std::size_t>(world_));
  hosts_[static_cast<std::size_t>(rank_)] = me;
  // Lower ranks: we connect and prove the token second.
  for (int j = 0; j < rank_; ++j) {
    auto addr = store.get(fmt::format("{}/addr/{}", px, j), dl);
    if (!addr.ok())
      return addr.status().with_context(fmt::format("rendezvous: waiting for rank {}", j));
    hosts_[static_cast<std::size_t>(j)] = *addr;
    SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(*addr, "peer address"));
    SHOAL_ASSIGN_OR_RETURN(net::Socket s, net::Socket::connect(hp.first, hp.second, dl));
    s.set_peer(fmt::format("rank {} ({})", j, *addr));
    std::string nc = make_nonce();
    SHOAL_RETURN_IF_ERROR(send_msg(s, net::FrameType::kHello, encode_hello(rank_, world_, nc), dl));
    SHOAL_ASSIGN_OR_RETURN(std::string chb, recv_msg(s, net::FrameType::kChallenge, 256, dl));
    SHOAL_ASSIGN_OR_RETURN(Challenge ch, parse_challenge(chb, s.peer()));
    if (ch.rank != j)
      return failed_precondition("handshake: {} answered as rank {}", s.peer(), ch.rank);
    if (!proof_matches(ch.proof, make_proof(o_.token, 'S', nc, ch.nonce, rank_, j, world_)))
      return failed_precondition(
          "handshake: {} does not hold this job's token (SHOAL_JOB_TOKEN differs)", s.peer());
    SHOAL_RETURN_IF_ERROR(send_msg(s, net::FrameType::kProof,
                                   make_proof(o_.token, 'C', nc, ch.nonce, rank_, j, world_), dl));
    SHOAL_RETURN_IF_ERROR(recv_msg(s, net::FrameType::kProof, 0, dl).status());
    peers_[static_cast<std::size_t>(j)] = std::move(s);
  }
  // Higher ranks connect to us.
  for (int got = 0; got < world_ - 1 - rank_; ++got) {
    auto acc = listener.accept(dl);
    if (!acc.ok())
      return acc.status().with_context(fmt::format(
          "rendezvous: rank {} waited for {} higher ranks to connect", rank_, world_ - 1 - rank_));
    net::Socket s = std::move(acc).value();
    std::string from = s.peer();
    SHOAL_ASSIGN_OR_RETURN(std::string hb, recv_msg(s, net::FrameType::kHello, 64, dl));
    SHOAL_ASSIGN_OR_RETURN(Hello hello, parse_hello(hb, from));
    int r = hello.rank;
    if (hello.world != world_ || r <= rank_ || peers_[static_cast<std::size_t>(r)].valid()) {
      (void)send_msg(s, net::FrameType::kAbort, "bad rank or world size", dl);
      return failed_precondition(
          "handshake from {}: claims rank {} of world {}, expected a "
          "rank in ({}, {}) of world {}",
          from, r, hello.world, rank_, world_, world_);
    }
    std::string ns = make_nonce();
    SHOAL_RETURN_IF_ERROR(send_msg(
        s, net::FrameType::kChallenge,
        encode_challenge(rank_, ns, make_proof(o_.token, 'S', hello.nonce, ns, r, rank_, world_)),
        dl));
    SHOAL_ASSIGN_OR_RETURN(std::string pr, recv_msg(s, net::FrameType::kProof, 64, dl));
    if (!proof_matches(pr, make_proof(o_.token, 'C', hello.nonce, ns, r, rank_, world_))) {
      (void)send_msg(s, net::FrameType::kAbort, "wrong job token", dl);
      return failed_precondition(
          "handshake: connection from {} claiming rank {} failed the job-token proof "
          "(SHOAL_JOB_TOKEN differs)",
          from, r);
    }
    SHOAL_RETURN_IF_ERROR(send_msg(s, net::FrameType::kProof, "", dl));
    auto addr = store.get(fmt::format("{}/addr/{}", px, r), dl);
    hosts_[static_cast<std::size_t>(r)] = addr.ok() ? *addr : from;
    s.set_peer(fmt::format("rank {} ({})", r, hosts_[static_cast<std::size_t>(r)]));
    peers_[static_cast<std::size_t>(r)] = std::move(s);
  }
  if (o_.is_world)  // once per job
    SHOAL_RETURN_IF_ERROR(check_clocks(rank_, world_, peers_, o_.max_clock_skew, dl));
  return setup_shm(store, dl);
}

// Pairs on one host also get a shared-memory channel; their TCP connection
// stays for fault detection (a closed socket is how a death is noticed).
Status Communicator::setup_shm(net::Store& store, Deadline dl) {
  shm_.resize(static_cast<std::size_t>(world_));
  const std::string& px = o_.prefix;
  std::string me = o_.host_id.empty() ? net::host_identity() : o_.host_id;
  SHOAL_RETURN_IF_ERROR(store.set(fmt::format("{}/host/{}", px, rank_), me));
  host_of_.assign(static_cast<std::size_t>(world_), me);
  std::vector<bool> local(static_cast<std::size_t>(world_), false);
  for (int j = 0; j < world_; ++j) {
    if (j == rank_) continue;
    SHOAL_ASSIGN_OR_RETURN(std::string h, store.get(fmt::format("{}/host/{}", px, j), dl));
    host_of_[static_cast<std::size_t>(j)] = h;
    local[static_cast<std::size_t>(j)] = h == me;
  }
  // `shoal run`'s local engine puts every rank on this host (unless the
  // user fakes hosts with SHOAL_HOST_ID).
  auto lws = env::get("SHOAL_LOCAL_WORLD_SIZE");
  SHOAL_RETURN_IF_ERROR(check_one_host(
      rank_, host_of_, o_.is_world && o_.host_id.empty() && lws && *lws == std::to_string(world_)));
  if (o_.transport == "tcp") return ok_status();
  for (int j = rank_ + 1; j < world_; ++j) {  // lower rank creates
    if (!local[static_cast<std::size_t>(j)]) continue;
    auto ch = net::ShmChannel::create(o_.shm_bytes);
    if (!ch.ok()) return ch.status().with_context(fmt::format("shared memory with rank {}", j));
    SHOAL_RETURN_IF_ERROR(store.set(fmt::format("{}/shm/{}/{}", px, rank_, j), (*ch)->name()));
    shm_[static_cast<std::size_t>(j)] = std::move(ch).value();
  }
  for (int j = 0; j < rank_; ++j) {
    if (!local[static_cast<std::size_t>(j)]) continue;
    SHOAL_ASSIGN_OR_RETURN(std::string name,
                           store.get(fmt::format("{}/shm/{}/{}", px, j, rank_), dl));
    auto ch = net::ShmChannel::open(name);
    if (!ch.ok()) return ch.status().with_context(fmt::format("shared memory with rank {}", j));
    shm_[static_cast<std::size_t>(j)] = std::move(ch).value();
    SHOAL_RETURN_IF_ERROR(store.set(fmt::format("{}/shm/{}/{}/ok", px, j, rank_), "1"));
  }
  for (int j = rank_ + 1; j < world_; ++j) {
    if (!shm_[static_cast<std::size_t>(j)]) continue;
    SHOAL_RETURN_IF_ERROR(store.get(fmt::format("{}/shm/{}/{}/ok", px, rank_, j), dl).status());
    shm_[static_cast<std::size_t>(j)]->unlink();  // both mapped: nothing left to leak
  }
  return probe_cma(store, dl);
}

// Direct reads need every peer on this host and the kernel's permission
// (same user, no seccomp or Yama rule against it): each rank reads every
// peer's probe word, and the algorithm is used only if all ranks could.
Status Communicator::probe_cma(net::Store& store, Deadline dl) {
  const std::string& px = o_.prefix;
  bool all_local = true;
  for (int j = 0; j < world_; ++j) all_local = all_local && (j == rank_ || is_shm(j));
  if (!o_.cma || !all_local) return ok_status();
  SHOAL_RETURN_IF_ERROR(
      store.set(fmt::format("{}/cma/{}", px, rank_),
                fmt::format("{} {}", getpid(), reinterpret_cast<std::uintptr_t>(&cma_probe_))));
  cma_pid_.assign(static_cast<std::size_t>(world_), -1);
  bool ok = true;
  for (int j = 0; j < world_ && ok; ++j) {
    if (j == rank_) continue;
    SHOAL_ASSIGN_OR_RETURN(std::string v, store.get(fmt::format("{}/cma/{}", px, j), dl));
    long long pid = 0;
    unsigned long long addr = 0;
    if (std::sscanf(v.c_str(), "%lld %llu", &pid, &addr) != 2) {
      ok = false;
      break;
    }
    std::uint64_t got = 0;
    iovec local{&got, sizeof got}, remote{reinterpret_cast<void*>(addr), sizeof got};
    // Read the word, then write the same value back: both directions are used.
    ok = process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) ==
             static_cast<ssize_t>(sizeof got) &&
         got == cma_probe_ &&
         process_vm_writev(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) ==
             static_cast<ssize_t>(sizeof got);
    cma_pid_[static_cast<std::size_t>(j)] = static_cast<int>(pid);
  }
  SHOAL_RETURN_IF_ERROR(store.set(fmt::format("{}/cma_ok/{}", px, rank_), ok ? "1" : "0"));
  for (int j = 0; j < world_; ++j) {
    if (j == rank_) continue;
    SHOAL_ASSIGN_OR_RETURN(std::string v, store.get(fmt::format("{}/cma_ok/{}", px, j), dl));
    ok = ok && v == "1";
  }
  cma_ = ok;
  return ok_status();
}

Result<std::unique_ptr<Communicator>> Communicator::wrap_mpi(std::unique_ptr<MpiBackend> b,
                                                             CommOptions o) {
  std::unique_ptr<Communicator> c(new Communicator());
  c->rank_ = b->rank();
  c->world_ = b->size();
  c->o_ = std::move(o);
  c->mpi_ = std::move(b);
  c->last_algo_ = "mpi";
  c->worker_ = std::thread([p = c.get()] { p->progress_loop(); });
  return c;
}

Result<std::unique_ptr<Communicator>> Communicator::from_env() {
  SHOAL_ASSIGN_OR_RETURN(CommOptions o, CommOptions::from_env());
  if (auto be = env::get("SHOAL_COMM_BACKEND"); be && *be != "native") {
    if (*be != "mpi")
      return invalid_argument("SHOAL_COMM_BACKEND={} is not one of native, mpi", *be);
    // An MPI library from another implementation than the launcher's
    // (OpenMPI's libmpi under MPICH's Hydra) starts as a world of one in
    // every process: N independent jobs in one run directory. The
    // launcher's own variables (read before MPI_Init adds its own) say
    // what the world should be.
    SHOAL_ASSIGN_OR_RETURN(EnvInfo e, env_info());
    SHOAL_ASSIGN_OR_RETURN(auto b, MpiBackend::init());
    log::set_identity(b->rank(), b->size(), "comm");
    if (e.world != b->size() || (e.world > 1 && e.rank != b->rank()))
      return failed_precondition(
          "SHOAL_COMM_BACKEND=mpi: MPI says rank {} of {}, but the launcher ({}) says rank {} "
          "of {}: is the MPI library ({}) the one of the launcher that started this process "
          "(mpirun.openmpi for OpenMPI, mpirun.mpich for MPICH)?",
          b->rank(), b->size(), e.source, e.rank, e.world, MpiBackend::library());
    return wrap_mpi(std::move(b), o);
  }
  SHOAL_ASSIGN_OR_RETURN(EnvInfo e, env_info());
  log::set_identity(e.rank, e.world, "comm");
  if (e.world > 1 && o.token.empty() && e.rank == 0)
    SHOAL_LOG_WARN(
        "no job token (SHOAL_JOB_TOKEN): the rendezvous store and the connections between ranks "
        "are unauthenticated, so any process that reaches their ports can join or read them; "
        "`shoal run` sets one, or export the same secret on every rank");
  Rendezvous rv;
  if (e.world > 1) {
    SHOAL_ASSIGN_OR_RETURN(rv, open_rendezvous(e, o));
  } else {
    rv.store = std::make_unique<net::FileStore>("/nonexistent");  // world 1: never used
  }
  SHOAL_ASSIGN_OR_RETURN(auto c, create(e.rank, e.world, *rv.store, o));
  c->own_store_ = std::move(rv.server);
  c->own_client_ = std::move(rv.store);
  return c;
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // Tell peers this close is a clean shutdown, not a death.
  for (auto& p : peers_) {
    if (!p.valid()) continue;
    net::FrameHeader h;
    h.type = static_cast<std::uint16_t>(net::FrameType::kGoodbye);
    (void)p.send_frame(h, nullptr, Deadline::after(std::chrono::milliseconds(200)));
  }
}

// ---------------------------------------------------------------- progress thread

namespace {
// The communicator whose call this thread is running (nested calls, e.g. an
// async wrapper calling the blocking form, run directly).
thread_local const Communicator* tl_running = nullptr;
}  // namespace

Status Communicator::run_one(const std::function<Status()>& fn) {
  const Communicator* outer = tl_running;
  tl_running = this;
  Status st = aborted_ ? abort_status_ : fn();
  tl_running = outer;
  if (!st.ok() && !aborted_) {  // later calls fail fast; peers learn why
    aborted_ = true;
    abort_status_ = st;
    abort_peers(st);
  }
  return st;
}

// A blocking call runs on the caller's thread when nothing is queued or
// running (saves two thread hand-offs per call); otherwise it queues
// behind the async work so the order of calls is kept.
Status Communicator::run_blocking(std::function<Status()> fn) {
  if (tl_running == this) return fn();
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (queue_.empty() && !busy_) {
      busy_ = true;
      lk.unlock();
      Status st = run_one(fn);
      lk.lock();
      busy_ = false;
      // Wake the progress thread only if work was queued meanwhile: a
      // needless wake-up costs it two context switches per call, and on a
      // busy host it takes the core from the ranks.
      const bool queued = !queue_.empty();
      lk.unlock();
      if (queued) cv_.notify_all();
      return st;
    }
  }
  return submit(std::move(fn))->wait(deadline());
}

void Communicator::progress_loop() {
  while (true) {
    std::pair<std::function<Status()>, WorkPtr> item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    item.second->started_ = std::chrono::steady_clock::now();
    Status st = run_one(item.first);
    item.second->finished_ = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_ = false;
    }
    cv_.notify_all();
    {
      std::lock_guard<std::mutex> lk(item.second->mu_);
      item.second->done_ = true;
      item.second->status_ = st;
    }
    item.second->cv_.notify_all();
  }
}

WorkPtr Communicator::submit(std::function<Status()> fn) {
  auto w = std::make_shared<Work>();
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.emplace_back(std::move(fn), w);
  }
  cv_.notify_all();
  return w;
}

void Communicator::abort_peers(const Status& why) {
  std::string msg = fmt::format("rank {} aborted: {}", rank_, why.message());
  for (auto& p : peers_) {
    if (!p.valid()) continue;
    net::FrameHeader h;
    h.type = static_cast<std::uint16_t>(net::FrameType::kAbort);
    h.length = msg.size();
    (void)p.send_frame(h, msg.data(), Deadline::after(std::chrono::milliseconds(200)));
  }
}

// ---------------------------------------------------------------- transport

// Runs sends and receives on several peers at once, polling every other
// peer too: an abort frame or a closed connection there fails the call
// at once instead of at the deadline.
namespace {
// Reduces bounce[0, n) (after the xfer's carried partial element) into the
// xfer's buffer; keeps a trailing partial element for next time.
void absorb(Communicator::Xfer& x, std::uint8_t* bounce, std::size_t n) {
  const std::size_t es = dtype_size(x.dt);
  std::size_t total = x.carry + n, whole = total - total % es;
  reduce_into(static_cast<std::uint8_t*>(x.buf) + x.applied, bounce, whole / es, x.dt, x.op);
  x.applied += whole;
  x.carry = total - whole;
  std::memcpy(x.carry_bytes, bounce + whole, x.carry);
}
}  // namespace

// The text of an abort frame whose header has been read, from where the
// header came: the peer's shared-memory ring or its socket (bounded: 1 MiB).
std::string Communicator::abort_message(int peer, std::uint64_t length, bool from_ring,
                                        Deadline dl) {
  std::string m(std::min<std::uint64_t>(length, 1 << 20), '\0');
  if (from_ring) {
    std::size_t got = 0;
    for (int spin = 0; got < m.size() && spin < 1000000 && !dl.expired(); ++spin)
      got += shm_[static_cast<std::size_t>(peer)]->rx().read_some(m.data() + got, m.size() - got);
    m.resize(got);
  } else {
    (void)peers_[static_cast<std::size_t>(peer)].recv_all(m.data(), m.size(), dl);
  }
  return m;
}

Status Communicator::exchange(std::vector<Xfer>& xs, std::uint64_t fp, const char* what) {
  const std::uint64_t wseq = static_cast<std::uint8_t>(fp) == kSendRecv ? kP2pSeq : seq_;
  Deadline dl = deadline();
  for (auto& x : xs) {
    x.done = 0;
    x.header_done = false;
    x.applied = x.carry = 0;
    if (x.is_send) {
      net::FrameHeader h;
      h.type = static_cast<std::uint16_t>(net::FrameType::kData);
      h.length = x.bytes;
      h.seq = wseq;
      h.fingerprint = fp;
      net::encode_header(h, x.hdr);
    }
  }
  std::vector<bool> watch(static_cast<std::size_t>(world_), true);
  watch[static_cast<std::size_t>(rank_)] = false;
  for (auto& x : xs)
    if (!is_shm(x.peer)) watch[static_cast<std::size_t>(x.peer)] = false;
  auto fail_peer = [&](int peer, const std::string& why) {
    return unavailable("{} #{}: {} {}", what, seq_, peers_[static_cast<std::size_t>(peer)].peer(),
                       why);
  };
  // A received header: abort, goodbye, or the data frame this call expects.
  auto check_header = [&](Xfer& x) -> Status {
    net::Socket& s = peers_[static_cast<std::size_t>(x.peer)];
    auto h = net::decode_header(x.hdr, net::kMaxFrame, s.peer());
    if (!h.ok()) return h.status().with_context(fmt::format("{} #{}", what, seq_));
    if (h->type == static_cast<std::uint16_t>(net::FrameType::kAbort))
      return aborted("{} #{}: {}", what, seq_,
                     abort_message(x.peer, h->length, is_shm(x.peer), dl));
    if (h->type == static_cast<std::uint16_t>(net::FrameType::kGoodbye))
      return fail_peer(x.peer,
                       "shut down its communicator while this rank still waits for it "
                       "(the ranks' call sequences differ)");
    if (h->type != static_cast<std::uint16_t>(net::FrameType::kData))
      return fail_peer(x.peer, fmt::format("sent frame type {} during a collective", h->type));
    if (h->fingerprint != fp || h->seq != wseq)
      return failed_precondition("collective mismatch: rank {} called {} #{}, but {} called {} #{}",
                                 rank_, describe_fingerprint(fp),
                                 wseq == kP2pSeq ? std::string("p2p") : std::to_string(wseq),
                                 s.peer(), describe_fingerprint(h->fingerprint),
                                 h->seq == kP2pSeq ? std::string("p2p") : std::to_string(h->seq));
    if (h->length != x.bytes)
      return failed_precondition("{} #{}: {} sent {} bytes, this rank expects {}", what, seq_,
                                 s.peer(), h->length, x.bytes);
    return ok_status();
  };
  std::vector<pollfd> fds;
  std::vector<int> who;  // index into xs, or -1 - peer for watched ones
  std::vector<bool> gone(static_cast<std::size_t>(world_), false);
  int idle = 0;
  auto idle_since = std::chrono::steady_clock::now();
  while (true) {
    // Shared-memory transfers: copy what the rings allow, no system call.
    bool shm_pending = false, progressed = false;
    for (auto& x : xs) {
      if (!is_shm(x.peer) || x.done == x.bytes + net::kHeaderBytes) continue;
      net::ShmChannel& ch = *shm_[static_cast<std::size_t>(x.peer)];
      x.bell = (x.is_send ? ch.tx() : ch.rx()).bell();
      while (x.done < x.bytes + net::kHeaderBytes) {
        std::size_t n;
        bool in_hdr = x.done < net::kHeaderBytes;
        if (x.is_send) {
          n = in_hdr ? ch.tx().write_some(x.hdr + x.done, net::kHeaderBytes - x.done)
                     : ch.tx().write_some(bytes(x.buf) + (x.done - net::kHeaderBytes),
                                          x.bytes + net::kHeaderBytes - x.done);
        } else if (in_hdr) {
          n = ch.rx().read_some(x.hdr + x.done, net::kHeaderBytes - x.done);
        } else if (x.reduce) {
          std::memcpy(bounce_.data(), x.carry_bytes, x.carry);
          n = ch.rx().read_some(bounce_.data() + x.carry,
                                std::min(bounce_.size() - 8, x.bytes + net::kHeaderBytes - x.done));
          if (n) absorb(x, bounce_.data(), n);
        } else {
          n = ch.rx().read_some(bytes(x.buf) + (x.done - net::kHeaderBytes),
                                x.bytes + net::kHeaderBytes - x.done);
        }
        if (n == 0) break;
        progressed = true;
        x.done += n;
        if (!x.is_send && in_hdr && x.done == net::kHeaderBytes)
          SHOAL_RETURN_IF_ERROR(check_header(x));
      }
      if (x.done < x.bytes + net::kHeaderBytes) {
        if (gone[static_cast<std::size_t>(x.peer)] && !progressed)
          return fail_peer(x.peer,
                           "shut down its communicator while this rank still waits for "
                           "it (the ranks' call sequences differ)");
        shm_pending = true;
      }
    }
    fds.clear();
    who.clear();
    bool sock_pending = false;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const Xfer& x = xs[i];
      if (is_shm(x.peer) || x.done == x.bytes + net::kHeaderBytes) continue;
      sock_pending = true;
      fds.push_back({peers_[static_cast<std::size_t>(x.peer)].fd(),
                     static_cast<short>(x.is_send ? POLLOUT : POLLIN), 0});
      who.push_back(static_cast<int>(i));
    }
    if (!sock_pending && !shm_pending) return ok_status();
    idle = progressed ? 0 : idle + 1;
    if (idle <= 1) idle_since = std::chrono::steady_clock::now();
    if (shm_pending && !sock_pending && idle < 64) continue;  // spin briefly on the rings
    for (int p = 0; p < world_; ++p)
      if (watch[static_cast<std::size_t>(p)]) {
        fds.push_back({peers_[static_cast<std::size_t>(p)].fd(), POLLIN, 0});
        who.push_back(-1 - p);
      }
    int ms = static_cast<int>(std::min<long long>(dl.remaining().count(), 1000));
    bool nap = false;
    if (shm_pending) {
      ms = 0;
      // Nothing moved for a while: sleep on a ring's doorbell (below) instead
      // of spinning, so the peer (or this rank's compute) gets the core.
      nap = !sock_pending && std::chrono::steady_clock::now() - idle_since >
                                 std::chrono::microseconds(o_.shm_spin_us);
      // Until then, offer the core to any other runnable rank (ranks
      // outnumbering cores): returns at once when there is none.
      if (!nap) sched_yield();
    }
    int rc = ::poll(fds.data(), fds.size(), ms);
    if (rc < 0 && errno != EINTR) return unavailable("poll: {}", std::strerror(errno));
    if (rc <= 0) {
      if (dl.expired()) {
        // Name the ranks that went silent: a frozen (stopped, swapping,
        // livelocked) peer keeps its connection open, so only time tells.
        std::string waiting, silent;
        std::vector<bool> named(static_cast<std::size_t>(world_), false);
        for (const auto& x : xs) {
          if (x.done >= x.bytes + net::kHeaderBytes) continue;
          waiting += fmt::format("{}{} {}", waiting.empty() ? "" : ", ",
                                 x.is_send ? "sending to" : "receiving from",
                                 peers_[static_cast<std::size_t>(x.peer)].peer());
          if (named[static_cast<std::size_t>(x.peer)]) continue;
          named[static_cast<std::size_t>(x.peer)] = true;
          silent += fmt::format("{}rank {}", silent.empty() ? "" : ", ", x.peer);
        }
        return deadline_exceeded(
            "{} #{}: {} unresponsive: timed out after {:.0f} s {} (SHOAL_COMM_TIMEOUT)", what, seq_,
            silent, o_.timeout_seconds, waiting);
      }
      if (nap) {
        // A pending receive's ring first: its peer's next write wakes us.
        const Xfer* z = nullptr;
        for (const auto& x : xs) {
          if (!is_shm(x.peer) || x.done == x.bytes + net::kHeaderBytes) continue;
          if (z == nullptr || (z->is_send && !x.is_send)) z = &x;
        }
        if (z != nullptr) {
          net::ShmChannel& ch = *shm_[static_cast<std::size_t>(z->peer)];
          // Bounded, so dead or aborting peers (sockets) are still noticed.
          (z->is_send ? ch.tx() : ch.rx()).sleep(z->bell, 2000);
        }
      }
      continue;
    }
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      if (who[k] < 0) {  // a watched peer: abort frame, or closed?
        int p = -1 - who[k];
        std::uint8_t hb[net::kHeaderBytes];
        ssize_t n = ::recv(fds[k].fd, hb, sizeof hb, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return fail_peer(p, "closed the connection (process died?)");
        if (n == static_cast<ssize_t>(sizeof hb)) {
          auto h = net::decode_header(hb, 1 << 20, peers_[static_cast<std::size_t>(p)].peer());
          bool involved = std::any_of(xs.begin(), xs.end(), [&](const Xfer& x) {
            return x.peer == p && x.done < x.bytes + net::kHeaderBytes;
          });
          // A shared-memory peer that said goodbye may still have left our data
          // in the ring: fail only once its ring stops moving (below).
          if (h.ok() && involved && h->type == static_cast<std::uint16_t>(net::FrameType::kGoodbye))
            gone[static_cast<std::size_t>(p)] = true;
          if (h.ok() && h->type == static_cast<std::uint16_t>(net::FrameType::kAbort)) {
            (void)peers_[static_cast<std::size_t>(p)].recv_all(hb, sizeof hb, dl);  // peeked
            return aborted("{} #{}: {}", what, seq_, abort_message(p, h->length, false, dl));
          }
        }
        // Data for a later step, or a clean goodbye: leave it for whoever reads it.
        watch[static_cast<std::size_t>(p)] = false;
        continue;
      }
      Xfer& x = xs[static_cast<std::size_t>(who[k])];
      net::Socket& s = peers_[static_cast<std::size_t>(x.peer)];
      if (x.is_send) {
        iovec iov[2];
        int cnt = 0;
        if (x.done < net::kHeaderBytes) {
          iov[cnt++] = {x.hdr + x.done, net::kHeaderBytes - x.done};
          iov[cnt++] = {x.buf, x.bytes};
        } else {
          std::size_t off = x.done - net::kHeaderBytes;
          iov[cnt++] = {bytes(x.buf) + off, x.bytes - off};
        }
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = static_cast<std::size_t>(cnt);
        ssize_t n = ::sendmsg(s.fd(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
          return fail_peer(x.peer, fmt::format("send failed: {}", std::strerror(errno)));
        }
        x.done += static_cast<std::size_t>(n);
        continue;
      }
      // Receive: the header first, checked, then the payload in place.
      if (x.done < net::kHeaderBytes) {
        ssize_t n = ::recv(s.fd(), x.hdr + x.done, net::kHeaderBytes - x.done, MSG_DONTWAIT);
        if (n == 0) return fail_peer(x.peer, "closed the connection (process died?)");
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
          return fail_peer(x.peer, fmt::format("receive failed: {}", std::strerror(errno)));
        }
        x.done += static_cast<std::size_t>(n);
        if (x.done < net::kHeaderBytes) continue;
        SHOAL_RETURN_IF_ERROR(check_header(x));
        if (x.bytes > 0) continue;
      }
      std::size_t off = x.done - net::kHeaderBytes;
      if (off == x.bytes) continue;
      if (x.reduce) std::memcpy(bounce_.data(), x.carry_bytes, x.carry);
      ssize_t n = x.reduce ? ::recv(s.fd(), bounce_.data() + x.carry,
                                    std::min(bounce_.size() - 8, x.bytes - off), MSG_DONTWAIT)
                           : ::recv(s.fd(), bytes(x.buf) + off, x.bytes - off, MSG_DONTWAIT);
      if (n == 0) return fail_peer(x.peer, "closed the connection (process died?)");
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return fail_peer(x.peer, fmt::format("receive failed: {}", std::strerror(errno)));
      }
      if (x.reduce) absorb(x, bounce_.data(), static_cast<std::size_t>(n));
      x.done += static_cast<std::size_t>(n);
    }
  }
}

Status Communicator::sendrecv(int to, const void* s, std::size_t sb, int from, void* r,
                              std::size_t rb, std::uint64_t fp, const char* what) {
  std::vector<Xfer> xs;
  xs.push_back(Xfer{to, true, const_cast<void*>(s), sb, 0, false, {}});
  xs.push_back(Xfer{from, false, r, rb, 0, false, {}});
  return exchange(xs, fp, what);
}

Status Communicator::send_to(int to, const void* s, std::size_t sb, std::uint64_t fp,
                             const char* what) {
  std::vector<Xfer> xs{Xfer{to, true, const_cast<void*>(s), sb, 0, false, {}}};
  return exchange(xs, fp, what);
}

Status Communicator::recv_from(int from, void* r, std::size_t rb, std::uint64_t fp,
                               const char* what) {
  std::vector<Xfer> xs{Xfer{from, false, r, rb, 0, false, {}}};
  return exchange(xs, fp, what);
}

// ---------------------------------------------------------------- algorithms

namespace {

// Block i of `count` split in `n` nearly equal parts.
std::size_t block_begin(std::size_t count, int n, int i) {
  std::size_t q = count / static_cast<std::size_t>(n), r = count % static_cast<std::size_t>(n);
  auto ui = static_cast<std::size_t>(i);
  return ui * q + std::min(ui, r);
}
}  // namespace

Status Communicator::ring_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op,
                                    std::uint64_t fp) {
  const int n = world_;
  const std::size_t es = dtype_size(dt);
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    counts[static_cast<std::size_t>(i)] = block_begin(count, n, i + 1) - block_begin(count, n, i);
  const int right = (rank_ + 1) % n, left = (rank_ - 1 + n) % n;
  auto* base = bytes(buf);
  auto blk = [&](int i) { return base + block_begin(count, n, (i % n + n) % n) * es; };
  auto cnt = [&](int i) { return counts[static_cast<std::size_t>((i % n + n) % n)]; };
  // Reduce-scatter: after n-1 steps this rank holds block `rank` reduced.
  for (int s = 0; s < n - 1; ++s) {
    int sb = rank_ - s - 1, rb = rank_ - s - 2;
    // The incoming block is reduced into ours as it arrives (no scratch pass).
    std::vector<Xfer> xs;
    xs.push_back(Xfer{right, true, blk(sb), cnt(sb) * es, 0, false, {}});
    Xfer in{left, false, blk(rb), cnt(rb) * es, 0, false, {}};
    in.reduce = true;
    in.dt = dt;
    in.op = op;
    xs.push_back(in);
    SHOAL_RETURN_IF_ERROR(exchange(xs, fp, "allreduce (ring)"));
  }
  // Allgather of the reduced blocks.
  for (int s = 0; s < n - 1; ++s) {
    int sb = rank_ - s, rb = rank_ - s - 1;
    SHOAL_RETURN_IF_ERROR(sendrecv(right, blk(sb), cnt(sb) * es, left, blk(rb), cnt(rb) * es, fp,
                                   "allreduce (ring)"));
  }
  return ok_status();
}

// Recursive doubling (MPICH's non-power-of-two fold): log2(n) exchanges of
// the whole buffer; best for small messages.
// MPICH's fold for non-powers of two: of the first 2*rem ranks (rem = n -
// the largest power of two p2 <= n), each even one hands its buffer to the
// odd one above it and sits the middle phase out. Returns this rank's place
// among the p2 that stay, or -1; fold_out gives the result back.
Result<int> Communicator::fold_in(void* buf, std::size_t count, DType dt, ReduceOp op,
                                  std::uint64_t fp, const char* what) {
  const std::size_t bytes_n = count * dtype_size(dt);
  const int rem = world_ - fold_p2();
  scratch_.resize(bytes_n);
  if (rank_ >= 2 * rem) return rank_ - rem;
  if (rank_ % 2 == 0) {
    SHOAL_RETURN_IF_ERROR(send_to(rank_ + 1, buf, bytes_n, fp, what));
    return -1;
  }
  SHOAL_RETURN_IF_ERROR(recv_from(rank_ - 1, scratch_.data(), bytes_n, fp, what));
  reduce_into(buf, scratch_.data(), count, dt, op);
  return rank_ / 2;
}

Status Communicator::fold_out(void* buf, std::size_t bytes_n, std::uint64_t fp, const char* what) {
  const int rem = world_ - fold_p2();
  if (rank_ >= 2 * rem) return ok_status();
  if (rank_ % 2 == 1) return send_to(rank_ - 1, buf, bytes_n, fp, what);
  return recv_from(rank_ + 1, buf, bytes_n, fp, what);
}

int Communicator::fold_p2() const {
  int p2 = 1;
  while (p2 * 2 <= world_) p2 *= 2;
  return p2;
}

// The real rank of place `nr` among the p2 ranks that stay after fold_in.
int Communicator::fold_rank(int nr) const {
  const int rem = world_ - fold_p2();
  return nr < rem ? nr * 2 + 1 : nr + rem;
}

Status Communicator::rd_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op,
                                  std::uint64_t fp) {
  const char* what = "allreduce (rd)";
  const std::size_t bytes_n = count * dtype_size(dt);
  SHOAL_ASSIGN_OR_RETURN(const int newrank, fold_in(buf, count, dt, op, fp, what));
  if (newrank >= 0) {
    for (int mask = 1; mask < fold_p2(); mask <<= 1) {
      const int dst = fold_rank(newrank ^ mask);
      SHOAL_RETURN_IF_ERROR(sendrecv(dst, buf, bytes_n, dst, scratch_.data(), bytes_n, fp, what));
      // Lower rank's data first: every rank then computes the same bits.
      if (dst < rank_) {  // theirs (op) mine, computed in scratch, then copied back
        reduce_into(scratch_.data(), buf, count, dt, op);
        std::memcpy(buf, scratch_.data(), bytes_n);
      } else {
        reduce_into(buf, scratch_.data(), count, dt, op);
      }
    }
  }
  return fold_out(buf, bytes_n, fp, what);
}

Status Communicator::exchange_all(const void* mine, std::size_t bytes, void* theirs,
                                  std::uint64_t fp, const char* what) {
  std::vector<Xfer> xs;
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    xs.push_back(Xfer{q, true, const_cast<void*>(mine), bytes, 0, false, {}});
    xs.push_back(
        Xfer{q, false, static_cast<std::uint8_t*>(theirs) + q * bytes, bytes, 0, false, {}});
  }
  return exchange(xs, fp, what);
}

Status Communicator::cma_copy(int peer, std::uint64_t remote, void* local, std::size_t bytes,
                              bool to_peer, const char* what) {
  auto* mine = static_cast<std::uint8_t*>(local);
  const pid_t pid = cma_pid_[static_cast<std::size_t>(peer)];
  while (bytes > 0) {
    iovec l{mine, bytes}, r{reinterpret_cast<void*>(remote), bytes};
    ssize_t n =
        to_peer ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return unavailable("{} #{}: {} the buffer of {}: {}", what, seq_,
                         to_peer ? "writing" : "reading",
                         peers_[static_cast<std::size_t>(peer)].peer(),
                         n < 0 && errno == ESRCH ? "the process is gone (died?)"
                                                 : std::strerror(n < 0 ? errno : EIO));
    }
    mine += n;
    remote += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  return ok_status();
}

int Communicator::local_size() const {
  if (mpi_) return mpi_->local_size();
  if (host_of_.empty()) return 1;  // world 1
  return static_cast<int>(
      std::count(host_of_.begin(), host_of_.end(), host_of_[static_cast<std::size_t>(rank_)]));
}

Result<std::shared_ptr<net::SharedRegion>> Communicator::allocate_shared(std::size_t bytes) {
  return net::SharedRegion::create(bytes);
}

namespace {
constexpr std::size_t kMaxMappingsPerPeer = 16;
}

net::PeerMapping* Communicator::peer_mapping(int peer, const net::SharedRef& ref) {
  const auto key = std::make_pair(peer, ref.id);
  auto it = peer_maps_.find(key);
  if (it != peer_maps_.end()) return it->second.get();
  // Regions of one executable live as long as it does; a job that keeps
  // making new ones (re-compiles) should not pile up mappings, which keep
  // the peer's pages alive. Only this peer's oldest goes: ids count up per
  // process, so they compare within a peer only, and a call maps one region
  // per peer, so no mapping this call uses is dropped.
  const auto first = peer_maps_.lower_bound({peer, 0});  // ordered by (peer, id)
  std::size_t mine = 0;
  for (auto j = first; j != peer_maps_.end() && j->first.first == peer; ++j) ++mine;
  if (mine >= kMaxMappingsPerPeer) peer_maps_.erase(first);
  auto m = net::PeerMapping::open(cma_pid_[static_cast<std::size_t>(peer)], ref);
  if (!m.ok())
    SHOAL_LOG_WARN(
        "cannot map the shared buffer of {} ({}); its all-reduces copy through "
        "process_vm_readv instead",
        peers_[static_cast<std::size_t>(peer)].peer(), m.status().message());
  net::PeerMapping* got = m.ok() ? m->get() : nullptr;
  peer_maps_[key] = m.ok() ? std::move(*m) : nullptr;
  return got;
}

// Direct all-reduce between ranks on one host: every rank publishes its
// buffer's address; rank r reduces its 1/N of the elements by reading that
// part of every peer's buffer into its own, and writes each finished piece
// straight into every peer's buffer; a barrier ends the call once all parts
// are everywhere. A peer's buffer in shared memory (allocate_shared) is
// mapped once and read and written with plain loads and stores; any other
// is copied through process_vm_readv/writev, in 256 KiB pieces that stay
// in cache. One copy per byte moved instead of two through a ring (none
// when mapped), and no rank waits for a descheduled peer to push data,
// which matters when ranks outnumber cores. Each part is reduced by one
// rank in a fixed order (its owner's values, then the others by rank), so
// all ranks get the same bits, run after run, whichever way they reach
// their peers.
Status Communicator::direct_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op,
                                      std::uint64_t fp) {
  const char* what = "allreduce (direct)";
  const std::size_t es = dtype_size(dt), n = static_cast<std::size_t>(world_);
  struct Addr {
    std::uint64_t addr, bytes;
    net::SharedRef shared;  // id 0: private memory
  };
  Addr mine{reinterpret_cast<std::uintptr_t>(buf), count * es, {}};
  if (o_.map_peers)
    if (auto r = net::find_shared(buf, count * es)) mine.shared = *r;
  std::vector<Addr> theirs(n);
  SHOAL_RETURN_IF_ERROR(exchange_all(&mine, sizeof mine, theirs.data(), fp, what));
  // Where each peer's buffer is mapped here (null: copy through CMA).
  std::vector<std::uint8_t*> mapped(n, nullptr);
  last_mapped_ = true;
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    const Addr& a = theirs[static_cast<std::size_t>(q)];
    if (a.bytes != mine.bytes)
      return failed_precondition("{} #{}: {} has {} bytes, this rank {}", what, seq_,
                                 peers_[static_cast<std::size_t>(q)].peer(), a.bytes, mine.bytes);
    const net::SharedRef& r = a.shared;
    if (r.id != 0 && r.offset <= r.region_bytes && a.bytes <= r.region_bytes - r.offset)
      if (net::PeerMapping* m = peer_mapping(q, r))
        mapped[static_cast<std::size_t>(q)] = m->data() + r.offset;
    last_mapped_ = last_mapped_ && mapped[static_cast<std::size_t>(q)] != nullptr;
  }
  auto lo = [&](int r) { return count * static_cast<std::size_t>(r) / n * es; };
  const std::size_t piece = bounce_.size() / 8 * 8;
  auto* base = static_cast<std::uint8_t*>(buf);
  for (std::size_t off = lo(rank_); off < lo(rank_ + 1); off += piece) {
    const std::size_t len = std::min(piece, lo(rank_ + 1) - off);
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      const std::uint8_t* src = mapped[static_cast<std::size_t>(q)];
      if (src != nullptr) {
        src += off;
      } else {
        SHOAL_RETURN_IF_ERROR(cma_copy(q, theirs[static_cast<std::size_t>(q)].addr + off,
                                       bounce_.data(), len, false, what));
        src = bounce_.data();
      }
      reduce_into(base + off, src, len / es, dt, op);
    }
    // Average while the piece is in cache (do_allreduce skips its pass).
    if (op == ReduceOp::kAvg) divide_by_size(base + off, len / es, dt, world_);
    // The piece is final: put it into every peer's buffer too (nobody else
    // reads or writes that range of theirs).
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      if (std::uint8_t* dst = mapped[static_cast<std::size_t>(q)]) {
        std::memcpy(dst + off, base + off, len);
      } else {
        SHOAL_RETURN_IF_ERROR(cma_copy(q, theirs[static_cast<std::size_t>(q)].addr + off,
                                       base + off, len, true, what));
      }
    }
  }
  // Every part written everywhere. Plain stores into a peer's mapping are
  // ordered before this barrier's ring write (release) or socket send.
  std::vector<std::uint8_t> flags(n);
  std::uint8_t one = 1;
  return exchange_all(&one, 1, flags.data(), fp, what);
}

// Recursive halving-doubling (Rabenseifner): a reduce-scatter by recursive
// halving (log2 p exchanges of n/2, n/4, ... bytes) then an allgather by
// recursive doubling in reverse; the ring's bandwidth with log2 p instead
// of p - 1 latencies. Non-powers of two fold the extra ranks in first, as
// rd_allreduce does. Each element is reduced once (in the middle phase,
// lower rank's value first), so every rank gets the same bits.
Status Communicator::hd_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op,
                                  std::uint64_t fp) {
  const char* what = "allreduce (halving-doubling)";
  const std::size_t es = dtype_size(dt), bytes_n = count * es;
  auto* base = bytes(buf);
  const int p2 = fold_p2();
  SHOAL_ASSIGN_OR_RETURN(const int newrank, fold_in(buf, count, dt, op, fp, what));
  if (newrank >= 0) {
    struct Level {
      int peer;
      std::size_t keep_lo, keep_hi, give_lo, give_hi;  // element ranges
    };
    std::vector<Level> levels;
    std::size_t lo = 0, hi = count;
    for (int mask = p2 / 2; mask >= 1; mask /= 2) {
      const int peer = fold_rank(newrank ^ mask);
      const std::size_t mid = lo + (hi - lo) / 2;
      Level l{peer, lo, mid, mid, hi};
      if (newrank & mask) l = Level{peer, mid, hi, lo, mid};
      const std::size_t kb = (l.keep_hi - l.keep_lo) * es;
      SHOAL_RETURN_IF_ERROR(sendrecv(peer, base + l.give_lo * es, (l.give_hi - l.give_lo) * es,
                                     peer, scratch_.data(), kb, fp, what));
      std::uint8_t* mine = base + l.keep_lo * es;
      if (peer < rank_) {  // theirs (op) mine
        reduce_into(scratch_.data(), mine, l.keep_hi - l.keep_lo, dt, op);
        if (kb) std::memcpy(mine, scratch_.data(), kb);
      } else {
        reduce_into(mine, scratch_.data(), l.keep_hi - l.keep_lo, dt, op);
      }
      levels.push_back(l);
      lo = l.keep_lo;
      hi = l.keep_hi;
    }
    for (auto it = levels.rbegin(); it != levels.rend(); ++it)
      SHOAL_RETURN_IF_ERROR(
          sendrecv(it->peer, base + it->keep_lo * es, (it->keep_hi - it->keep_lo) * es, it->peer,
                   base + it->give_lo * es, (it->give_hi - it->give_lo) * es, fp, what));
  }
  return fold_out(buf, bytes_n, fp, what);
}

// The two-level layout, made once at start-up (split is collective): used
// when the job spans several hosts and some host runs several ranks.
Status Communicator::setup_hierarchy() {
  std::vector<std::string> hosts;  // in order of first rank
  for (const auto& h : host_of_)
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  if (hosts.size() < 2 || hosts.size() == static_cast<std::size_t>(world_)) return ok_status();
  const int host = static_cast<int>(
      std::find(hosts.begin(), hosts.end(), host_of_[static_cast<std::size_t>(rank_)]) -
      hosts.begin());
  bool leader = true;
  for (int r = 0; r < rank_; ++r)
    leader = leader &&
             host_of_[static_cast<std::size_t>(r)] != host_of_[static_cast<std::size_t>(rank_)];
  SHOAL_ASSIGN_OR_RETURN(local_, split(host, rank_));
  SHOAL_ASSIGN_OR_RETURN(leaders_, split(leader ? 0 : -1, rank_));
  return ok_status();
}

// Two levels: reduce to the host's leader over shared memory, all-reduce
// among the leaders (across hosts, TCP), broadcast back within the host.
// Only the leaders' traffic crosses the network: n bytes per host instead
// of per rank.
Status Communicator::hier_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op) {
  const ReduceOp inner = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  SHOAL_RETURN_IF_ERROR(
      local_->reduce(buf, buf, count, dt, inner, 0)
          .with_context(fmt::format("allreduce (hierarchical) #{}, within the host", seq_)));
  if (leaders_)
    SHOAL_RETURN_IF_ERROR(
        leaders_->allreduce(buf, buf, count, dt, inner)
            .with_context(fmt::format("allreduce (hierarchical) #{}, across hosts", seq_)));
  return local_->broadcast(buf, count, dt, 0)
      .with_context(fmt::format("allreduce (hierarchical) #{}, within the host", seq_));
}

// α-β calibration: time small and 1 MiB exchanges around the ring, take
// the max over ranks (every rank must pick the same algorithm), and fit
// t(n) = α + β n per message.
Status Communicator::calibrate() {
  const int right = (rank_ + 1) % world_, left = (rank_ - 1 + world_) % world_;
  std::vector<std::uint8_t> out(1 << 20, 1), in(1 << 20);
  auto timed = [&](std::size_t bytes, int rounds) -> Result<double> {
    ++seq_;
    auto fp = fingerprint(kBarrier, DType::kU8, 1, -1, bytes);
    SHOAL_RETURN_IF_ERROR(
        sendrecv(right, out.data(), bytes, left, in.data(), bytes, fp, "calibrate"));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      ++seq_;
      SHOAL_RETURN_IF_ERROR(
          sendrecv(right, out.data(), bytes, left, in.data(), bytes, fp, "calibrate"));
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / rounds;
  };
  SHOAL_ASSIGN_OR_RETURN(double small, timed(8, 50));
  SHOAL_ASSIGN_OR_RETURN(double big, timed(1 << 20, 4));
  double v[2] = {small, std::max(big - small, 1e-12) / (1 << 20)};
  Algorithm keep = o_.allreduce;
  o_.allreduce = Algorithm::kRecursiveDoubling;
  Status st = do_allreduce(v, v, 2, DType::kF64, ReduceOp::kMax);
  o_.allreduce = keep;
  SHOAL_RETURN_IF_ERROR(st);
  alpha_ = v[0];
  beta_ = v[1];
  return ok_status();
}

Algorithm Communicator::choose_allreduce(std::size_t bytes) const {
  const double p = world_, n = static_cast<double>(bytes);
  if (alpha_ <= 0)  // not calibrated (SHOAL_DETERMINISTIC=1): fixed threshold
    return bytes <= o_.small_bytes ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
  // Up to 16 KiB the cost is messages, not bytes: fewest messages wins. (The
  // model's per-byte term, fitted on 1 MiB exchanges, overstates the cost of
  // reducing a few cached KiB; with a noisy calibration it once chose the
  // ring at 4 KiB, 2.8 us against recursive doubling's 1.6.)
  if (bytes <= 16 << 10) return Algorithm::kRecursiveDoubling;
  int p2 = 1, lg = 0;
  while (p2 * 2 <= world_) p2 *= 2, ++lg;
  // Recursive doubling moves the whole buffer each step and reduces from a
  // scratch copy (a second pass over n bytes); the ring reduces on arrival.
  const double fold = p2 != world_ ? 2 * (alpha_ + n * beta_) : 0;
  double rd = (lg + (p2 != world_ ? 2 : 0)) * (alpha_ + 2 * n * beta_);
  double ring = 2 * (p - 1) * (alpha_ + n / p * beta_);
  // Halving-doubling: the ring's bytes in 2 log2(p) messages (same as the
  // ring at p = 2, where the ring's streaming reduction wins the tie).
  double hd = 2 * lg * alpha_ + 2 * (p2 - 1.0) / p2 * n * beta_ + fold;
  if (rd <= ring && rd <= hd) return Algorithm::kRecursiveDoubling;
  return hd < ring ? Algorithm::kHalvingDoubling : Algorithm::kRing;
}

Status Communicator::do_allreduce(const void* send, void* recv, std::size_t count, DType dt,
                                  ReduceOp op) {
  ++seq_;
  const std::uint64_t fp = fingerprint(kAllreduce, dt, static_cast<std::uint8_t>(op), -1, count);
  if (send != recv && count > 0) std::memcpy(recv, send, count * dtype_size(dt));
  if (world_ == 1 || count == 0) {
    last_algo_ = "local";
    // Still exchange nothing; ranks agree trivially.
    return ok_status();
  }
  if (dt == DType::kF16 || dt == DType::kBF16) {  // accumulate in f32
    std::vector<float> tmp = widen_half(recv, count, dt);
    --seq_;
    SHOAL_RETURN_IF_ERROR(do_allreduce(tmp.data(), tmp.data(), count, DType::kF32, op));
    narrow_half(tmp, recv, dt);
    return ok_status();
  }
  Algorithm a = o_.allreduce;
  if (a == Algorithm::kDirect && !cma_) a = Algorithm::kRing;  // not available: the next best
  // Measured crossovers (bench comm): 64 KiB at 2 ranks, 256 KiB at 4.
  const std::size_t direct_from =
      o_.direct_bytes ? o_.direct_bytes : (world_ == 2 ? std::size_t{64} << 10 : 256 << 10);
  if (a == Algorithm::kAuto && local_ && count * dtype_size(dt) >= o_.small_bytes)
    a = Algorithm::kHierarchical;
  if (a == Algorithm::kAuto && cma_ && count * dtype_size(dt) >= direct_from)
    a = Algorithm::kDirect;
  if (a == Algorithm::kAuto || a == Algorithm::kTree)
    a = count < static_cast<std::size_t>(world_) ? Algorithm::kRecursiveDoubling
                                                 : choose_allreduce(count * dtype_size(dt));
  if (a == Algorithm::kHierarchical && !local_) a = choose_allreduce(count * dtype_size(dt));
  Status st;
  if (a == Algorithm::kHierarchical) {
    last_algo_ = "hierarchical";
    SHOAL_RETURN_IF_ERROR(hier_allreduce(recv, count, dt, op));
  } else if (a == Algorithm::kDirect) {
    last_algo_ = "direct";
    st = direct_allreduce(recv, count, dt, op, fp);
  } else if (a == Algorithm::kHalvingDoubling) {
    last_algo_ = "halving-doubling";
    st = hd_allreduce(recv, count, dt, op, fp);
  } else if (a == Algorithm::kRing && count >= static_cast<std::size_t>(world_)) {
    last_algo_ = "ring";
    st = ring_allreduce(recv, count, dt, op, fp);
  } else {
    last_algo_ = "recursive-doubling";
    st = rd_allreduce(recv, count, dt, op, fp);
  }
  SHOAL_RETURN_IF_ERROR(st);
  if (op == ReduceOp::kAvg && a != Algorithm::kDirect) divide_by_size(recv, count, dt, world_);
  return ok_status();
}

Status Communicator::do_reduce(const void* send, void* recv, std::size_t count, DType dt,
                               ReduceOp op, int root, std::uint64_t fp) {
  const std::size_t nb = count * dtype_size(dt);
  const int n = world_, vr = (rank_ - root + n) % n;
  std::vector<std::uint8_t> acc(bytes(send), bytes(send) + nb), tmp(nb);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      SHOAL_RETURN_IF_ERROR(send_to((vr - mask + root) % n, acc.data(), nb, fp, "reduce"));
      break;
    }
    if (vr + mask < n) {
      SHOAL_RETURN_IF_ERROR(recv_from((vr + mask + root) % n, tmp.data(), nb, fp, "reduce"));
      reduce_into(acc.data(), tmp.data(), count, dt, op);
    }
  }
  if (rank_ == root) {
    if (nb) std::memcpy(recv, acc.data(), nb);
    if (op == ReduceOp::kAvg) divide_by_size(recv, count, dt, world_);
  }
  return ok_status();
}

Status Communicator::do_broadcast(void* buf, std::size_t nb, int root, std::uint64_t fp) {
  const int n = world_, vr = (rank_ - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      SHOAL_RETURN_IF_ERROR(recv_from((vr - mask + root) % n, buf, nb, fp, "broadcast"));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n)
      SHOAL_RETURN_IF_ERROR(send_to((vr + mask + root) % n, buf, nb, fp, "broadcast"));
  return ok_status();
}

Status Communicator::do_allgatherv(const void* send, void* recv,
                                   const std::vector<std::size_t>& counts, DType dt,
                                   std::uint64_t fp) {
  const int n = world_;
  const std::size_t es = dtype_size(dt);
  std::vector<std::size_t> off(static_cast<std::size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i)
    off[static_cast<std::size_t>(i) + 1] =
        off[static_cast<std::size_t>(i)] + counts[static_cast<std::size_t>(i)];
  auto* base = bytes(recv);
  auto idx = [&](int i) { return static_cast<std::size_t>((i % n + n) % n); };
  std::size_t mine = counts[static_cast<std::size_t>(rank_)] * es;
  if (mine && base + off[static_cast<std::size_t>(rank_)] * es != bytes(send))
    std::memmove(base + off[static_cast<std::size_t>(rank_)] * es, send, mine);
  const int right = (rank_ + 1) % n, left = (rank_ - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    std::size_t sb = idx(rank_ - s), rb = idx(rank_ - s - 1);
    SHOAL_RETURN_IF_ERROR(sendrecv(right, base + off[sb] * es, counts[sb] * es, left,
                                   base + off[rb] * es, counts[rb] * es, fp, "allgather"));
  }
  return ok_status();
}

Status Communicator::do_reduce_scatter(const void* send, void* recv,
                                       const std::vector<std::size_t>& counts, DType dt,
                                       ReduceOp op, std::uint64_t fp) {
  const int n = world_;
  const std::size_t es = dtype_size(dt);
  std::vector<std::size_t> off(static_cast<std::size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i)
    off[static_cast<std::size_t>(i) + 1] =
        off[static_cast<std::size_t>(i)] + counts[static_cast<std::size_t>(i)];
  std::vector<std::uint8_t> work(bytes(send), bytes(send) + off.back() * es);
  std::size_t maxc = *std::max_element(counts.begin(), counts.end());
  std::vector<std::uint8_t> tmp(maxc * es);
  auto idx = [&](int i) { return static_cast<std::size_t>((i % n + n) % n); };
  const int right = (rank_ + 1) % n, left = (rank_ - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    std::size_t sb = idx(rank_ - s - 1), rb = idx(rank_ - s - 2);
    SHOAL_RETURN_IF_ERROR(sendrecv(right, work.data() + off[sb] * es, counts[sb] * es, left,
                                   tmp.data(), counts[rb] * es, fp, "reduce_scatter"));
    reduce_into(work.data() + off[rb] * es, tmp.data(), counts[rb], dt, op);
  }
  auto me = static_cast<std::size_t>(rank_);
  if (counts[me]) std::memcpy(recv, work.data() + off[me] * es, counts[me] * es);
  if (op == ReduceOp::kAvg) divide_by_size(recv, counts[me], dt, world_);
  return ok_status();
}

// ---------------------------------------------------------------- public calls

namespace {}  // namespace

WorkPtr Communicator::allreduce_async(const void* send, void* recv, std::size_t count, DType dt,
                                      ReduceOp op) {
  if (mpi_) return submit([=, this] { return mpi_->allreduce(send, recv, count, dt, op); });
  return submit([=, this] { return do_allreduce(send, recv, count, dt, op); });
}

Status Communicator::allreduce(const void* send, void* recv, std::size_t count, DType dt,
                               ReduceOp op) {
  if (mpi_) return run_blocking([=, this] { return mpi_->allreduce(send, recv, count, dt, op); });
  return run_blocking([=, this] { return do_allreduce(send, recv, count, dt, op); });
}

Status Communicator::reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op,
                            int root) {
  if (root < 0 || root >= world_) return invalid_argument("reduce: root {} out of range", root);
  if (mpi_)
    return run_blocking([=, this] { return mpi_->reduce(send, recv, count, dt, op, root); });
  return run_blocking([=, this] {
    ++seq_;
    auto fp = fingerprint(kReduce, dt, static_cast<std::uint8_t>(op), root, count);
    if (dt == DType::kF16 || dt == DType::kBF16) {
      // f32 accumulation: widen, reduce, narrow.
      std::vector<float> a = widen_half(send, count, dt), b(count);
      SHOAL_RETURN_IF_ERROR(do_reduce(a.data(), b.data(), count, DType::kF32, op, root, fp));
      if (rank_ == root) narrow_half(b, recv, dt);
      return ok_status();
    }
    return do_reduce(send, recv, count, dt, op, root, fp);
  });
}

Status Communicator::broadcast(void* buf, std::size_t count, DType dt, int root) {
  if (root < 0 || root >= world_) return invalid_argument("broadcast: root {} out of range", root);
  if (mpi_) return run_blocking([=, this] { return mpi_->broadcast(buf, count, dt, root); });
  return run_blocking([=, this] {
    ++seq_;
    return do_broadcast(buf, count * dtype_size(dt), root,
                        fingerprint(kBroadcast, dt, 0, root, count));
  });
}

Status Communicator::allgather(const void* send, void* recv, std::size_t count, DType dt) {
  return allgatherv(send, recv, std::vector<std::size_t>(static_cast<std::size_t>(world_), count),
                    dt);
}

Status Communicator::allgatherv(const void* send, void* recv,
                                const std::vector<std::size_t>& counts, DType dt) {
  if (counts.size() != static_cast<std::size_t>(world_))
    return invalid_argument("allgatherv: {} counts for {} ranks", counts.size(), world_);
  if (mpi_) return run_blocking([=, this] { return mpi_->allgatherv(send, recv, counts, dt); });
  return run_blocking([=, this] {
    ++seq_;
    std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    return do_allgatherv(send, recv, counts, dt, fingerprint(kAllgather, dt, 0, -1, total));
  });
}

Status Communicator::reduce_scatter(const void* send, void* recv,
                                    const std::vector<std::size_t>& counts, DType dt, ReduceOp op) {
  if (counts.size() != static_cast<std::size_t>(world_))
    return invalid_argument("reduce_scatter: {} counts for {} ranks", counts.size(), world_);
  if (mpi_)
    return run_blocking([=, this] { return mpi_->reduce_scatter(send, recv, counts, dt, op); });
  return run_blocking([=, this]() -> Status {
    ++seq_;
    std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    auto fp = fingerprint(kReduceScatter, dt, static_cast<std::uint8_t>(op), -1, total);
    if (dt == DType::kF16 || dt == DType::kBF16) {
      std::vector<float> a = widen_half(send, total, dt),
                         b(counts[static_cast<std::size_t>(rank_)]);
      SHOAL_RETURN_IF_ERROR(do_reduce_scatter(a.data(), b.data(), counts, DType::kF32, op, fp));
      narrow_half(b, recv, dt);
      return ok_status();
    }
    return do_reduce_scatter(send, recv, counts, dt, op, fp);
  });
}

Status Communicator::gather(const void* send, void* recv, std::size_t count, DType dt, int root) {
  if (root < 0 || root >= world_) return invalid_argument("gather: root {} out of range", root);
  if (mpi_) return run_blocking([=, this] { return mpi_->gather(send, recv, count, dt, root); });
  return run_blocking([=, this]() -> Status {
    ++seq_;
    auto fp = fingerprint(kGather, dt, 0, root, count);
    const std::size_t nb = count * dtype_size(dt);
    if (rank_ != root) return send_to(root, send, nb, fp, "gather");
    std::vector<Xfer> xs;
    for (int r = 0; r < world_; ++r)
      if (r != root) xs.push_back(Xfer{r, false, bytes(recv) + r * nb, nb, 0, false, {}});
    if (nb && bytes(recv) + root * nb != bytes(send))
      std::memmove(bytes(recv) + root * nb, send, nb);
    return exchange(xs, fp, "gather");
  });
}

Status Communicator::scatter(const void* send, void* recv, std::size_t count, DType dt, int root) {
  if (root < 0 || root >= world_) return invalid_argument("scatter: root {} out of range", root);
  if (mpi_) return run_blocking([=, this] { return mpi_->scatter(send, recv, count, dt, root); });
  return run_blocking([=, this]() -> Status {
    ++seq_;
    auto fp = fingerprint(kScatter, dt, 0, root, count);
    const std::size_t nb = count * dtype_size(dt);
    if (rank_ != root) return recv_from(root, recv, nb, fp, "scatter");
    std::vector<Xfer> xs;
    for (int r = 0; r < world_; ++r)
      if (r != root)
        xs.push_back(
            Xfer{r, true, const_cast<std::uint8_t*>(bytes(send)) + r * nb, nb, 0, false, {}});
    if (nb && bytes(send) + root * nb != bytes(recv))
      std::memmove(recv, bytes(send) + root * nb, nb);
    return exchange(xs, fp, "scatter");
  });
}

Status Communicator::all_to_all(const void* send, void* recv, std::size_t count, DType dt) {
  std::vector<std::size_t> c(static_cast<std::size_t>(world_), count);
  return all_to_allv(send, c, recv, c, dt);
}

Status Communicator::all_to_allv(const void* send, const std::vector<std::size_t>& sc, void* recv,
                                 const std::vector<std::size_t>& rc, DType dt) {
  if (sc.size() != static_cast<std::size_t>(world_) || rc.size() != sc.size())
    return invalid_argument("all_to_allv: counts must have {} entries", world_);
  if (mpi_) return run_blocking([=, this] { return mpi_->all_to_allv(send, sc, recv, rc, dt); });
  return run_blocking([=, this]() -> Status {
    ++seq_;
    const std::size_t es = dtype_size(dt);
    std::vector<std::size_t> so(sc.size() + 1, 0), ro(rc.size() + 1, 0);
    for (std::size_t i = 0; i < sc.size(); ++i) {
      so[i + 1] = so[i] + sc[i];
      ro[i + 1] = ro[i] + rc[i];
    }
    // The fingerprint carries this rank's receive total; each pair's
    // sizes are checked by the frame length.
    auto fp = fingerprint(kAllToAll, dt, 0, -1, 0);
    auto me = static_cast<std::size_t>(rank_);
    if (rc[me] != sc[me])
      return invalid_argument("all_to_allv: sends {} to itself but expects {}", sc[me], rc[me]);
    if (sc[me]) std::memmove(bytes(recv) + ro[me] * es, bytes(send) + so[me] * es, sc[me] * es);
    for (int k = 1; k < world_; ++k) {  // pairwise exchange
      auto to = static_cast<std::size_t>((rank_ + k) % world_);
      auto from = static_cast<std::size_t>((rank_ - k + world_) % world_);
      SHOAL_RETURN_IF_ERROR(sendrecv(static_cast<int>(to), bytes(send) + so[to] * es, sc[to] * es,
                                     static_cast<int>(from), bytes(recv) + ro[from] * es,
                                     rc[from] * es, fp, "all_to_all"));
    }
    return ok_status();
  });
}

Status Communicator::barrier() {
  if (mpi_) return run_blocking([=, this] { return mpi_->barrier(); });
  return run_blocking([this]() -> Status {
    ++seq_;
    auto fp = fingerprint(kBarrier, DType::kU8, 0, -1, 0);
    for (int k = 1; k < world_; k <<= 1)  // dissemination
      SHOAL_RETURN_IF_ERROR(sendrecv((rank_ + k) % world_, nullptr, 0,
                                     (rank_ - k + world_) % world_, nullptr, 0, fp, "barrier"));
    return ok_status();
  });
}

Status Communicator::send(const void* buf, std::size_t count, DType dt, int dst, int tag) {
  if (dst < 0 || dst >= world_ || dst == rank_)
    return invalid_argument("send: destination {} is not another rank of {}", dst, world_);
  if (mpi_) return run_blocking([=, this] { return mpi_->send(buf, count, dt, dst, tag); });
  return run_blocking([=, this] {
    return send_to(dst, buf, count * dtype_size(dt), fingerprint(kSendRecv, dt, 0, tag, count),
                   "send");
  });
}

Status Communicator::recv(void* buf, std::size_t count, DType dt, int src, int tag) {
  if (src < 0 || src >= world_ || src == rank_)
    return invalid_argument("recv: source {} is not another rank of {}", src, world_);
  if (mpi_) return run_blocking([=, this] { return mpi_->recv(buf, count, dt, src, tag); });
  return run_blocking([=, this] {
    return recv_from(src, buf, count * dtype_size(dt), fingerprint(kSendRecv, dt, 0, tag, count),
                     "recv");
  });
}

Result<std::unique_ptr<Communicator>> Communicator::split(int color, int key) {
  if (mpi_) {
    std::unique_ptr<MpiBackend> b;
    SHOAL_RETURN_IF_ERROR(run_blocking([&]() -> Status {
      SHOAL_ASSIGN_OR_RETURN(b, mpi_->split(color, key));
      return ok_status();
    }));
    if (!b) return std::unique_ptr<Communicator>();
    return wrap_mpi(std::move(b), o_);
  }
  if (store_ == nullptr) return failed_precondition("split: communicator has no store");
  std::vector<std::int64_t> mine = {color, key}, all(2 * static_cast<std::size_t>(world_));
  SHOAL_RETURN_IF_ERROR(allgather(mine.data(), all.data(), 2, DType::kI64));
  const std::uint64_t gen = seq_;
  if (color < 0) return std::unique_ptr<Communicator>();
  std::vector<std::pair<std::int64_t, int>> members;  // (key, old rank)
  for (int r = 0; r < world_; ++r)
    if (all[2 * static_cast<std::size_t>(r)] == color)
      members.push_back({all[2 * static_cast<std::size_t>(r) + 1], r});
  std::sort(members.begin(), members.end());
  int newrank = 0;
  for (std::size_t i = 0; i < members.size(); ++i)
    if (members[i].second == rank_) newrank = static_cast<int>(i);
  CommOptions o = o_;
  o.prefix = fmt::format("{}/split{}/{}", o_.prefix, gen, color);
  o.is_world = false;
  return create(newrank, static_cast<int>(members.size()), *store_, o);
}

}  // namespace shoal::comm

namespace shoal::comm {
const char* Communicator::backend() const { return mpi_ ? "mpi" : "native"; }
}  // namespace shoal::comm

namespace shoal::comm {
// Async forms: the blocking call, queued. Buffers must stay valid until wait().
WorkPtr Communicator::reduce_async(const void* send, void* recv, std::size_t count, DType dt,
                                   ReduceOp op, int root) {
  return submit([=, this] { return reduce(send, recv, count, dt, op, root); });
}
WorkPtr Communicator::broadcast_async(void* buf, std::size_t count, DType dt, int root) {
  return submit([=, this] { return broadcast(buf, count, dt, root); });
}
WorkPtr Communicator::allgather_async(const void* send, void* recv, std::size_t count, DType dt) {
  return submit([=, this] { return allgather(send, recv, count, dt); });
}
WorkPtr Communicator::allgatherv_async(const void* send, void* recv,
                                       std::vector<std::size_t> counts, DType dt) {
  return submit([=, this] { return allgatherv(send, recv, counts, dt); });
}
WorkPtr Communicator::reduce_scatter_async(const void* send, void* recv,
                                           std::vector<std::size_t> counts, DType dt, ReduceOp op) {
  return submit([=, this] { return reduce_scatter(send, recv, counts, dt, op); });
}
WorkPtr Communicator::gather_async(const void* send, void* recv, std::size_t count, DType dt,
                                   int root) {
  return submit([=, this] { return gather(send, recv, count, dt, root); });
}
WorkPtr Communicator::scatter_async(const void* send, void* recv, std::size_t count, DType dt,
                                    int root) {
  return submit([=, this] { return scatter(send, recv, count, dt, root); });
}
WorkPtr Communicator::all_to_all_async(const void* send, void* recv, std::size_t count, DType dt) {
  return submit([=, this] { return all_to_all(send, recv, count, dt); });
}
WorkPtr Communicator::barrier_async() {
  return submit([this] { return barrier(); });
}
WorkPtr Communicator::send_async(const void* buf, std::size_t count, DType dt, int dst, int tag) {
  return submit([=, this] { return send(buf, count, dt, dst, tag); });
}
WorkPtr Communicator::recv_async(void* buf, std::size_t count, DType dt, int src, int tag) {
  return submit([=, this] { return recv(buf, count, dt, src, tag); });
}
}  // namespace shoal::comm
