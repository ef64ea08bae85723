// libcudart.so.13 for machines without a GPU: the CUDA runtime's C API, the calls ckpt and the
// GPU proofs make, on the fake runtime of fake_runtime.hpp (streams are threads, "device
// memory" is host memory). With it first on LD_LIBRARY_PATH, the very binaries that
// bench/gpu/prepare.sh builds for the GPU machine run here, end to end: ckpt::cuda::runtime's
// real code, the proofs' sections and bench/gpu/device_run.sh's handling of their results.
//
// The rules of the fake runtime hold through it: the current device is per thread; streams
// and events belong to a device, and an event recorded on another device's stream fails with
// cudaErrorInvalidResourceHandle; every failure and every not-ready query is left in the
// calling thread's last-error slot until cudaGetLastError takes it. The legacy default stream
// waits for every blocking stream, and they for it, as in CUDA; non-blocking streams do not.
//
// CKPT_FAKE_GPUS sets the number of devices (default 1); CKPT_FAKE_FAIL=call:n plants a failure.

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>

#include "../fake_runtime.hpp"

namespace {

fake::runtime& rt() {
  static fake::runtime* r = [] {
    auto* x = new fake::runtime;  // never destroyed: streams may outlive static destruction
    x->st->copy_delay = std::chrono::microseconds{20};
    // CKPT_FAKE_FAIL=call:n makes the fake runtime's n-th `call` fail (fake_runtime.hpp's
    // names: copy_async, host_alloc, make_event, ...), for tests of what reports a failure.
    if (const char* f = std::getenv("CKPT_FAKE_FAIL")) {
      const std::string spec = f;
      if (const auto colon = spec.find(':'); colon != std::string::npos)
        x->st->fail_on[spec.substr(0, colon)] = {std::atoi(spec.c_str() + colon + 1),
                                                 "cudaErrorIllegalAddress: an illegal memory access was encountered (planted: CKPT_FAKE_FAIL)"};
    }
    return x;
  }();
  return *r;
}

int device_count() {
  static const int n = [] {
    const char* e = std::getenv("CKPT_FAKE_GPUS");
    const int v = e ? std::atoi(e) : 1;
    return v < 0 ? 0 : v;
  }();
  return n;
}

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

/// The streams that exist, and which of them are blocking (synchronise with the legacy stream).
/// Waiting on streams holds the table shared, destroying one holds it alone: a stream another
/// thread is draining is not freed under it.
struct stream_table {
  std::shared_mutex mu;
  std::set<fake::stream_impl*> blocking, non_blocking;
};
stream_table& streams() {
  static auto* t = new stream_table;
  return *t;
}

bool legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }
fake::stream_impl* impl(cudaStream_t s) { return legacy(s) ? nullptr : reinterpret_cast<fake::stream_impl*>(s); }

/// What the legacy default stream's implicit synchronisation amounts to here: work on it waits
/// for every blocking stream (the fake runs "kernels" on it after those drain).
/// The legacy stream is per device: it waits for the blocking streams of the current device.
void drain_blocking() {
  const int device = std::max(rt().current_device(), 0);
  {
    std::shared_lock lock(streams().mu);
    for (auto* s : streams().blocking)
      if (s->device() == device) rt().finish(s);
  }
  rt().finish(nullptr);
}

/// A call into the fake runtime: its failure becomes a CUDA error in the thread's slot.
template <class F>
cudaError_t guarded(F&& f, cudaError_t on_failure = cudaErrorInvalidResourceHandle) {
  try {
    f();
    return cudaSuccess;
  } catch (const fake::runtime::failure& e) {
    const std::string w = e.what();
    if (w.find("cudaErrorMemoryAllocation") != std::string::npos) return fail(cudaErrorMemoryAllocation);
    if (w.find("cudaErrorIllegalAddress") != std::string::npos) return fail(cudaErrorIllegalAddress);
    return fail(on_failure);
  }
}

bool valid_device(int d) { return d >= 0 && d < device_count(); }

}  // namespace

// ----- the fake driver's two calls, reached through cudaGetDriverEntryPointByVersion ----------
// A context is device + 1 as a pointer; null is none.

namespace {
CUresult fake_ctx_get_current(CUcontext* c) {
  const int d = rt().current_device();
  *c = d < 0 ? nullptr : reinterpret_cast<CUcontext>(static_cast<std::intptr_t>(d + 1));
  return CUDA_SUCCESS;
}
CUresult fake_ctx_set_current(CUcontext c) {
  rt().restore_device(c == nullptr ? -1 : static_cast<int>(reinterpret_cast<std::intptr_t>(c) - 1));
  return CUDA_SUCCESS;
}
}  // namespace

