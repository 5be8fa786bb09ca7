/* OpenMPI peer for bench/comm.py: MPI_Allreduce(MPI_IN_PLACE, f32, sum) at
 * the sizes `shoal bench comm` uses, timed the same way (warm-up 3, then
 * enough iterations for ~0.3 s, max over ranks). Prints one line per size:
 * bytes time_us. Build: mpicc -O2 -o mpi_allreduce mpi_allreduce.c */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t max_bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (256u << 20);
  double min_s = argc > 2 ? atof(argv[2]) : 0.3;
  float* buf = malloc(max_bytes);
  for (size_t i = 0; i < max_bytes / 4; ++i) buf[i] = (float)(i % 7);
  for (size_t bytes = 4; bytes <= max_bytes; bytes *= 4) {
    int count = (int)(bytes / 4);
    for (int w = 0; w < 3; ++w) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double one = MPI_Wtime() - t0;
    long iters = (long)(min_s / (one > 1e-7 ? one : 1e-7));
    if (iters < 5) iters = 5;
    if (iters > 2000) iters = 2000;
    MPI_Allreduce(MPI_IN_PLACE, &iters, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (long i = 0; i < iters; ++i)
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double us = (MPI_Wtime() - t0) * 1e6 / (double)iters;
    MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      printf("%zu %.3f\n", bytes, us);
      fflush(stdout);
    }
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
