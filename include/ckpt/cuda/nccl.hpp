#pragma once
/// @file cuda/nccl.hpp
/// `ckpt::cuda::nccl`: the Communicator and Transport over NCCL, for jobs whose ranks each drive
/// one GPU. With `gather_to_root`, every rank's GPU tensors travel to rank 0 over NVLink or
/// InfiniBand chunk by chunk while rank 0 writes. Never included by ckpt.hpp; needs the CUDA
/// toolkit and NCCL (Meson: `ckpt_cuda_dep`). `<ckpt/cuda/nccl_mpi.hpp>` makes one from an
/// MPI communicator.
///
/// @code
/// #include <ckpt/ckpt.hpp>
/// #include <ckpt/cuda/device_copy.hpp>
/// #include <ckpt/cuda/nccl.hpp>
///
/// // Every rank: rank 0's unique id reaches the others through your own bootstrap.
/// ckpt::cuda::nccl comm{rank, size, local_rank,
///                       [&](std::span<std::byte> id) { store.broadcast_from_rank0(id); }, my_stream};
/// ckpt::checkpointer<ckpt::gather_to_root<ckpt::cuda::nccl>, ckpt::posix, ckpt::raw, ckpt::cuda::device_copy> cp{
///     {.comm = comm}, "/ckpt/export", {}, {}, ckpt::cuda::device_copy{{}, my_stream}};
/// cp.save(step, model);  // rank 0 writes one file holding every rank's shards
/// @endcode

#include "basic_nccl.hpp"
#include "nccl_api.hpp"
#include "runtime.hpp"

namespace ckpt::cuda {

/// basic_nccl on the real CUDA runtime and NCCL.
using nccl = basic_nccl<runtime, nccl_api>;

}  // namespace ckpt::cuda
