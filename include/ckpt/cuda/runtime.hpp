#pragma once
/// @file cuda/runtime.hpp
/// The CUDA runtime calls ckpt's GPU policies make, each checked: a failure throws
/// `runtime::failure` holding the runtime's own error string, which the policies turn into a
/// `ckpt::error` naming the call and the tensor. Link with cudart (Meson: `ckpt_cuda_dep`).

#if !__has_include(<cuda_runtime_api.h>)
#error "ckpt/cuda needs the CUDA toolkit's <cuda_runtime_api.h> (e.g. -I/usr/local/cuda/include) and cudart; the core ckpt headers do not need CUDA"
#endif

#include <cuda.h>  // the driver's types only: its two functions are looked up through cudart
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

  /// Clears the calling thread's last-error slot (cudaGetLastError). A failure the runtime
  /// reported stays there until someone reads it, and a host engine's next launch check
  /// (PyTorch's C10_CUDA_KERNEL_LAUNCH_CHECK, for one) would report ckpt's error as its own:
  /// the policies call this after every failure they report or recover from, and after a
  /// not-ready query.
  void clear_error() noexcept { (void)cudaGetLastError(); }

  /// What the calling thread has current, to be put back by `restore_device`: its CUDA
  /// context, read through the driver (cudart 12 and later makes a device's context when
  /// cudaSetDevice selects it, so putting back "device 0" on a thread that had nothing current
  /// would make a context on GPU 0). Where the driver's functions cannot be looked up, the
  /// runtime's current device instead.
  struct device_state {
    CUcontext context = nullptr;
    int device = -1;
    bool exact = false;  ///< `context` was read from the driver
  };
  device_state current_device() noexcept {
    device_state s;
    if (const auto& d = driver(); d.get) {
      CUcontext c = nullptr;
      if (d.get(&c) == CUDA_SUCCESS) {
        s.context = c;
        s.exact = true;
        return s;
      }
    }
    int dev = -1;
    if (cudaGetDevice(&dev) == cudaSuccess)
      s.device = dev;
    else
      clear_error();
    return s;
  }
  void restore_device(const device_state& s) noexcept {
    if (s.exact) {
      driver().set(s.context);
    } else if (s.device >= 0) {
      if (cudaSetDevice(s.device) != cudaSuccess) clear_error();
    }
  }
  void set_device(int d) { check(cudaSetDevice(d)); }

  /// The device a stream belongs to, or -1 for the streams that belong to whichever device is
  /// current (the legacy default stream and the per-thread default stream).
  int stream_device(stream s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return -1;
#if CUDART_VERSION >= 12080
    int d = -1;
    check(cudaStreamGetDevice(s, &d));
    return d;
#else
    return -1;  // not knowable before CUDA 12.8: taken to be the tensor's device
#endif
  }
  /// Portable: the buffers device_copy lends its pipelines serve tensors on every GPU, and
  /// pinned memory is only pinned for other devices' contexts when it says so.
  void* host_alloc(std::size_t n) {
    void* p = nullptr;
    check(cudaHostAlloc(&p, n, cudaHostAllocPortable));
    return p;
  }
  void host_free(void* p) noexcept {
    if (cudaFreeHost(p) != cudaSuccess) clear_error();
  }
  void* device_alloc(std::size_t n) {
    void* p = nullptr;
    check(cudaMalloc(&p, n));
    return p;
  }
  void device_free(void* p) noexcept {
    if (p && cudaFree(p) != cudaSuccess) clear_error();
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
    if (s && cudaStreamDestroy(s) != cudaSuccess) clear_error();
  }
  void destroy(event e) noexcept {
    if (e && cudaEventDestroy(e) != cudaSuccess) clear_error();
  }
  void copy_async(void* dst, const void* src, std::size_t n, stream s) { check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s)); }
  void record(event e, stream s) { check(cudaEventRecord(e, s)); }
  void wait(stream s, event e) { check(cudaStreamWaitEvent(s, e, 0)); }
  void sync(event e) { check(cudaEventSynchronize(e)); }
  void sync(stream s) { check(cudaStreamSynchronize(s)); }
  /// Whether everything enqueued on `s` has run. A watchdog polls this instead of blocking in
  /// cudaStreamSynchronize, which never returns if a peer never answers. cudaErrorNotReady is
  /// an answer, not an error (and it is not sticky: nothing to clear).
  /// cudaErrorNotReady is an answer, not an error, but the runtime records it in the thread's
  /// last-error slot like one: the caller clears it (clear_error).
  bool query(stream s) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaErrorNotReady) return false;
    check(e);
    return true;
  }

 private:
  struct driver_calls {
    CUresult (*get)(CUcontext*) = nullptr;
    CUresult (*set)(CUcontext) = nullptr;
  };
  /// cuCtxGetCurrent and cuCtxSetCurrent, from the driver cudart has loaded: no link to libcuda.
  static const driver_calls& driver() {
    static const driver_calls calls = [] {
      driver_calls c;
      void* get = nullptr;
      void* set = nullptr;
      cudaDriverEntryPointQueryResult found_get{}, found_set{};
#if CUDART_VERSION >= 12050
      const bool ok = cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &found_get) == cudaSuccess &&
                      cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &found_set) == cudaSuccess;
#else
      const bool ok = cudaGetDriverEntryPoint("cuCtxGetCurrent", &get, cudaEnableDefault, &found_get) == cudaSuccess &&
                      cudaGetDriverEntryPoint("cuCtxSetCurrent", &set, cudaEnableDefault, &found_set) == cudaSuccess;
#endif
      if (ok && found_get == cudaDriverEntryPointSuccess && found_set == cudaDriverEntryPointSuccess && get && set) {
        c.get = reinterpret_cast<CUresult (*)(CUcontext*)>(get);
        c.set = reinterpret_cast<CUresult (*)(CUcontext)>(set);
      }
      (void)cudaGetLastError();  // a failed look-up is not the caller's error
      return c;
    }();
    return calls;
  }
};

}  // namespace ckpt::cuda
