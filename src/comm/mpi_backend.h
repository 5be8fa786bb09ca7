// The MPI backend: the Communicator API over an MPI library (OpenMPI from
// libopenmpi-dev), chosen with SHOAL_COMM_BACKEND=mpi under mpirun. Calls
// are serialized by the Communicator (MPI_THREAD_SERIALIZED). f16/bf16 are
// widened to f32 around the MPI call (f32 accumulation, as the native
// backend); avg is a sum divided by the size. Errors are returned (not
// fatal) and carry MPI's own message. Private to comm.
#pragma once

// C API only: OpenMPI would otherwise pull in its deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "shoal/comm/communicator.h"

namespace shoal::comm {

class MpiBackend {
 public:
  // Initializes MPI if nobody has, and duplicates MPI_COMM_WORLD.
  static Result<std::unique_ptr<MpiBackend>> init();
  explicit MpiBackend(MPI_Comm c);
  // The library's own first line of MPI_Get_library_version.
  static std::string library();
  ~MpiBackend();
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Ranks of this communicator that share this rank's node
  // (MPI_COMM_TYPE_SHARED), itself included.
  int local_size() const { return local_size_; }

  Status allreduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op);
  Status reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp op, int root);
  Status broadcast(void* buf, std::size_t count, DType dt, int root);
  Status allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dt);
  Status reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                        DType dt, ReduceOp op);
  Status gather(const void* send, void* recv, std::size_t count, DType dt, int root);
  Status scatter(const void* send, void* recv, std::size_t count, DType dt, int root);
  Status all_to_allv(const void* send, const std::vector<std::size_t>& sc, void* recv,
                     const std::vector<std::size_t>& rc, DType dt);
  Status barrier();
  Status send(const void* buf, std::size_t count, DType dt, int dst, int tag);
  Status recv(void* buf, std::size_t count, DType dt, int src, int tag);
  Result<std::unique_ptr<MpiBackend>> split(int color, int key);

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, local_size_ = 1;
};

}  // namespace shoal::comm
