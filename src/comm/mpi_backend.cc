#include "comm/mpi_backend.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "comm/reduce_internal.h"

namespace shoal::comm {
namespace {

Status check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return ok_status();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return unavailable("MPI {}: {}", what, std::string(msg, static_cast<std::size_t>(len)));
}

Result<int> to_int(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    return invalid_argument("MPI backend: {} count {} exceeds INT_MAX", what, n);
  return static_cast<int>(n);
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
      return MPI_UINT8_T;
    case DType::kBool:
      return MPI_UINT8_T;
    case DType::kF16:
    case DType::kBF16:
      return MPI_UINT16_T;  // moved as bits; reduced through f32
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op, DType dt) {
  if (dt == DType::kBool) {
    return (op == ReduceOp::kProd || op == ReduceOp::kMin) ? MPI_LAND : MPI_LOR;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  return MPI_SUM;
}

bool half(DType dt) { return dt == DType::kF16 || dt == DType::kBF16; }

std::vector<int> ints(const std::vector<std::size_t>& v) {
  return std::vector<int>(v.begin(), v.end());
}
std::vector<int> displs(const std::vector<std::size_t>& v) {
  std::vector<int> d(v.size(), 0);
  for (std::size_t i = 1; i < v.size(); ++i) d[i] = d[i - 1] + static_cast<int>(v[i - 1]);
  return d;
}

}  // namespace

Result<std::unique_ptr<MpiBackend>> MpiBackend::init() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    SHOAL_RETURN_IF_ERROR(
        check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init"));
    if (provided < MPI_THREAD_SERIALIZED)
      return failed_precondition("MPI provides thread level {}, Shoal needs SERIALIZED", provided);
    std::atexit([] {
      int fin = 0;
      MPI_Finalized(&fin);
      if (!fin) MPI_Finalize();
    });
  }
  MPI_Comm c;
  SHOAL_RETURN_IF_ERROR(check(MPI_Comm_dup(MPI_COMM_WORLD, &c), "comm dup"));
  return std::make_unique<MpiBackend>(c);
}

std::string MpiBackend::library() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int n = 0;
  MPI_Get_library_version(v, &n);
  std::string s(v, static_cast<std::size_t>(std::max(0, n)));
  if (auto nl = s.find_first_of("\n,"); nl != std::string::npos) s.resize(nl);
  return s;
}

MpiBackend::MpiBackend(MPI_Comm c) : comm_(c) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm node;
  if (MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
  }
}

MpiBackend::~MpiBackend() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&comm_);
}

Status MpiBackend::allreduce(const void* send, void* recv, std::size_t count, DType dt,
                             ReduceOp op) {
  SHOAL_ASSIGN_OR_RETURN(int n, to_int(count, "allreduce"));
  if (half(dt)) {
    auto v = widen_half(send, count, dt);
    SHOAL_RETURN_IF_ERROR(allreduce(v.data(), v.data(), count, DType::kF32, op));
    narrow_half(v, recv, dt);
    return ok_status();
  }
  const void* s = send == recv ? MPI_IN_PLACE : send;
  SHOAL_RETURN_IF_ERROR(
      check(MPI_Allreduce(s, recv, n, mpi_type(dt), mpi_op(op, dt), comm_), "allreduce"));
  if (op == ReduceOp::kAvg) divide_by_size(recv, count, dt, size_);
  return ok_status();
}

Status MpiBackend::reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op,
                          int root) {
  SHOAL_ASSIGN_OR_RETURN(int n, to_int(count, "reduce"));
  if (half(dt)) {
    auto v = widen_half(send, count, dt);
    std::vector<float> r(count);
    SHOAL_RETURN_IF_ERROR(reduce(v.data(), r.data(), count, DType::kF32, op, root));
    if (rank_ == root) narrow_half(r, recv, dt);
    return ok_status();
  }
  const void* s = (send == recv && rank_ == root) ? MPI_IN_PLACE : send;
  SHOAL_RETURN_IF_ERROR(
      check(MPI_Reduce(s, recv, n, mpi_type(dt), mpi_op(op, dt), root, comm_), "reduce"));
  if (op == ReduceOp::kAvg && rank_ == root) divide_by_size(recv, count, dt, size_);
  return ok_status();
}

