// libnccl.so.2 for machines without a GPU: NCCL's C API, the calls ckpt::cuda::nccl_api and the
// GPU proofs make, on the fake NCCL of fake_nccl.hpp, whose operations run on the fake CUDA
// runtime's streams (fake_cudart.cpp). Ranks are threads of one process. Communicators are
// non-blocking when their config says blocking = 0, as ckpt's are: ncclCommInitRankConfig
// returns ncclInProgress until every rank has joined, and no call may be made meanwhile.

#include <errno.h>  // program_invocation_short_name
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "../fake_nccl.hpp"

namespace {

fake::nccl_api& api() {
  static auto* a = [] {
    auto* x = new fake::nccl_api;  // never destroyed: stream threads may still hold communicators
    x->st->patience = std::chrono::milliseconds{120'000};
    // CKPT_FAKE_NCCL_DROP_SEND=n: the n-th send of the process is taken and never delivered,
    // as a peer that died mid-transfer would leave it (tests of the watchdog's report).
    // CKPT_FAKE_NCCL_DROP_SEND=program:n limits it to one program (by its name).
    if (const char* d = std::getenv("CKPT_FAKE_NCCL_DROP_SEND")) {
      const std::string spec = d;
      const auto colon = spec.find(':');
      if (colon == std::string::npos)
        x->st->drop_send = std::atoi(d);
      else if (spec.substr(0, colon) == program_invocation_short_name)
        x->st->drop_send = std::atoi(spec.c_str() + colon + 1);
    }
    return x;
  }();
  return *a;
}

struct comm_box {
  fake::nccl_api::comm c;
  bool blocking = true;
};
comm_box* box(ncclComm_t c) { return reinterpret_cast<comm_box*>(c); }

thread_local std::string last_error;
thread_local bool in_group = false;

template <class F>
ncclResult_t guarded(F&& f) {
  try {
    f();
    return ncclSuccess;
  } catch (const fake::nccl_api::failure& e) {
    last_error = e.what();
    return static_cast<ncclResult_t>(e.code);
  } catch (const std::exception& e) {
    last_error = e.what();
    return ncclInvalidUsage;
  }
}

fake::stream_impl* impl(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return nullptr;  // the fake refuses it
  return reinterpret_cast<fake::stream_impl*>(s);
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }
ncclResult_t ncclGetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  return guarded([&] {
    const auto u = api().make_unique_id();
    static_assert(sizeof u.bytes == sizeof id->internal);
    std::memcpy(id->internal, u.bytes.data(), sizeof id->internal);
  });
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int n, ncclUniqueId id, int rank, ncclConfig_t* config) {
  *out = nullptr;
  fake::nccl_api::unique_id u;
  std::memcpy(u.bytes.data(), id.internal, sizeof id.internal);
  auto b = std::make_unique<comm_box>();
  b->blocking = !(config && config->blocking == 0);
  const ncclResult_t r = guarded([&] { b->c = api().init_rank(n, u, rank); });
  if (r != ncclSuccess) return r;
  std::string what;
  const bool joining = api().status(b->c, what) == ckpt::cuda::nccl_status::in_progress;
  if (b->blocking)
    while (api().status(b->c, what) == ckpt::cuda::nccl_status::in_progress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const bool blocking = b->blocking;
  *out = reinterpret_cast<ncclComm_t>(b.release());
  return joining && !blocking ? ncclInProgress : ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* out, int n, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, n, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* state) {
  if (!c) return ncclInvalidArgument;
  std::string what;
  ckpt::cuda::nccl_status st = ckpt::cuda::nccl_status::ready;
  const ncclResult_t r = guarded([&] { st = api().status(box(c)->c, what); });
  if (r != ncclSuccess) return r;
  if (st == ckpt::cuda::nccl_status::failed) last_error = what;
  *state = st == ckpt::cuda::nccl_status::ready ? ncclSuccess : st == ckpt::cuda::nccl_status::in_progress ? ncclInProgress : ncclRemoteError;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  api().abort(box(c)->c);
  delete box(c);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclSuccess;
  api().destroy(box(c)->c);
  delete box(c);
  return ncclSuccess;
}

/// An operation on a non-blocking communicator that is connecting to a new peer returns
/// ncclInProgress, as NCCL's do; a blocking one waits for the connection itself.
static ncclResult_t after_enqueue(ncclComm_t c) {
  if (in_group) return ncclSuccess;  // deferred to the group's end
  std::string what;
  const bool busy = api().status(box(c)->c, what) == ckpt::cuda::nccl_status::in_progress;
  if (!busy) return ncclSuccess;
  if (!box(c)->blocking) return ncclInProgress;
  while (api().status(box(c)->c, what) == ckpt::cuda::nccl_status::in_progress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* data, std::size_t count, ncclDataType_t type, int peer, ncclComm_t c, cudaStream_t s) {
  if (type != ncclUint8 && type != ncclInt8) return ncclInvalidArgument;
  const ncclResult_t r = guarded([&] { api().send(data, count, peer, box(c)->c, impl(s)); });
  return r == ncclSuccess ? after_enqueue(c) : r;
}
ncclResult_t ncclRecv(void* data, std::size_t count, ncclDataType_t type, int peer, ncclComm_t c, cudaStream_t s) {
  if (type != ncclUint8 && type != ncclInt8) return ncclInvalidArgument;
  const ncclResult_t r = guarded([&] { api().recv(data, count, peer, box(c)->c, impl(s)); });
  return r == ncclSuccess ? after_enqueue(c) : r;
}
ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
  if (type != ncclUint64 || op != ncclMax) return ncclInvalidArgument;  // the only one ckpt makes
  return guarded([&] {
    api().all_reduce_max_u64(static_cast<const std::uint64_t*>(send), static_cast<std::uint64_t*>(recv), count, box(c)->c, impl(s));
  });
}
ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclComm_t c, cudaStream_t s) {
  if (type != ncclUint8 && type != ncclInt8) return ncclInvalidArgument;
  return guarded([&] { api().all_gather(send, recv, count, box(c)->c, impl(s)); });
}
ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type, int root, ncclComm_t c,
                           cudaStream_t s) {
  if (type != ncclUint8 && type != ncclInt8) return ncclInvalidArgument;
  return guarded([&] { api().broadcast(send, recv, count, root, box(c)->c, impl(s)); });
}
ncclResult_t ncclGroupStart() {
  in_group = true;
  api().group_start();
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  in_group = false;
  api().group_end();
  return ncclSuccess;  // the caller waits for ncclSuccess from ncclCommGetAsyncError next
}

}  // extern "C"
