#pragma once
// This process's rank and the job's size in MPI_COMM_WORLD, for tests under mpirun.

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

inline int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
