#pragma once
/// @file cuda/nccl_api.hpp
/// The NCCL calls `ckpt::cuda::nccl` makes, each checked: a failure throws `nccl_api::failure`
/// holding NCCL's own error string and result code, which the communicator turns into a
/// `ckpt::error` naming the call, the operation, the peer and the bytes. Link with NCCL and
/// cudart (Meson: `ckpt_cuda_dep`).

#if !__has_include(<nccl.h>)
#error "ckpt/cuda/nccl needs NCCL's <nccl.h> (e.g. -I/usr/local/cuda/include) and libnccl; the core ckpt headers do not need NCCL"
#endif
#if !__has_include(<cuda_runtime_api.h>)
#error "ckpt/cuda/nccl needs the CUDA toolkit's <cuda_runtime_api.h> (e.g. -I/usr/local/cuda/include) and cudart"
#endif

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "basic_nccl.hpp"  // nccl_status (it includes no CUDA or NCCL header)

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ckpt::cuda {

/// What basic_nccl needs of NCCL, on the real library. Every operation is enqueued on a CUDA
/// stream and returns at once; completion is observed on the stream.
struct nccl_api {
  using comm = ncclComm_t;
  using stream = cudaStream_t;

  /// The bytes of an ncclUniqueId, as a plain array so that any bootstrap (MPI, a file, a
  /// key-value store) can carry it.
  struct unique_id {
    std::array<std::byte, NCCL_UNIQUE_ID_BYTES> bytes{};
  };
  static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId is expected to be NCCL_UNIQUE_ID_BYTES bytes");

  /// A call NCCL refused: what() is "<ncclGetErrorString> (code N)"; `code` is the ncclResult_t.
  struct failure : std::runtime_error {
    failure(const std::string& what, int result) : std::runtime_error(what), code(result) {}
    int code = 0;
  };

  static std::string describe(ncclResult_t r) {
    return std::string(ncclGetErrorString(r)) + " (ncclResult_t " + std::to_string(static_cast<int>(r)) + ")";
  }
  static void check(ncclResult_t r) {
    if (r != ncclSuccess) throw failure(describe(r), static_cast<int>(r));
  }
  /// For calls on a non-blocking communicator: ncclInProgress says the call was taken and the
  /// communicator is busy (connecting to a peer); the caller polls `status` before the next.
  static void check_enqueued(ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) throw failure(describe(r), static_cast<int>(r));
  }

  unique_id make_unique_id() {
    ncclUniqueId id;
    check(ncclGetUniqueId(&id));
    unique_id out;
    std::memcpy(out.bytes.data(), &id, sizeof id);
    return out;
  }
  /// Starts joining communicator `id` without blocking (ncclCommInitRankConfig with
  /// `blocking = 0`): the communicator exists at once, `status` says `in_progress` until every
  /// rank has joined, and `abort` can end the wait for a rank that never comes.
  comm init_rank(int size, const unique_id& id, int rank) {
    ncclUniqueId raw;
    std::memcpy(&raw, id.bytes.data(), sizeof raw);
    comm c = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&c, size, raw, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (c) ncclCommAbort(c);
      throw failure(describe(r), static_cast<int>(r));
    }
    return c;
  }
  void destroy(comm c) noexcept {
    if (c) ncclCommDestroy(c);
  }
  /// Stops the communicator's kernels, including those waiting on a peer that never answers.
  void abort(comm c) noexcept {
    if (c) ncclCommAbort(c);
  }
  /// Where the communicator stands: ready, still joining or connecting (ncclInProgress), or
  /// failed while its operations ran (a peer died, the network failed), `what` then getting
  /// NCCL's description.
  nccl_status status(comm c, std::string& what) {
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(c, &state));
    if (state == ncclSuccess) return nccl_status::ready;
    if (state == ncclInProgress) return nccl_status::in_progress;
    what = describe(state);
    return nccl_status::failed;
  }

  void send(const void* data, std::size_t bytes, int peer, comm c, stream s) {
    check_enqueued(ncclSend(data, bytes, ncclUint8, peer, c, s));
  }
  void recv(void* data, std::size_t bytes, int peer, comm c, stream s) { check_enqueued(ncclRecv(data, bytes, ncclUint8, peer, c, s)); }
  void all_reduce_max_u64(const std::uint64_t* send, std::uint64_t* recv, std::size_t count, comm c, stream s) {
    check_enqueued(ncclAllReduce(send, recv, count, ncclUint64, ncclMax, c, s));
  }
  /// `recv` holds size * bytes_per_rank bytes; rank r's contribution lands at r * bytes_per_rank.
  void all_gather(const void* send, void* recv, std::size_t bytes_per_rank, comm c, stream s) {
    check_enqueued(ncclAllGather(send, recv, bytes_per_rank, ncclUint8, c, s));
  }
  void broadcast(const void* send, void* recv, std::size_t bytes, int root, comm c, stream s) {
    check_enqueued(ncclBroadcast(send, recv, bytes, ncclUint8, root, c, s));
  }
  void group_start() { check(ncclGroupStart()); }
  void group_end() { check_enqueued(ncclGroupEnd()); }
};

}  // namespace ckpt::cuda
