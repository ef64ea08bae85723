// libgpu_proof_kernels.so for machines without a GPU: the GPU proofs' two kernels
// (bench/gpu/kernels.cu) as host code on the fake CUDA runtime's streams (fake_cudart.cpp), so
// that the prepared proofs run here end to end.

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "../../../bench/gpu/kernels.hpp"

namespace fake_cudart {
void launch(cudaStream_t s, std::function<void()> kernel);
void finish_legacy();
}  // namespace fake_cudart

namespace gpu_proof {

unsigned char host_pattern_byte(std::uint64_t i, std::uint32_t seed, bool boolean) {
  const auto v = static_cast<unsigned char>(((i + seed) * 2654435761ull) >> 24);
  return boolean ? (v & 1u) : v;
}

void fill_pattern(void* p, std::uint64_t n, std::uint32_t seed, bool boolean, cudaStream_t s, long long spin_cycles) {
  if (n == 0) return;
  fake_cudart::launch(s, [=] {
    // About 2 GHz: the real kernel spins on clock64().
    if (spin_cycles > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(spin_cycles / 2));
    auto* b = static_cast<unsigned char*>(p);
    for (std::uint64_t i = 0; i < n; ++i) b[i] = host_pattern_byte(i, seed, boolean);
  });
}

cudaError_t count_mismatches(const void* p, std::uint64_t n, std::uint32_t seed, bool boolean, std::uint64_t* bad) {
  *bad = 0;
  if (n == 0) return cudaSuccess;
  // On the legacy default stream, as the real one: after the work of every blocking stream.
  std::uint64_t count = 0;
  fake_cudart::launch(nullptr, [&] {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::uint64_t i = 0; i < n; ++i) count += b[i] != host_pattern_byte(i, seed, boolean);
  });
  fake_cudart::finish_legacy();
  *bad = count;
  return cudaSuccess;
}

}  // namespace gpu_proof
