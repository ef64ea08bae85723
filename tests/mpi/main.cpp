// doctest under mpirun: every rank runs every test case in the same order (the checkpointer's
// calls are collective), and the job fails when any rank saw a failure.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  // save_async uses ckpt's communicator from a background thread, which MPI allows only at
  // MPI_THREAD_MULTIPLE.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context ctx(argc, argv);
  if (rank != 0) ctx.setOption("minimal", true);  // rank 0 reports in full, the others only failures
  const int failed = ctx.run() != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) std::fprintf(stderr, "rank %d: test failures\n", rank);
  MPI_Finalize();
  return any;
}
