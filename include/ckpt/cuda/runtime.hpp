#pragma once
/// @file cuda/runtime.hpp
/// The CUDA runtime calls ckpt's GPU policies make, each checked: a failure throws
/// `runtime::failure` holding the runtime's own error string, which the policies turn into a
/// `ckpt::error` naming the call and the tensor. Link with cudart (Meson: `ckpt_cuda_dep`).

#if !__has_include(<cuda_runtime_api.h>)
#error "ckpt/cuda needs the CUDA toolkit's <cuda_runtime_api.h> (e.g. -I/usr/local/cuda/include) and cudart; the core ckpt headers do not need CUDA"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace ckpt::cuda {

/// What basic_device_copy needs of a runtime, on the real one. Destroying a null handle does
/// nothing, so a half-built context can always be released.
struct runtime {
  using stream = cudaStream_t;
  using event = cudaEvent_t;

  struct failure : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  static void check(cudaError_t e) {
    if (e != cudaSuccess) throw failure(std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
  }

  void set_device(int d) { check(cudaSetDevice(d)); }
  /// Portable: the buffers device_copy lends its pipelines serve tensors on every GPU, and
  /// pinned memory is only pinned for other devices' contexts when it says so.
  void* host_alloc(std::size_t n) {
    void* p = nullptr;
    check(cudaHostAlloc(&p, n, cudaHostAllocPortable));
    return p;
  }
  void host_free(void* p) noexcept { cudaFreeHost(p); }
  void* device_alloc(std::size_t n) {
    void* p = nullptr;
    check(cudaMalloc(&p, n));
    return p;
  }
  void device_free(void* p) noexcept {
    if (p) cudaFree(p);
  }
  /// Non-blocking: ckpt's copies never wait on the legacy default stream by accident; the
  /// ordering with the user's stream is made explicit with events instead.
  stream make_stream() {
    stream s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  event make_event() {
    event e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void destroy(stream s) noexcept {
    if (s) cudaStreamDestroy(s);
  }
  void destroy(event e) noexcept {
    if (e) cudaEventDestroy(e);
  }
  void copy_async(void* dst, const void* src, std::size_t n, stream s) { check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s)); }
  void record(event e, stream s) { check(cudaEventRecord(e, s)); }
  void wait(stream s, event e) { check(cudaStreamWaitEvent(s, e, 0)); }
  void sync(event e) { check(cudaEventSynchronize(e)); }
  void sync(stream s) { check(cudaStreamSynchronize(s)); }
  /// Whether everything enqueued on `s` has run. A watchdog polls this instead of blocking in
  /// cudaStreamSynchronize, which never returns if a peer never answers. cudaErrorNotReady is
  /// an answer, not an error (and it is not sticky: nothing to clear).
  bool query(stream s) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaErrorNotReady) return false;
    check(e);
    return true;
  }
};

}  // namespace ckpt::cuda
