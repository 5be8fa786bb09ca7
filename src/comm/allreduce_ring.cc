#include <cstring>
#include <vector>

#include "comm/algorithms.h"
#include "comm/reduce_internal.h"

namespace shoal::comm {
namespace {

// Block i of `count` split in `n` nearly equal parts.
std::size_t block_begin(std::size_t count, int n, int i) {
  std::size_t q = count / static_cast<std::size_t>(n), r = count % static_cast<std::size_t>(n);
  auto ui = static_cast<std::size_t>(i);
  return ui * q + std::min(ui, r);
}
}  // namespace

Status ring_allreduce(Mesh& m, void* buf, std::size_t count, DType dt, ReduceOp op,
                      std::uint64_t fp) {
  const int n = m.size();
  const std::size_t es = dtype_size(dt);
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    counts[static_cast<std::size_t>(i)] = block_begin(count, n, i + 1) - block_begin(count, n, i);
  const int right = (m.rank() + 1) % n, left = (m.rank() - 1 + n) % n;
  auto* base = bytes(buf);
  auto blk = [&](int i) { return base + block_begin(count, n, (i % n + n) % n) * es; };
  auto cnt = [&](int i) { return counts[static_cast<std::size_t>((i % n + n) % n)]; };
  // Reduce-scatter: after n-1 steps this rank holds block `rank` reduced.
  for (int s = 0; s < n - 1; ++s) {
    int sb = m.rank() - s - 1, rb = m.rank() - s - 2;
    // The incoming block is reduced into ours as it arrives (no scratch pass).
    std::vector<Xfer> xs;
    xs.push_back(Xfer{right, true, blk(sb), cnt(sb) * es, 0, false, {}});
    Xfer in{left, false, blk(rb), cnt(rb) * es, 0, false, {}};
    in.reduce = true;
    in.dt = dt;
    in.op = op;
    xs.push_back(in);
    SHOAL_RETURN_IF_ERROR(m.exchange(xs, fp, "allreduce (ring)"));
  }
  // Allgather of the reduced blocks.
  for (int s = 0; s < n - 1; ++s) {
    int sb = m.rank() - s, rb = m.rank() - s - 1;
    SHOAL_RETURN_IF_ERROR(m.sendrecv(right, blk(sb), cnt(sb) * es, left, blk(rb), cnt(rb) * es, fp,
                                     "allreduce (ring)"));
  }
  return ok_status();
}

}  // namespace shoal::comm
