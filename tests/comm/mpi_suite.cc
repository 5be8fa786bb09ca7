// The collective checks of communicator_test over the MPI backend: run as
// `SHOAL_COMM_BACKEND=mpi mpirun -n N mpi_suite` (ctest does, for N = 1..4
// and 5 oversubscribed). Every rank runs every check; the exit code is
// non-zero on the first wrong element, with the check and rank named.
#include <cstdio>

#include "comm/checks.h"
#include "shoal/core/env.h"

using namespace shoal;
using namespace shoal::comm;
using namespace shoal::comm::testing;

int main() {
  auto c = Communicator::from_env();
  if (!c.ok()) {
    std::fprintf(stderr, "mpi_suite: %s\n", c.status().to_string().c_str());
    return 2;
  }
  Communicator& comm = **c;
  if (std::string(comm.backend()) != "mpi") {
    std::fprintf(stderr, "mpi_suite: backend is %s; set SHOAL_COMM_BACKEND=mpi\n", comm.backend());
    return 2;
  }
  struct Check {
    const char* name;
    Status (*fn)(Communicator&);
  } checks[] = {{"allreduce matrix", check_allreduce_matrix},
                {"rooted", check_rooted},
                {"uneven", check_uneven},
                {"async+split", comm.size() == 5 ? check_async_split : nullptr}};
  int bad = 0;
  // mpirun starts every rank on this host: all are local.
  if (comm.local_size() != comm.size()) {
    std::fprintf(stderr, "mpi_suite rank %d/%d: local_size() is %d\n", comm.rank(), comm.size(),
                 comm.local_size());
    bad = 1;
  }
  for (const auto& ch : checks) {
    if (ch.fn == nullptr) continue;
    Status st = ch.fn(comm);
    if (!st.ok()) {
      std::fprintf(stderr, "mpi_suite rank %d/%d: %s: %s\n", comm.rank(), comm.size(), ch.name,
                   st.to_string().c_str());
      bad = 1;
    }
  }
  if (comm.rank() == 0 && !bad)
    std::printf("mpi_suite: all checks passed on %d ranks\n", comm.size());
  return bad;
}
