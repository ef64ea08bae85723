// Compiles and links ckpt::cuda::nccl_over_mpi (running it needs GPUs and mpirun). Run without
// a GPU, it only says so.

#include <ckpt/cuda/nccl_mpi.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--run") {
    MPI_Init(&argc, &argv);
    auto comm = ckpt::cuda::nccl_over_mpi(MPI_COMM_WORLD, 0);
    comm.barrier();
    std::printf("rank %d of %d: barrier over NCCL ok\n", comm.rank(), comm.size());
    comm = {};
    MPI_Finalize();
    return 0;
  }
  std::printf("nccl_over_mpi compiled and linked; run with --run under mpirun on GPUs\n");
  return 0;
}