Status MpiBackend::broadcast(void* buf, std::size_t count, DType dt, int root) {
  SHOAL_ASSIGN_OR_RETURN(int n, to_int(count, "broadcast"));
  return check(MPI_Bcast(buf, n, mpi_type(dt), root, comm_), "broadcast");
}

Status MpiBackend::allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts,
                              DType dt) {
  std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  SHOAL_RETURN_IF_ERROR(to_int(total, "allgatherv").status());
  auto c = ints(counts), d = displs(counts);
  return check(MPI_Allgatherv(send, c[static_cast<std::size_t>(rank_)], mpi_type(dt), recv,
                              c.data(), d.data(), mpi_type(dt), comm_),
               "allgatherv");
}

Status MpiBackend::reduce_scatter(const void* send, void* recv,
                                  const std::vector<std::size_t>& counts, DType dt, ReduceOp op) {
  std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  SHOAL_RETURN_IF_ERROR(to_int(total, "reduce_scatter").status());
  std::size_t mine = counts[static_cast<std::size_t>(rank_)];
  if (half(dt)) {
    auto v = widen_half(send, total, dt);
    std::vector<float> r(mine);
    SHOAL_RETURN_IF_ERROR(reduce_scatter(v.data(), r.data(), counts, DType::kF32, op));
    narrow_half(r, recv, dt);
    return ok_status();
  }
  auto c = ints(counts);
  SHOAL_RETURN_IF_ERROR(
      check(MPI_Reduce_scatter(send, recv, c.data(), mpi_type(dt), mpi_op(op, dt), comm_),
            "reduce_scatter"));
  if (op == ReduceOp::kAvg) divide_by_size(recv, mine, dt, size_);
  return ok_status();
}

Status MpiBackend::gather(const void* send, void* recv, std::size_t count, DType dt, int root) {
  SHOAL_ASSIGN_OR_RETURN(int n, to_int(count, "gather"));
  return check(MPI_Gather(send, n, mpi_type(dt), recv, n, mpi_type(dt), root, comm_), "gather");
}

Status MpiBackend::scatter(const void* send, void* recv, std::size_t count, DType dt, int root) {
  SHOAL_ASSIGN_OR_RETURN(int n, to_int(count, "scatter"));
  return check(MPI_Scatter(send, n, mpi_type(dt), recv, n, mpi_type(dt), root, comm_), "scatter");
}

Status MpiBackend::all_to_allv(const void* send, const std::vector<std::size_t>& sc, void* recv,
                               const std::vector<std::size_t>& rc, DType dt) {
  auto s = ints(sc), r = ints(rc), sd = displs(sc), rd = displs(rc);
  return check(MPI_Alltoallv(send, s.data(), sd.data(), mpi_type(dt), recv, r.data(), rd.data(),
                             mpi_type(dt), comm_),
               "all_to_allv");
}

Status MpiBackend::barrier() { return check(MPI_Barrier(comm_), "barrier"); }

Status MpiBackend::send(const void* buf, std::size_t count, DType dt, int dst, int tag) {
  SHOAL_ASSIGN_OR_RETURN(int n, to_int(count, "send"));
  return check(MPI_Send(buf, n, mpi_type(dt), dst, tag, comm_), "send");
}

Status MpiBackend::recv(void* buf, std::size_t count, DType dt, int src, int tag) {
  SHOAL_ASSIGN_OR_RETURN(int n, to_int(count, "recv"));
  MPI_Status st;
  SHOAL_RETURN_IF_ERROR(check(MPI_Recv(buf, n, mpi_type(dt), src, tag, comm_, &st), "recv"));
  int got = 0;
  MPI_Get_count(&st, mpi_type(dt), &got);
  if (got != n)
    return failed_precondition("recv from rank {}: got {} elements, expected {}", src, got, n);
  return ok_status();
}

Result<std::unique_ptr<MpiBackend>> MpiBackend::split(int color, int key) {
  MPI_Comm c;
  SHOAL_RETURN_IF_ERROR(
      check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &c), "split"));
  if (c == MPI_COMM_NULL) return std::unique_ptr<MpiBackend>();
  return std::make_unique<MpiBackend>(c);
}

}  // namespace shoal::comm
