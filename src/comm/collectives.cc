// Communicator: the all-reduce choice (the alpha-beta tuner, the two-level
// layout across hosts) and the other collectives, run over the mesh.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "comm/algorithms.h"
#include "comm/mesh.h"
#include "comm/mpi_backend.h"
#include "comm/reduce_internal.h"
#include "comm/tuner.h"
#include "shoal/comm/communicator.h"
#include "shoal/core/logging.h"
#include "shoal/net/shared_memory.h"
#include "shoal/tensor/tensor.h"

namespace shoal::comm {

namespace {

// Where the direct algorithms start to pay (bench comm): 64 KiB at 2 ranks,
// 256 KiB at more, unless CommOptions::direct_bytes says otherwise.
std::size_t direct_from(const CommOptions& o, int world) {
  return o.direct_bytes ? o.direct_bytes : (world == 2 ? std::size_t{64} << 10 : 256 << 10);
}

// Where each rank's part starts, and (last) the total: off[r]..off[r + 1].
std::vector<std::size_t> offsets(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> off(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), off.begin() + 1);
  return off;
}

// Whether [a, a + an) and [b, b + bn) share a byte.
bool overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

}  // namespace

bool Communicator::last_direct_mapped() const { return mesh_ && mesh_->last_mapped; }
std::uint64_t Communicator::bytes_sent() const { return mesh_ ? mesh_->bytes_sent : 0; }
double Communicator::host_alpha() const { return topo_ ? topo_->local.alpha : 0; }
double Communicator::host_beta() const { return topo_ ? topo_->local.beta : 0; }
std::uint64_t Communicator::sequence() const { return mesh_ ? mesh_->seq : 0; }

int Communicator::local_size() const {
  if (mpi_) return mpi_->local_size();
  if (mesh_->host_of().empty()) return 1;  // world 1
  return static_cast<int>(std::count(mesh_->host_of().begin(), mesh_->host_of().end(),
                                     mesh_->host_of()[static_cast<std::size_t>(rank_)]));
}

Result<std::shared_ptr<net::SharedRegion>> Communicator::allocate_shared(std::size_t bytes) {
  return net::SharedRegion::create(bytes);
}

Result<std::shared_ptr<Storage>> Communicator::shared_arena(std::size_t bytes) {
  auto r = allocate_shared(bytes);
  if (!r.ok()) {
    SHOAL_LOG_WARN("arena in private memory ({}): peers on this host copy through system calls",
                   r.status().message());
    return Storage::allocate(bytes);
  }
  std::shared_ptr<net::SharedRegion> region = std::move(*r);
  return Storage::wrap(region->data(), bytes, region);
}

// The two-level layout, made once at start-up (split is collective): used
// when the job spans several hosts and some host runs several ranks.
Status Communicator::setup_hierarchy() {
  const auto& host_of = mesh_->host_of();
  std::vector<std::string> hosts;  // in order of first rank
  for (const auto& h : host_of)
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  if (hosts.size() < 2 || hosts.size() == static_cast<std::size_t>(world_)) return ok_status();
  // Each rank's host (as an index), this rank's place among its host's
  // ranks, and whether every host runs as many ranks (every rank computes
  // the same answer from host_of).
  topo_ = std::make_unique<Topology>();
  for (const auto& h : host_of)
    topo_->host.push_back(
        static_cast<int>(std::find(hosts.begin(), hosts.end(), h) - hosts.begin()));
  const std::string& me = host_of[static_cast<std::size_t>(rank_)];
  const int host = topo_->host[static_cast<std::size_t>(rank_)];
  const int index = static_cast<int>(std::count(host_of.begin(), host_of.begin() + rank_, me));
  const auto ranks_on = [&](const std::string& h) {
    return std::count(host_of.begin(), host_of.end(), h);
  };
  uniform_ = std::all_of(hosts.begin(), hosts.end(),
                         [&](const std::string& h) { return ranks_on(h) == ranks_on(hosts[0]); });
  topo_->uniform = uniform_;
  topo_->piece_bytes = o_.hier_piece_bytes;
  SHOAL_ASSIGN_OR_RETURN(local_, split(host, rank_));
  // Column i: the i-th rank of every host, in host order; otherwise only
  // the leaders (index 0) form one.
  const int column = uniform_ ? index : index == 0 ? 0 : -1;
  SHOAL_ASSIGN_OR_RETURN(columns_, split(column, uniform_ ? host : rank_));
  return ok_status();
}

