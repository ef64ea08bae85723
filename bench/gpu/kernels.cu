// The few kernels bench/gpu/gpu_proof.cpp needs, behind plain C++ functions so that the rest of
// the proof (and every ckpt header) is compiled by the host compiler, not nvcc.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels.hpp"

namespace {

__device__ unsigned char pattern_byte(std::uint64_t i, std::uint32_t seed, bool boolean) {
  const auto v = static_cast<unsigned char>(((i + seed) * 2654435761ull) >> 24);
  return boolean ? (v & 1u) : v;
}

__global__ void fill(unsigned char* p, std::uint64_t n, std::uint32_t seed, bool boolean, long long spin_cycles) {
  if (spin_cycles > 0 && blockIdx.x == 0 && threadIdx.x == 0) {
    // Make the kernel slow, so a save that does not wait for it would see the old bytes.
    const long long start = clock64();
    while (clock64() - start < spin_cycles) {
    }
  }
  __syncthreads();
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x)
    p[i] = pattern_byte(i, seed, boolean);
}

__global__ void count_mismatches_kernel(const unsigned char* p, std::uint64_t n, std::uint32_t seed, bool boolean,
                                 unsigned long long* bad) {
  unsigned long long mine = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x)
    mine += p[i] != pattern_byte(i, seed, boolean);
  if (mine) atomicAdd(bad, mine);
}

}  // namespace

namespace gpu_proof {

void fill_pattern(void* p, std::uint64_t n, std::uint32_t seed, bool boolean, cudaStream_t s, long long spin_cycles) {
  if (n == 0) return;
  fill<<<1024, 256, 0, s>>>(static_cast<unsigned char*>(p), n, seed, boolean, spin_cycles);
}

cudaError_t count_mismatches(const void* p, std::uint64_t n, std::uint32_t seed, bool boolean, std::uint64_t* bad) {
  *bad = 0;
  if (n == 0) return cudaSuccess;
  unsigned long long* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof *d);
  if (e != cudaSuccess) return e;
  unsigned long long h = ~0ull;
  if ((e = cudaMemset(d, 0, sizeof *d)) == cudaSuccess) {
    count_mismatches_kernel<<<1024, 256>>>(static_cast<const unsigned char*>(p), n, seed, boolean, d);
    if ((e = cudaGetLastError()) == cudaSuccess) e = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
  }
  const cudaError_t freed = cudaFree(d);
  if (e == cudaSuccess) e = freed;
  *bad = h;
  return e;
}

unsigned char host_pattern_byte(std::uint64_t i, std::uint32_t seed, bool boolean) {
  const auto v = static_cast<unsigned char>(((i + seed) * 2654435761ull) >> 24);
  return boolean ? (v & 1u) : v;
}

}  // namespace gpu_proof