extern "C" {

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  *fn = nullptr;
  if (std::strcmp(symbol, "cuCtxGetCurrent") == 0) *fn = reinterpret_cast<void*>(&fake_ctx_get_current);
  if (std::strcmp(symbol, "cuCtxSetCurrent") == 0) *fn = reinterpret_cast<void*>(&fake_ctx_set_current);
  if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

// ----- errors ---------------------------------------------------------------------------------

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  rt().clear_error();
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    default: return "unknown error (fake CUDA runtime)";
  }
}

// ----- devices --------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* n) {
  *n = device_count();
  return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (!valid_device(d)) return fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "fake GPU %d (tests/cuda/fake_libs)", d);
  p->totalGlobalMem = std::size_t{16} << 30;
  p->major = 9;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (!valid_device(d)) return fail(cudaErrorInvalidDevice);
  return guarded([&] { rt().set_device(d); });
}
cudaError_t cudaGetDevice(int* d) {
  const int c = rt().current_device();
  *d = c < 0 ? 0 : c;  // CUDA's default device
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  const int device = std::max(rt().current_device(), 0);
  {
    std::shared_lock lock(streams().mu);
    for (const auto* set : {&streams().blocking, &streams().non_blocking})
      for (auto* s : *set)
        if (s->device() == device) rt().finish(s);
  }
  rt().finish(nullptr);
  return cudaSuccess;
}

// ----- memory ---------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** p, std::size_t n) {
  return guarded([&] { *p = rt().device_alloc(n); }, cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  rt().device_free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, std::size_t n, unsigned int) {
  return guarded([&] { *p = rt().host_alloc(n); }, cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocHost(void** p, std::size_t n) { return cudaHostAlloc(p, n, 0); }
cudaError_t cudaFreeHost(void* p) {
  rt().host_free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind, cudaStream_t s) {
  if (legacy(s)) drain_blocking();
  return guarded([&] { rt().copy_async(dst, src, n, impl(s)); });
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, nullptr);
  if (e != cudaSuccess) return e;
  rt().finish(nullptr);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t s) {
  if (legacy(s)) drain_blocking();
  rt().launch(impl(s), [p, v, n] { std::memset(p, v, n); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, std::size_t n) {
  cudaMemsetAsync(p, v, n, nullptr);
  rt().finish(nullptr);
  return cudaSuccess;
}

// ----- streams and events ---------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  fake::stream_impl* made = nullptr;
  const bool non_blocking = (flags & cudaStreamNonBlocking) != 0;
  const cudaError_t e = guarded([&] { made = non_blocking ? rt().make_stream() : rt().user_stream("user"); });
  if (e != cudaSuccess) return e;
  {
    std::unique_lock lock(streams().mu);
    (non_blocking ? streams().non_blocking : streams().blocking).insert(made);
  }
  *s = reinterpret_cast<cudaStream_t>(made);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  auto* p = impl(s);
  if (!p) return fail(cudaErrorInvalidResourceHandle);
  bool counted = false;
  {
    // Once no drain holds the table, none can reach the stream: it is freed outside the lock.
    std::unique_lock lock(streams().mu);
    counted = streams().non_blocking.erase(p) > 0;
    streams().blocking.erase(p);
  }
  if (counted)
    rt().destroy(p);  // made by make_stream, which counts it
  else
    delete p;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (legacy(s)) drain_blocking();
  return guarded([&] { rt().sync(impl(s)); });
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (legacy(s)) drain_blocking();
  if (rt().query(impl(s))) return cudaSuccess;
  return fail(cudaErrorNotReady);
}
cudaError_t cudaStreamGetDevice(cudaStream_t s, int* d) {
  auto* p = impl(s);
  if (!p) {
    const int c = rt().current_device();
    *d = c < 0 ? 0 : c;
    return cudaSuccess;
  }
  *d = p->device();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  return guarded([&] { rt().wait(impl(s), reinterpret_cast<fake::event_impl*>(e)); });
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  return guarded([&] { *e = reinterpret_cast<cudaEvent_t>(rt().make_event()); });
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  rt().destroy(reinterpret_cast<fake::event_impl*>(e));
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (legacy(s)) drain_blocking();
  return guarded([&] { rt().record(reinterpret_cast<fake::event_impl*>(e), impl(s)); });
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return guarded([&] { rt().sync(reinterpret_cast<fake::event_impl*>(e)); });
}

}  // extern "C"

// ----- for fake_kernels.cpp: a "kernel" on a stream ---------------------------------------------

namespace fake_cudart {
void launch(cudaStream_t s, std::function<void()> kernel) {
  if (legacy(s)) drain_blocking();
  rt().launch(impl(s), std::move(kernel));
}
void finish_legacy() {
  drain_blocking();
}
}  // namespace fake_cudart
