#pragma once
/// @file cuda/device_copy.hpp
/// `ckpt::cuda::device_copy`: the DevicePolicy for models whose tensors live on GPUs. Never
/// included by ckpt.hpp; needs the CUDA toolkit (headers and cudart).
///
/// @code
/// #include <ckpt/cuda/device_copy.hpp>
/// float* w;  cudaMalloc(&w, n * sizeof(float));
/// struct model { float* w; std::uint64_t n;
///   template <class V> void checkpoint(V& v) { v.tensor("w", ckpt::view(w, {n}, ckpt::device::cuda(0))); } };
/// ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::raw, ckpt::cuda::device_copy> cp{
///     {}, "/ckpt/run1", {}, {}, ckpt::cuda::device_copy{{}, my_stream}};
/// cp.save(step, m);  // waits for the kernels already on my_stream, then copies through pinned buffers
/// @endcode

#include "basic_device_copy.hpp"
#include "runtime.hpp"

namespace ckpt::cuda {

using device_copy = basic_device_copy<runtime>;

}  // namespace ckpt::cuda
