// ckpt::cuda::nccl on real CUDA and NCCL, at one rank on GPU 0: compiled and linked wherever the
// CUDA toolkit and NCCL are (CI included); run only where there is a GPU (exit 77, skipped,
// otherwise). The multi-rank behaviour is tested on fakes (test_nccl.cpp); this checks that
// the real calls are made correctly.

#include <cuda_runtime_api.h>

#include <ckpt/cuda/nccl.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <span>
#include <string>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  std::printf("%s: %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) ++failures;
}

/// A non-blocking communicator takes no call until ncclCommGetAsyncError says ncclSuccess.
bool wait_ready(ckpt::cuda::nccl_api& api, ckpt::cuda::nccl_api::comm c) {
  std::string what;
  for (int i = 0; i < 600'000; ++i) {
    const auto st = api.status(c, what);
    if (st == ckpt::cuda::nccl_status::ready) return true;
    if (st == ckpt::cuda::nccl_status::failed) {
      std::printf("NCCL failed: %s\n", what.c_str());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::printf("NCCL stayed in progress for a minute\n");
  return false;
}

std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 31 + 7) & 0xff);
  return b;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: the real-NCCL test is skipped (it compiled and linked)\n");
    return 77;
  }
  try {
    // Small pieces, so that the messages below cross several of them.
    ckpt::cuda::nccl comm{0, 1, 0, [](std::span<std::byte>) {}, nullptr, {.transfer_bytes = std::size_t{1} << 20, .timeout = std::chrono::seconds{10}}};
    // The caller's current device and last-error slot, which ckpt must leave as they are.
    int before = -1;
    cudaGetDevice(&before);
    comm.barrier();
    expect(true, "barrier at 1 rank");
    auto big = pattern((std::size_t{3} << 20) + 5);
    auto b = big;
    comm.broadcast(b, 0);
    expect(b == big, "broadcast of 3 MiB + 5 bytes");
    auto all = comm.all_gather(big);
    expect(all.size() == 1 && all[0] == big, "all_gather of 3 MiB + 5 bytes");
    auto gathered = comm.gather(big, 0);
    expect(gathered.size() == 1 && gathered[0] == big, "gather to rank 0");
    expect(comm.all_reduce_max(42) == 42, "all_reduce_max");
    try {
      comm.send_host(big, 0);
      expect(false, "a send to itself is refused");
    } catch (const ckpt::error&) {
      expect(true, "a send to itself is refused");
    }
    int after = -1;
    cudaGetDevice(&after);
    expect(after == before, "the caller's current device is unchanged");
    expect(cudaPeekAtLastError() == cudaSuccess, "nothing left in the last-error slot (the watchdog met cudaErrorNotReady)");

    // The point-to-point wrappers, on a communicator of their own: a send to itself and the
    // matching receive, grouped (NCCL needs both in one group at one rank).
    ckpt::cuda::nccl_api api;
    ckpt::cuda::runtime rt;
    const auto id = api.make_unique_id();
    auto c = api.init_rank(1, id, 0);
    expect(wait_ready(api, c), "non-blocking ncclCommInitRank completes");
    auto s = rt.make_stream();
    const std::size_t n = 1000003;
    auto* src = static_cast<std::byte*>(rt.device_alloc(n));
    auto* dst = static_cast<std::byte*>(rt.device_alloc(n));
    auto host = pattern(n), back = std::vector<std::byte>(n);
    // From pageable memory cudaMemcpy may return before its DMA has landed, and `s` is a
    // non-blocking stream that does not wait for it: synchronise before NCCL reads `src`.
    expect(cudaMemcpy(src, host.data(), n, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy to the device");
    expect(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    api.group_start();
    api.send(src, n, 0, c, s);
    api.recv(dst, n, 0, c, s);
    api.group_end();
    expect(wait_ready(api, c), "the grouped send and receive were taken");
    bool drained = false;
    for (int i = 0; i < 100'000 && !(drained = rt.query(s)); ++i) {
      rt.clear_error();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    expect(drained, "the grouped send and receive completed within 10 s");
    std::string what;
    expect(api.status(c, what) == ckpt::cuda::nccl_status::ready, "no asynchronous error");
    expect(cudaMemcpy(back.data(), dst, n, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy to the host");
    expect(back == host, "ncclSend and ncclRecv to itself, grouped");
    rt.device_free(src);
    rt.device_free(dst);
    rt.destroy(s);
    api.destroy(c);
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", failures ? "some checks FAILED" : "all checks passed");
  return failures ? 1 : 0;
}