// Two levels. Where every host runs L ranks: reduce-scatter within the
// host (rank i keeps the i-th 1/L), all-reduce that slice across hosts
// among the hosts' i-th ranks (L flows share the NIC: n bytes per host),
// all-gather within the host; every rank's link and core work. Otherwise
// (or below L elements): reduce to the host's leader, all-reduce among the
// leaders, broadcast back. 2 hosts x 2 ranks at 1 Gbit/s, 16 MiB: the
// leader form took 203 ms, the sliced form 174, halving-doubling 149.
Status Communicator::hier_allreduce(void* buf, std::size_t count, DType dt, ReduceOp op) {
  const ReduceOp inner = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  if (uniform_ && count >= static_cast<std::size_t>(local_->size()))
    return hier_sliced(buf, count, dt, inner);
  // The leader form.
  SHOAL_RETURN_IF_ERROR(
      local_->reduce(buf, buf, count, dt, inner, 0).with_context(hier_where("within the host")));
  if (local_->rank() == 0)  // the leaders: column 0
    SHOAL_RETURN_IF_ERROR(
        columns_->allreduce(buf, buf, count, dt, inner).with_context(hier_where("across hosts")));
  return local_->broadcast(buf, count, dt, 0).with_context(hier_where("within the host"));
}

std::string Communicator::hier_where(const char* part) const {
  return fmt::format("allreduce (hierarchical) #{}, {}", mesh_->seq, part);
}

// The sliced form, pipelined in pieces of ~4 MiB: piece k+1's
// reduce-scatter and piece k-1's all-gather run within the host while piece
// k crosses the hosts. Every rank queues the same calls in the same order
// on each communicator.
Status Communicator::hier_sliced(void* buf, std::size_t count, DType dt, ReduceOp op) {
  const std::size_t es = dtype_size(dt), L = static_cast<std::size_t>(local_->size());
  const std::size_t me = static_cast<std::size_t>(local_->rank());
  const std::size_t piece = std::max<std::size_t>(L, (o_.hier_piece_bytes / es) / L * L);
  struct Piece {
    std::size_t off = 0, at = 0;  // first element in buf; this rank's slice in hier_slice_
    std::vector<std::size_t> counts;
    std::uint8_t* slice = nullptr;
    WorkPtr work;
  };
  std::vector<Piece> ps((count + piece - 1) / piece);
  std::size_t slice_bytes = 0;
  for (std::size_t k = 0; k < ps.size(); ++k) {
    Piece& p = ps[k];
    p.off = k * piece;
    const std::size_t n = std::min(piece, count - p.off);
    p.counts.assign(L, n / L);
    for (std::size_t i = 0; i < n % L; ++i) ++p.counts[i];
    p.at = slice_bytes;
    slice_bytes += p.counts[me] * es;
  }
  hier_slice_.resize(slice_bytes);
  for (Piece& p : ps) p.slice = hier_slice_.data() + p.at;
  auto* base = static_cast<std::uint8_t*>(buf);
  if (ps.size() == 1) {  // inline: a call through a progress thread costs ~50 us more
    const Piece& p = ps[0];
    SHOAL_RETURN_IF_ERROR(local_->reduce_scatter(buf, p.slice, p.counts, dt, op)
                              .with_context(hier_where("within the host")));
    SHOAL_RETURN_IF_ERROR(columns_->allreduce(p.slice, p.slice, p.counts[me], dt, op)
                              .with_context(hier_where("across hosts")));
    return local_->allgatherv(p.slice, buf, p.counts, dt)
        .with_context(hier_where("within the host"));
  }
  auto scatter = [&](Piece& p) {
    p.work = local_->reduce_scatter_async(base + p.off * es, p.slice, p.counts, dt, op);
  };
  std::vector<WorkPtr> gathers;
  Status st;
  scatter(ps[0]);
  for (std::size_t k = 0; k < ps.size(); ++k) {
    Piece& p = ps[k];
    st = p.work->wait(deadline()).with_context(hier_where("within the host"));
    if (!st.ok()) break;
    WorkPtr cross = columns_->allreduce_async(p.slice, p.slice, p.counts[me], dt, op);
    if (k + 1 < ps.size()) scatter(ps[k + 1]);
    st = cross->wait(deadline()).with_context(hier_where("across hosts"));
    if (!st.ok()) break;
    gathers.push_back(local_->allgatherv_async(p.slice, base + p.off * es, p.counts, dt));
  }
  // Whatever failed, every queued call ends before the buffers it uses.
  for (auto& p : ps)
    if (p.work) (void)p.work->wait(deadline());
  for (auto& g : gathers) {
    Status gs = g->wait(deadline()).with_context(hier_where("within the host"));
    if (st.ok()) st = gs;
  }
  return st;
}

