// Mesh set-up: rank claim, addresses, the authenticated handshake, the
// start-up checks, shared-memory rings and the cross-memory attach probe.
#include <sodium.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>

#include "comm/mesh.h"
#include "comm/peer_checks.h"
#include "shoal/comm/handshake.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/net/auth.h"

namespace shoal::comm {
namespace {

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

// Rank j's advertised address cannot be reached from here: name it, the
// interface it came from (its claim says), and this rank's own.
Status unreachable_peer(net::Store& store, const std::string& px, int rank, int j,
                        const std::string& own_iface, const Status& st) {
  auto claim = store.get(fmt::format("{}/claim/{}", px, j), Deadline::after_seconds(2));
  return unavailable(
      "rendezvous: rank {} cannot reach rank {} at the address it advertised ({}): {}; this "
      "rank's own address came from {}. Set SHOAL_SOCKET_IFNAME on every rank to an interface "
      "the hosts reach each other through",
      rank, j, claim.ok() ? *claim : "its claim is unreadable", st.message(),
      own_iface.empty() ? "the default" : own_iface);
}

}  // namespace

Result<std::unique_ptr<Mesh>> Mesh::connect(int rank, int world, net::Store& store,
                                            const CommOptions& o) {
  if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
  std::unique_ptr<Mesh> m(new Mesh());
  m->rank_ = rank;
  m->world_ = world;
  m->o_ = o;
  if (world > 1) SHOAL_RETURN_IF_ERROR(m->connect_mesh(store));
  return m;
}

Mesh::~Mesh() {
  for (auto& p : peers_) {
    if (!p.valid()) continue;
    net::FrameHeader h;
    h.type = static_cast<std::uint16_t>(net::FrameType::kGoodbye);
    (void)p.send_frame(h, nullptr, Deadline::after(std::chrono::milliseconds(200)));
  }
}

Status Mesh::connect_mesh(net::Store& store) {
  Deadline dl = o_.connect_seconds > 0 ? Deadline::after_seconds(o_.connect_seconds) : deadline();
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
  const std::string claim =
      o_.iface.empty() ? fmt::format("pid {} on {} ({})", getpid(), hostname, me)
                       : fmt::format("pid {} on {} ({}, {})", getpid(), hostname, me, o_.iface);
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
    auto conn = net::Socket::connect(hp.first, hp.second, dl);
    if (!conn.ok()) return unreachable_peer(store, px, rank_, j, o_.iface, conn.status());
    net::Socket s = std::move(conn).value();
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
  // Higher ranks connect to us. A connection that is not one of them (a
  // port scanner, a health probe, a peer of another job) is dropped and
  // logged, and the wait goes on for the real ones: one stray connection
  // must not end the job. Each gets a few seconds to say hello, so a
  // silent one does not hold the listener for the whole deadline.
  log::LineBudget strays;
  for (int got = 0; got < world_ - 1 - rank_;) {
    auto acc = listener.accept(dl);
    if (!acc.ok())
      return acc.status().with_context(
          fmt::format("rendezvous: rank {} waited for {} higher ranks to connect ({} connected)",
                      rank_, world_ - 1 - rank_, got));
    net::Socket s = std::move(acc).value();
    const std::string from = s.peer();
    Status st = accept_peer(std::move(s), store, dl);
    if (st.ok()) {
      ++got;
      continue;
    }
    if (dl.expired()) return st.with_context("rendezvous");
    std::uint64_t held = 0;
    if (strays.take(&held))
      SHOAL_LOG_WARN("rank {}: dropped a connection from {} that is not a rank of this job: {}{}",
                     rank_, from, st.message(),
                     held ? fmt::format(" ({} more dropped since the last such line)", held) : "");
  }
  if (o_.is_world)  // once per job
    SHOAL_RETURN_IF_ERROR(check_clocks(rank_, world_, peers_, o_.max_clock_skew, dl));
  return setup_shm(store, dl);
}

// The accepting side of the handshake with one connection: hello, our
// challenge, its proof. On success the socket becomes the peer's.
Status Mesh::accept_peer(net::Socket s, net::Store& store, Deadline dl) {
  const std::string from = s.peer();
  const Deadline hello_dl =
      Deadline::after(std::min(dl.remaining(), std::chrono::milliseconds(kHelloMs)));
  SHOAL_ASSIGN_OR_RETURN(std::string hb, recv_msg(s, net::FrameType::kHello, 64, hello_dl));
  SHOAL_ASSIGN_OR_RETURN(Hello hello, parse_hello(hb, from));
  const int r = hello.rank;
  if (hello.world != world_ || r <= rank_ || peers_[static_cast<std::size_t>(r)].valid()) {
    (void)send_msg(s, net::FrameType::kAbort, "bad rank or world size", hello_dl);
    return failed_precondition(
        "handshake from {}: claims rank {} of world {}, expected a rank in ({}, {}) of world {}",
        from, r, hello.world, rank_, world_, world_);
  }
  const std::string ns = make_nonce();
  SHOAL_RETURN_IF_ERROR(send_msg(
      s, net::FrameType::kChallenge,
      encode_challenge(rank_, ns, make_proof(o_.token, 'S', hello.nonce, ns, r, rank_, world_)),
      hello_dl));
  SHOAL_ASSIGN_OR_RETURN(std::string pr, recv_msg(s, net::FrameType::kProof, 64, hello_dl));
  if (!proof_matches(pr, make_proof(o_.token, 'C', hello.nonce, ns, r, rank_, world_))) {
    (void)send_msg(s, net::FrameType::kAbort, "wrong job token", hello_dl);
    return failed_precondition(
        "handshake: connection from {} claiming rank {} failed the job-token proof "
        "(SHOAL_JOB_TOKEN differs)",
        from, r);
  }
  SHOAL_RETURN_IF_ERROR(send_msg(s, net::FrameType::kProof, "", hello_dl));
  auto addr = store.get(fmt::format("{}/addr/{}", o_.prefix, r), dl);
  hosts_[static_cast<std::size_t>(r)] = addr.ok() ? *addr : from;
  s.set_peer(fmt::format("rank {} ({})", r, hosts_[static_cast<std::size_t>(r)]));
  peers_[static_cast<std::size_t>(r)] = std::move(s);
  return ok_status();
}

// Pairs on one host also get a shared-memory channel; their TCP connection
// stays for fault detection (a closed socket is how a death is noticed).
Status Mesh::setup_shm(net::Store& store, Deadline dl) {
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
      host_of_, o_.is_world && o_.host_id.empty() && lws && *lws == std::to_string(world_)));
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
Status Mesh::probe_cma(net::Store& store, Deadline dl) {
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
    ok = ok && v.size() == 1 && v[0] == '1';
  }
  cma_ = ok;
  return ok_status();
}

}  // namespace shoal::comm
