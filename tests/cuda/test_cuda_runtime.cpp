// ckpt::cuda::device_copy on the real CUDA runtime: compiled and linked wherever the CUDA
// toolkit is (CI included); run only where there is a GPU (exit 77, skipped, otherwise).
// bench/gpu/run.sh is the full proof on a GPU; this is the quick one the suite runs.

#include <cuda_runtime_api.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/cuda/device_copy.hpp>

#include <cstdio>
#include <numeric>
#include <vector>

namespace {

struct gpu_weight {
  float* w = nullptr;
  std::uint64_t n = 0;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::view(w, {n}, ckpt::device::cuda(0)));
  }
};

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: the real-runtime test is skipped (it compiled and linked)\n");
    return 77;
  }
  gpu_weight m;
  m.n = (std::uint64_t{3} << 20) + 5;  // a few slots of the pinned ring, and a partial one
  std::vector<float> host(m.n), back(m.n, -1.f);
  std::iota(host.begin(), host.end(), 0.f);
  void* d = nullptr;
  if (cudaMalloc(&d, m.n * sizeof(float)) != cudaSuccess) return 1;
  m.w = static_cast<float*>(d);
  cudaMemcpy(m.w, host.data(), m.n * sizeof(float), cudaMemcpyHostToDevice);
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, ckpt::raw, ckpt::cuda::device_copy> cp{{}, mem};
  // The engine's current device: the last GPU, so that on a machine with several the tensor's
  // (cuda:0) is another one; ckpt must put it back.
  const int engine = devices - 1;
  if (cudaSetDevice(engine) != cudaSuccess) return 1;
  cp.save(1, m);
  int after_save = -1;
  cudaGetDevice(&after_save);
  if (cudaSetDevice(0) != cudaSuccess || cudaMemset(m.w, 0, m.n * sizeof(float)) != cudaSuccess) return 1;
  if (cudaSetDevice(engine) != cudaSuccess) return 1;
  cp.load(m);
  int after_load = -1;
  cudaGetDevice(&after_load);
  const bool clean = cudaPeekAtLastError() == cudaSuccess;
  const bool copied = cudaMemcpy(back.data(), m.w, m.n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(m.w);
  const bool ok = copied && back == host;
  const bool kept = after_save == engine && after_load == engine;
  std::printf("device_copy round trip on %d GPU(s): %s\n", devices, ok ? "ok" : "FAILED");
  std::printf("the caller's current device (cuda:%d) put back after save and load: %s\n", engine, kept ? "ok" : "FAILED");
  std::printf("nothing left in the last-error slot: %s\n", clean ? "ok" : "FAILED");
  return ok && kept && clean ? 0 : 1;
}