// α-β calibration: time small and 1 MiB exchanges around the ring, take
// the max over ranks (every rank must pick the same algorithm), and fit
// t(n) = α + β n per message. Where the job spans hosts the ring crosses
// a host link, so this is the link's cost; the hosts' own (fitted again
// host by host, fit_hosts_in_turn; the slowest sampled host's) joins it in
// topo_.
Status Communicator::calibrate() {
  const int right = (rank_ + 1) % world_, left = (rank_ - 1 + world_) % world_;
  std::vector<std::uint8_t> out(1 << 20, 1), in(1 << 20);
  auto timed = [&](std::size_t bytes, int rounds) -> Result<double> {
    ++mesh_->seq;
    auto fp = fingerprint(kBarrier, DType::kU8, 1, -1, bytes);
    SHOAL_RETURN_IF_ERROR(
        mesh_->sendrecv(right, out.data(), bytes, left, in.data(), bytes, fp, "calibrate"));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      ++mesh_->seq;
      SHOAL_RETURN_IF_ERROR(
          mesh_->sendrecv(right, out.data(), bytes, left, in.data(), bytes, fp, "calibrate"));
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / rounds;
  };
  SHOAL_ASSIGN_OR_RETURN(double small, timed(8, 50));
  SHOAL_ASSIGN_OR_RETURN(double big, timed(1 << 20, 4));
  Algorithm keep = o_.allreduce;
  o_.allreduce = Algorithm::kRecursiveDoubling;
  Status st = topo_ ? fit_hosts_in_turn() : ok_status();
  const bool sampled = topo_ && topo_->host[static_cast<std::size_t>(rank_)] < kSampledHosts;
  double v[4] = {small, std::max(big - small, 1e-12) / (1 << 20), sampled ? local_->alpha_ : 0,
                 sampled ? local_->beta_ : 0};
  if (st.ok()) st = do_allreduce(v, v, 4, DType::kF64, ReduceOp::kMax);
  o_.allreduce = keep;
  SHOAL_RETURN_IF_ERROR(st);
  alpha_ = v[0];
  beta_ = v[1];
  if (topo_) {
    topo_->cross = LinkCost{v[0], v[1]};
    topo_->local = LinkCost{v[2], v[3]};
  }
  return ok_status();
}

// The hosts' own links, fitted again one host at a time (the first
// kSampledHosts; hosts of one job are alike). Fitted at once, as split did,
// the hosts' ranks compete for the cores where one machine runs every host
// (the netns testbed, 4 hosts x 2 ranks on 2 cores: 341 us and 6.2 ns per
// byte inside a host, slower than the 1 Gbit/s link), and the tuner chose
// the ring at 1-4 MiB, 15.4 ms against halving-doubling's 13.2.
Status Communicator::fit_hosts_in_turn() {
  const int me = topo_->host[static_cast<std::size_t>(rank_)];
  for (int h = 0; h < kSampledHosts; ++h) {
    if (me == h && local_->size() > 1) SHOAL_RETURN_IF_ERROR(local_->calibrate());
    double none = 0;  // a barrier: the next host starts once this one is done
    SHOAL_RETURN_IF_ERROR(do_allreduce(&none, &none, 1, DType::kF64, ReduceOp::kMax));
  }
  return ok_status();
}

