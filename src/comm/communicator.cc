#include "shoal/comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "comm/mesh.h"
#include "comm/mpi_backend.h"
#include "comm/reduce_internal.h"
#include "comm/rendezvous.h"
#include "comm/tuner.h"
#include "comm/watchdog.h"
#include "shoal/core/env.h"
#include "shoal/core/launch_env.h"
#include "shoal/core/logging.h"
#include "shoal/net/interfaces.h"

namespace shoal::comm {

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
  for (auto [name, us] : {std::pair{"SHOAL_SHM_SPIN_US", &o.shm_spin_us},
                          std::pair{"SHOAL_SOCKET_SPIN_US", &o.socket_spin_us}}) {
    SHOAL_ASSIGN_OR_RETURN(double spin, env::get_double(name, static_cast<double>(*us)));
    if (!(spin >= 0)) return invalid_argument("{}={} must be >= 0", name, spin);
    *us = static_cast<long>(spin);
  }
  SHOAL_ASSIGN_OR_RETURN(o.connect_seconds, env::get_double("SHOAL_CONNECT_TIMEOUT", 0.0));
  if (!(o.connect_seconds >= 0))
    return invalid_argument("SHOAL_CONNECT_TIMEOUT={} must be >= 0", o.connect_seconds);
  if (!(o.timeout_seconds > 0))
    return invalid_argument("SHOAL_COMM_TIMEOUT={} must be > 0", o.timeout_seconds);
  if (auto a = env::get("SHOAL_ALLREDUCE_ALGO")) {
    auto alg = parse_algorithm(*a);
    if (!alg.ok()) return alg.status().with_context("SHOAL_ALLREDUCE_ALGO");
    o.allreduce = *alg;
  }
  if (auto t = env::get("SHOAL_JOB_TOKEN")) o.token = *t;
  // An elastic job's generation keeps its keys apart from the ones before.
  if (auto p = env::get("SHOAL_COMM_PREFIX"); p && !p->empty()) o.prefix = *p;
  if (auto h = env::get("SHOAL_IFACE_ADDR")) {
    o.host = *h;
    o.iface = "SHOAL_IFACE_ADDR";
  }
  SHOAL_ASSIGN_OR_RETURN(o.deterministic, env::get_bool("SHOAL_DETERMINISTIC", false));
  if (auto t = env::get("SHOAL_TRANSPORT")) {
    if (*t != "auto" && *t != "tcp")
      return invalid_argument("SHOAL_TRANSPORT={} is not one of auto, tcp", *t);
    o.transport = *t;
  }
  return o;
}

// ---------------------------------------------------------------- set-up

