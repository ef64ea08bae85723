#pragma once
/// @file cuda/nccl_mpi.hpp
/// `ckpt::cuda::nccl_over_mpi`: a `ckpt::cuda::nccl` over the ranks of an MPI communicator, the
/// NCCL unique id carried from rank 0 by MPI_Bcast. Needs MPI as well as CUDA and NCCL.
///
/// @code
/// MPI_Init(&argc, &argv);
/// auto comm = ckpt::cuda::nccl_over_mpi(MPI_COMM_WORLD, local_rank, my_stream);
/// ckpt::checkpointer<ckpt::gather_to_root<ckpt::cuda::nccl>, ckpt::posix, ckpt::raw, ckpt::cuda::device_copy> cp{
///     {.comm = comm}, "/ckpt/export", {}, {}, ckpt::cuda::device_copy{{}, my_stream}};
/// @endcode

// MPI itself (and the clear #error without it) comes as ckpt::mpi has it.
#include "../mpi.hpp"

#include <span>
#include <string>

#include "../error.hpp"
#include "nccl.hpp"

namespace ckpt::cuda {

/// Every rank of `comm` calls it at the same time (it is collective over `comm`, then over NCCL):
/// NCCL rank and size are the MPI ones; the unique id is made on rank 0 and broadcast.
inline nccl nccl_over_mpi(MPI_Comm comm, int device, cudaStream_t user_stream = nullptr, nccl_options options = {}) {
  // MPI's default handler aborts on errors; with MPI_ERRORS_RETURN they become ckpt::errors.
  const auto check_mpi = [](int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw error(error_kind::communication, std::string("cuda::nccl_over_mpi: ") + call + " failed: " +
                                               std::string(text, static_cast<std::size_t>(len)) + " (MPI error " +
                                               std::to_string(rc) + ")");
  };
  int rank = 0, size = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  return nccl(
      rank, size, device,
      [&](std::span<std::byte> id) {
        check_mpi(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, comm), "MPI_Bcast (the NCCL unique id)");
      },
      user_stream, options);
}

}  // namespace ckpt::cuda
