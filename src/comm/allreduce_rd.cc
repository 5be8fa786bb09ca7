#include <cstring>
#include <vector>

#include "comm/algorithms.h"
#include "comm/reduce_internal.h"

namespace shoal::comm {

Status rd_allreduce(Mesh& m, void* buf, std::size_t count, DType dt, ReduceOp op,
                    std::uint64_t fp) {
  const char* what = "allreduce (rd)";
  const std::size_t bytes_n = count * dtype_size(dt);
  SHOAL_ASSIGN_OR_RETURN(const int newrank, m.fold_in(buf, count, dt, op, fp, what));
  if (newrank >= 0) {
    for (int mask = 1; mask < m.fold_p2(); mask <<= 1) {
      const int dst = m.fold_rank(newrank ^ mask);
      SHOAL_RETURN_IF_ERROR(
          m.sendrecv(dst, buf, bytes_n, dst, m.scratch.data(), bytes_n, fp, what));
      // Lower rank's data first: every rank then computes the same bits.
      if (dst < m.rank()) {  // theirs (op) mine, computed in scratch, then copied back
        reduce_into(m.scratch.data(), buf, count, dt, op);
        std::memcpy(buf, m.scratch.data(), bytes_n);
      } else {
        reduce_into(buf, m.scratch.data(), count, dt, op);
      }
    }
  }
  return m.fold_out(buf, bytes_n, fp, what);
}

}  // namespace shoal::comm