Result<std::unique_ptr<Communicator>> Communicator::create(int rank, int world, net::Store& store,
                                                           CommOptions o) {
  if (world < 1 || rank < 0 || rank >= world)
    return invalid_argument("communicator: rank {} of world {} is out of range", rank, world);
  if (world > 65535) return invalid_argument("communicator: world {} > 65535", world);
  std::unique_ptr<Communicator> c(new Communicator());
  c->rank_ = rank;
  c->world_ = world;
  c->o_ = std::move(o);
  c->store_ = &store;
  SHOAL_ASSIGN_OR_RETURN(c->mesh_, Mesh::connect(rank, world, store, c->o_));
  if (world > 1) SHOAL_RETURN_IF_ERROR(c->setup_hierarchy());
  if (world > 1 && c->o_.allreduce == Algorithm::kAuto && !c->o_.deterministic)
    SHOAL_RETURN_IF_ERROR(c->calibrate());
  c->worker_ = std::thread([p = c.get()] { p->progress_loop(); });
  return c;
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
    SHOAL_ASSIGN_OR_RETURN(LaunchEnv e, launch_env());
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
  SHOAL_ASSIGN_OR_RETURN(LaunchEnv e, launch_env());
  log::set_identity(e.rank, e.world, "comm");
  if (e.world > 1 && o.token.empty() && e.rank == 0)
    SHOAL_LOG_WARN(
        "no job token (SHOAL_JOB_TOKEN): the rendezvous store and the connections between ranks "
        "are unauthenticated, so any process that reaches their ports can join or read them; "
        "`shoal run` sets one, or export the same secret on every rank");
  Rendezvous rv;
  if (e.world > 1) {
    SHOAL_ASSIGN_OR_RETURN(rv, open_rendezvous(e, o));
    if (o.host.empty()) {
      // The address peers can reach: SHOAL_SOCKET_IFNAME, or the interface
      // that routes to the store's host (loopback when it is this host).
      std::string why;
      auto ifc = net::choose_interface(rv.host, &why);
      if (!ifc.ok()) return ifc.status().with_context(fmt::format("rank {}", e.rank));
      o.host = ifc->addr;
      o.iface = fmt::format("interface {}, chosen by {}", ifc->name, why);
      SHOAL_LOG_DEBUG("rank {} listens on {} ({})", e.rank, o.host, o.iface);
    }
  } else {
    rv.store = std::make_unique<net::FileStore>("/nonexistent");  // world 1: never used
  }
  SHOAL_ASSIGN_OR_RETURN(auto c, create(e.rank, e.world, *rv.store, o));
  c->own_store_ = std::move(rv.server);
  c->own_client_ = std::move(rv.store);
  SHOAL_ASSIGN_OR_RETURN(double deadline, heartbeat_deadline());
  if (e.world > 1 && deadline > 0) {
    // Heartbeats on a store connection of their own: a frozen rank is named
    // within SHOAL_HEARTBEAT seconds, whatever a collective may wait.
    SHOAL_ASSIGN_OR_RETURN(auto hb_store, rv.connect_again());
    // In an elastic job (dist/elastic.h) a silent rank ends the step in
    // flight, not the process: the survivors go on without it.
    std::function<void(const std::string&)> stop;
    if (env::get("SHOAL_ELASTIC"))
      stop = [p = c.get()](const std::string& why) {
        SHOAL_LOG_WARN("ending the step in flight: {}", why);
        p->cut();
      };
    SHOAL_ASSIGN_OR_RETURN(
        c->watchdog_, Watchdog::start(std::move(hb_store),
                                      {e.rank, e.world, c->o_.prefix, deadline, rv.where, stop}));
  }
  return c;
}

void Communicator::cut() {
  if (mesh_) mesh_->cut();
  // The two-level all-reduce's groups have meshes of their own (made at
  // create, before the watchdog that calls this starts): a step waiting in
  // them, on another host's silent rank or on a host peer that is, would
  // not notice the world's sockets going.
  if (local_) local_->cut();
  if (columns_) columns_->cut();
}

Communicator::~Communicator() {
  watchdog_.reset();  // this rank is done: its watcher stops watching
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // mesh_ then tells the peers this close is a clean shutdown, not a death.
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
    mesh_->abort_peers(st);
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
    ++mesh_->seq;
    auto fp = fingerprint(kReduce, dt, static_cast<std::uint8_t>(op), root, count);
    // f16/bf16 travel as themselves, each hop reducing in f32 (allreduce's rule).
    return do_reduce(send, recv, count, dt, op, root, fp);
  });
}

Status Communicator::broadcast(void* buf, std::size_t count, DType dt, int root) {
  if (root < 0 || root >= world_) return invalid_argument("broadcast: root {} out of range", root);
  if (mpi_) return run_blocking([=, this] { return mpi_->broadcast(buf, count, dt, root); });
  return run_blocking([=, this] {
    ++mesh_->seq;
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
    ++mesh_->seq;
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
    ++mesh_->seq;
    std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    auto fp = fingerprint(kReduceScatter, dt, static_cast<std::uint8_t>(op), -1, total);
    return do_reduce_scatter(send, recv, counts, dt, op, fp);
  });
}

