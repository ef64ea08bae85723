#pragma once
// Kernels of the GPU proof (kernels.cu), callable from host-compiled code.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gpu_proof {

/// Writes byte i of p[0, n) as a function of i and seed (0 or 1 only, for bool tensors) on
/// stream s; spin_cycles > 0 makes the kernel wait that long first. The caller checks the
/// launch (cudaGetLastError).
void fill_pattern(void* p, std::uint64_t n, std::uint32_t seed, bool boolean, cudaStream_t s, long long spin_cycles = 0);
/// How many bytes of p[0, n) differ from the pattern, into *bad (synchronous). Returns the
/// first CUDA error of its allocation, launch, copy or release; *bad is then meaningless.
cudaError_t count_mismatches(const void* p, std::uint64_t n, std::uint32_t seed, bool boolean, std::uint64_t* bad);
/// The pattern's byte i, computed on the host.
unsigned char host_pattern_byte(std::uint64_t i, std::uint32_t seed, bool boolean);

}  // namespace gpu_proof