Algorithm Communicator::choose_allreduce(std::size_t bytes) const {
  const double p = world_, n = static_cast<double>(bytes);
  if (alpha_ <= 0)  // not calibrated (SHOAL_DETERMINISTIC=1): fixed threshold
    return bytes <= o_.small_bytes ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
  // Up to 4 KiB, and up to 16 KiB where the bytes cost no more than one
  // latency, the cost is messages: fewest messages wins. (The model's
  // per-byte term, fitted on 1 MiB exchanges, overstates the cost of
  // reducing a few cached KiB; with a noisy calibration it once chose the
  // ring at 4 KiB, 2.8 us against recursive doubling's 1.6.) Where 16 KiB
  // costs more than a latency, as over a 1 Gbit/s link (129 us against
  // 17), the model decides: 4 hosts, recursive doubling took 276 us,
  // halving-doubling 204.
  if (bytes <= 4 << 10 || (bytes <= 16 << 10 && n * beta_ <= alpha_))
    return Algorithm::kRecursiveDoubling;
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

// The tuner's choice across hosts for (bytes, count), priced once: data
// parallelism asks for the same bucket sizes every step, and pricing walks
// every rank's host in every step of every algorithm (at 1,024 ranks ~0.5
// ms a call, 3.7 us at 32). Every rank prices alike, so caching keeps them
// agreed.
Algorithm Communicator::tuned_allreduce(std::size_t bytes, std::size_t count) {
  const auto key = std::pair{bytes, count};
  if (auto it = tuned_.find(key); it != tuned_.end()) return it->second;
  if (tuned_.size() >= 4096) tuned_.clear();  // many sizes: keep it bounded
  return tuned_[key] = cheapest_allreduce(*topo_, bytes, count).algo;
}

Status Communicator::do_allreduce(const void* send, void* recv, std::size_t count, DType dt,
                                  ReduceOp op) {
  ++mesh_->seq;
  const std::uint64_t fp = fingerprint(kAllreduce, dt, static_cast<std::uint8_t>(op), -1, count);
  if (send != recv && count > 0) std::memcpy(recv, send, count * dtype_size(dt));
  if (world_ == 1 || count == 0) {
    last_algo_ = "local";
    // Still exchange nothing; ranks agree trivially.
    return ok_status();
  }
  // f16/bf16 travel as themselves: each hop widens both operands, reduces
  // in f32 and rounds once (as NCCL does). Widening the whole buffer to f32
  // first, as this did, sent f32 bytes: `--wire bf16` across 4 hosts at
  // 1 Gbit/s took the f32 wire's 25.7 ms per MLP step.
  Algorithm a = o_.allreduce;
  if (a == Algorithm::kDirect && !mesh_->cma())
    a = Algorithm::kRing;  // not available: the next best
  if (a == Algorithm::kAuto && local_ && count > 0) {
    // Across hosts, calibrated: every algorithm priced over the links its
    // steps cross (comm/tuner.h). Not calibrated (SHOAL_DETERMINISTIC=1):
    // two levels from the fixed threshold.
    if (alpha_ > 0 && topo_->local.alpha > 0)
      a = tuned_allreduce(count * dtype_size(dt), count);
    else if (count * dtype_size(dt) >= o_.small_bytes)
      a = Algorithm::kHierarchical;
  }
  if (a == Algorithm::kAuto && mesh_->cma() && count * dtype_size(dt) >= direct_from(o_, world_))
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
    st = direct_allreduce(*mesh_, recv, count, dt, op, fp);
  } else if (a == Algorithm::kHalvingDoubling) {
    last_algo_ = "halving-doubling";
    st = hd_allreduce(*mesh_, recv, count, dt, op, fp);
  } else if (a == Algorithm::kRing && count >= static_cast<std::size_t>(world_)) {
    last_algo_ = "ring";
    st = ring_allreduce(*mesh_, recv, count, dt, op, fp);
  } else {
    last_algo_ = "recursive-doubling";
    st = rd_allreduce(*mesh_, recv, count, dt, op, fp);
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
      SHOAL_RETURN_IF_ERROR(mesh_->send_to((vr - mask + root) % n, acc.data(), nb, fp, "reduce"));
      break;
    }
    if (vr + mask < n) {
      SHOAL_RETURN_IF_ERROR(mesh_->recv_from((vr + mask + root) % n, tmp.data(), nb, fp, "reduce"));
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
      SHOAL_RETURN_IF_ERROR(mesh_->recv_from((vr - mask + root) % n, buf, nb, fp, "broadcast"));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n)
      SHOAL_RETURN_IF_ERROR(mesh_->send_to((vr + mask + root) % n, buf, nb, fp, "broadcast"));
  return ok_status();
}

// Reduce-scatter and all-gather go direct where the all-reduce would (ranks
// of one host reaching each other's memory, from its size up; always when
// it is forced) from 3 ranks up, unless this rank's part of one buffer overlaps the other
// elsewhere than where it belongs.
bool Communicator::gather_scatter_direct(std::size_t total_bytes, const void* part,
                                         std::size_t part_bytes, const void* whole,
                                         std::size_t part_offset) const {
  if (world_ < 2 || !mesh_->cma()) return false;
  // At 2 ranks a ring is one exchange, fewer than direct's two: measured,
  // TP 2's sequence-parallel step 0.91 of its bound by ring, 0.82 direct.
  if (o_.allreduce != Algorithm::kDirect &&
      (o_.allreduce != Algorithm::kAuto || world_ < 3 || total_bytes < direct_from(o_, world_)))
    return false;
  return part == static_cast<const std::uint8_t*>(whole) + part_offset ||
         !overlap(part, part_bytes, whole, total_bytes);
}