Status Communicator::gather(const void* send, void* recv, std::size_t count, DType dt, int root) {
  if (root < 0 || root >= world_) return invalid_argument("gather: root {} out of range", root);
  if (mpi_) return run_blocking([=, this] { return mpi_->gather(send, recv, count, dt, root); });
  return run_blocking([=, this]() -> Status {
    ++mesh_->seq;
    auto fp = fingerprint(kGather, dt, 0, root, count);
    const std::size_t nb = count * dtype_size(dt);
    if (rank_ != root) return mesh_->send_to(root, send, nb, fp, "gather");
    std::vector<Xfer> xs;
    for (int r = 0; r < world_; ++r)
      if (r != root) xs.push_back(Xfer{r, false, bytes(recv) + r * nb, nb, 0, false, {}});
    if (nb && bytes(recv) + root * nb != bytes(send))
      std::memmove(bytes(recv) + root * nb, send, nb);
    return mesh_->exchange(xs, fp, "gather");
  });
}

Status Communicator::scatter(const void* send, void* recv, std::size_t count, DType dt, int root) {
  if (root < 0 || root >= world_) return invalid_argument("scatter: root {} out of range", root);
  if (mpi_) return run_blocking([=, this] { return mpi_->scatter(send, recv, count, dt, root); });
  return run_blocking([=, this]() -> Status {
    ++mesh_->seq;
    auto fp = fingerprint(kScatter, dt, 0, root, count);
    const std::size_t nb = count * dtype_size(dt);
    if (rank_ != root) return mesh_->recv_from(root, recv, nb, fp, "scatter");
    std::vector<Xfer> xs;
    for (int r = 0; r < world_; ++r)
      if (r != root)
        xs.push_back(
            Xfer{r, true, const_cast<std::uint8_t*>(bytes(send)) + r * nb, nb, 0, false, {}});
    if (nb && bytes(send) + root * nb != bytes(recv))
      std::memmove(recv, bytes(send) + root * nb, nb);
    return mesh_->exchange(xs, fp, "scatter");
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
    ++mesh_->seq;
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
      SHOAL_RETURN_IF_ERROR(mesh_->sendrecv(
          static_cast<int>(to), bytes(send) + so[to] * es, sc[to] * es, static_cast<int>(from),
          bytes(recv) + ro[from] * es, rc[from] * es, fp, "all_to_all"));
    }
    return ok_status();
  });
}

Status Communicator::barrier() {
  if (mpi_) return run_blocking([=, this] { return mpi_->barrier(); });
  return run_blocking([this]() -> Status {
    ++mesh_->seq;
    auto fp = fingerprint(kBarrier, DType::kU8, 0, -1, 0);
    for (int k = 1; k < world_; k <<= 1)  // dissemination
      SHOAL_RETURN_IF_ERROR(mesh_->sendrecv((rank_ + k) % world_, nullptr, 0,
                                            (rank_ - k + world_) % world_, nullptr, 0, fp,
                                            "barrier"));
    return ok_status();
  });
}

Status Communicator::send(const void* buf, std::size_t count, DType dt, int dst, int tag) {
  if (dst < 0 || dst >= world_ || dst == rank_)
    return invalid_argument("send: destination {} is not another rank of {}", dst, world_);
  if (mpi_) return run_blocking([=, this] { return mpi_->send(buf, count, dt, dst, tag); });
  return run_blocking([=, this] {
    return mesh_->send_to(dst, buf, count * dtype_size(dt),
                          fingerprint(kSendRecv, dt, 0, tag, count), "send");
  });
}

Status Communicator::recv(void* buf, std::size_t count, DType dt, int src, int tag) {
  if (src < 0 || src >= world_ || src == rank_)
    return invalid_argument("recv: source {} is not another rank of {}", src, world_);
  if (mpi_) return run_blocking([=, this] { return mpi_->recv(buf, count, dt, src, tag); });
  return run_blocking([=, this] {
    return mesh_->recv_from(src, buf, count * dtype_size(dt),
                            fingerprint(kSendRecv, dt, 0, tag, count), "recv");
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
  const std::uint64_t gen = mesh_->seq;
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