Status Communicator::do_allgatherv(const void* send, void* recv,
                                   const std::vector<std::size_t>& counts, DType dt,
                                   std::uint64_t fp) {
  const int n = world_;
  const std::size_t es = dtype_size(dt);
  const std::vector<std::size_t> off = offsets(counts);
  const auto me = static_cast<std::size_t>(rank_);
  if (gather_scatter_direct(off.back() * es, send, counts[me] * es, recv, off[me] * es))
    return direct_allgatherv(*mesh_, send, recv, off, dt, fp);
  auto* base = bytes(recv);
  auto idx = [&](int i) { return static_cast<std::size_t>((i % n + n) % n); };
  const std::size_t mine = counts[me] * es;
  if (mine && base + off[me] * es != bytes(send)) std::memmove(base + off[me] * es, send, mine);
  const int right = (rank_ + 1) % n, left = (rank_ - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    std::size_t sb = idx(rank_ - s), rb = idx(rank_ - s - 1);
    SHOAL_RETURN_IF_ERROR(mesh_->sendrecv(right, base + off[sb] * es, counts[sb] * es, left,
                                          base + off[rb] * es, counts[rb] * es, fp, "allgather"));
  }
  return ok_status();
}

// The ring reduce-scatter's blocks stay allocated between calls up to
// this size (two blocks); larger ones are allocated for the call alone.
constexpr std::size_t kKeptRingBytes = std::size_t{64} << 20;

Status Communicator::do_reduce_scatter(const void* send, void* recv,
                                       const std::vector<std::size_t>& counts, DType dt,
                                       ReduceOp op, std::uint64_t fp) {
  const int n = world_;
  const std::size_t es = dtype_size(dt);
  const std::vector<std::size_t> off = offsets(counts);
  const auto me = static_cast<std::size_t>(rank_);
  if (gather_scatter_direct(off.back() * es, recv, counts[me] * es, send, off[me] * es))
    return direct_reduce_scatter(*mesh_, send, recv, off, dt, op, fp);
  // The ring holds two blocks of scratch, not a copy of the whole input:
  // the block sent at step s > 0 is the partial sum received (and added
  // to) at step s - 1. Before, every call copied the whole input to the
  // heap (ZeRO's flat gradient: its peak RSS did not fall below plain DP's).
  // Each partial is incoming op own block, as before (the ops commute).
  // The last step receives this rank's own block straight into recv when
  // recv is apart from send, so 2 ranks need no scratch at all. The blocks
  // are kept in the mesh up to kKeptRingBytes: fresh vectors each call
  // (mapped, faulted in and zeroed) cost ZeRO's 3.25 MB gradient on 2 ranks
  // 1.6 ms of a 1.9 ms reduce-scatter.
  const std::size_t maxc = *std::max_element(counts.begin(), counts.end());
  const bool into_recv = !overlap(recv, counts[me] * es, send, off.back() * es);
  const std::size_t need = (n > 2 ? 2 : (n == 2 && !into_recv ? 1 : 0)) * maxc * es;
  std::vector<std::uint8_t> once;
  std::vector<std::uint8_t>& blocks = need <= kKeptRingBytes ? mesh_->ring_blocks : once;
  if (blocks.size() < need) blocks.resize(need);
  std::uint8_t* acc = blocks.data();
  std::uint8_t* in = n > 2 ? acc + maxc * es : acc;
  const std::uint8_t* mine = bytes(send);  // n == 1: the input is the result
  auto idx = [&](int i) { return static_cast<std::size_t>((i % n + n) % n); };
  const int right = (rank_ + 1) % n, left = (rank_ - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    const std::size_t sb = idx(rank_ - s - 1), rb = idx(rank_ - s - 2);
    const bool last = s == n - 2;  // rb == me: this rank's own block arrives
    const std::uint8_t* out = s == 0 ? bytes(send) + off[sb] * es : acc;
    std::uint8_t* to = last && into_recv ? static_cast<std::uint8_t*>(recv) : in;
    SHOAL_RETURN_IF_ERROR(mesh_->sendrecv(right, out, counts[sb] * es, left, to, counts[rb] * es,
                                          fp, "reduce_scatter"));
    reduce_into(to, bytes(send) + off[rb] * es, counts[rb], dt, op);
    if (last) mine = to;
    std::swap(acc, in);
  }
  if (counts[me] && mine != recv) std::memmove(recv, mine, counts[me] * es);
  if (op == ReduceOp::kAvg) divide_by_size(recv, counts[me], dt, world_);
  return ok_status();
}

}  // namespace shoal::comm
