#pragma once
/// @file mpi.hpp
/// `ckpt::mpi`: a Communicator over MPI (Open MPI from Debian's libopenmpi-dev). Never included
/// by ckpt.hpp: include it yourself when your engine runs under mpirun.

#if !__has_include(<mpi.h>)
#error "ckpt/mpi.hpp needs MPI: install libopenmpi-dev (Debian) and build with dependency('mpi', language: 'cpp')"
#endif

// ckpt uses the C API only; the deprecated C++ bindings do not compile warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "error.hpp"
#include "impl/checkpointer.ipp"  // its users make checkpointers other than impl/instances.hpp's
#include "tensor.hpp"

namespace ckpt {

/// Collectives over an MPI communicator. ckpt works on its own duplicate of the communicator
/// you give it (MPI_Comm_dup), with errors returned rather than aborting, so its messages never
/// mix with yours and a failing collective becomes a `ckpt::error` of kind `communication`.
/// MPI must be initialised before, and finalised after, the last checkpointer using it.
///
/// @code
/// MPI_Init(&argc, &argv);
/// {
///   ckpt::checkpointer<ckpt::megatron<ckpt::mpi>, ckpt::posix> cp{{.tp = 2}, "/ckpt/run1"};
///   cp.save(step, state);
/// }
/// MPI_Finalize();
/// @endcode
class mpi {
 public:
  mpi() : mpi(MPI_COMM_WORLD) {}
  explicit mpi(MPI_Comm comm) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) throw error(error_kind::communication, "ckpt::mpi: MPI_Init has not been called");
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  mpi(const mpi& o) : mpi(o.comm_) {}
  mpi& operator=(const mpi& o) {
    if (this != &o) {
      mpi copy(o);
      std::swap(comm_, copy.comm_);
      std::swap(rank_, copy.rank_);
      std::swap(size_, copy.size_);
    }
    return *this;
  }
  mpi(mpi&& o) noexcept : comm_(o.comm_), rank_(o.rank_), size_(o.size_) { o.comm_ = MPI_COMM_NULL; }
  mpi& operator=(mpi&& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~mpi() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// Whether a background thread may use this communicator while the application goes on
  /// calling MPI: true when MPI was initialised with MPI_THREAD_MULTIPLE (checkpointer::save_async
  /// needs it on more than one rank).
  bool thread_safe() const noexcept {
    int provided = MPI_THREAD_SINGLE;
    return MPI_Query_thread(&provided) == MPI_SUCCESS && provided == MPI_THREAD_MULTIPLE;
  }
  /// ckpt's duplicate of the communicator.
  MPI_Comm native() const noexcept { return comm_; }

  void barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  /// Sends root's bytes to every rank; receivers' vectors are resized to fit.
  void broadcast(std::vector<std::byte>& bytes, int root) {
    std::uint64_t n = bytes.size();
    check(MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm_), "MPI_Bcast");
    if (rank_ != root) bytes.resize(n);
    check(MPI_Bcast(bytes.data(), count(n), MPI_BYTE, root, comm_), "MPI_Bcast");
  }

  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine) {
    const std::uint64_t n = mine.size();
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, comm_), "MPI_Allgather");
    std::vector<int> counts, displs;
    const auto total = layout(sizes, counts, displs);
    std::vector<std::byte> all(total);
    check(MPI_Allgatherv(mine.data(), count(n), MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, comm_),
          "MPI_Allgatherv");
    return split(all, counts, displs);
  }

  /// Every rank's bytes at `root` (in rank order); an empty vector elsewhere.
  std::vector<std::vector<std::byte>> gather(std::span<const std::byte> mine, int root) {
    const std::uint64_t n = mine.size();
    std::vector<std::uint64_t> sizes(rank_ == root ? static_cast<std::size_t>(size_) : 0);
    check(MPI_Gather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, root, comm_), "MPI_Gather");
    std::vector<int> counts, displs;
    std::vector<std::byte> all;
    if (rank_ == root) all.resize(layout(sizes, counts, displs));
    check(MPI_Gatherv(mine.data(), count(n), MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, root, comm_),
          "MPI_Gatherv");
    if (rank_ != root) return {};
    return split(all, counts, displs);
  }

  std::uint64_t all_reduce_max(std::uint64_t x) {
    std::uint64_t out = 0;
    check(MPI_Allreduce(&x, &out, 1, MPI_UINT64_T, MPI_MAX, comm_), "MPI_Allreduce");
    return out;
  }

  // Point to point: this makes ckpt::mpi a Transport, so gather_to_root streams each rank's
  // shards to rank 0 chunk by chunk (no 2 GiB limit, rank 0 holds only its pipeline's buffers)
  // and scatters loads from rank 0.

  /// Host memory only: ckpt does not assume a CUDA-aware MPI, so GPU tensors are staged through
  /// the checkpointer's DevicePolicy.
  bool moves(const tensor_ref& t) const noexcept { return t.where().type == device::kind::host; }

  void send_tensor(const tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, int peer) {
    check_range(t, offset, bytes, "send");
    send_host({t.data() + offset, static_cast<std::size_t>(bytes)}, peer);
  }
  void recv_tensor(const tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, int peer) {
    check_range(t, offset, bytes, "receive");
    if (bytes && !t.writable()) throw error(error_kind::invalid_argument, "ckpt::mpi: cannot receive into a read-only tensor");
    recv_host({t.data() + offset, static_cast<std::size_t>(bytes)}, peer);
  }
  /// Sends in messages of at most 1 GiB (MPI counts are ints), tagged apart from anything else.
  void send_host(std::span<const std::byte> bytes, int peer) {
    check_peer(peer);
    for (std::size_t at = 0; at < bytes.size(); at += transfer_piece) {
      const auto n = std::min(transfer_piece, bytes.size() - at);
      check(MPI_Send(bytes.data() + at, static_cast<int>(n), MPI_BYTE, peer, transfer_tag, comm_), "MPI_Send");
    }
  }
  /// Receives what the matching send_host sent, checking every message's size.
  void recv_host(std::span<std::byte> bytes, int peer) {
    check_peer(peer);
    for (std::size_t at = 0; at < bytes.size(); at += transfer_piece) {
      const auto n = std::min(transfer_piece, bytes.size() - at);
      MPI_Status status;
      check(MPI_Recv(bytes.data() + at, static_cast<int>(n), MPI_BYTE, peer, transfer_tag, comm_, &status), "MPI_Recv");
      int got = 0;
      check(MPI_Get_count(&status, MPI_BYTE, &got), "MPI_Get_count");
      if (static_cast<std::size_t>(got) != n)
        throw error(error_kind::communication, "ckpt::mpi: expected " + std::to_string(n) + " bytes from rank " + std::to_string(peer) +
                                                   " and received " + std::to_string(got));
    }
  }

 private:
  static constexpr std::size_t transfer_piece = std::size_t{1} << 30;
  static constexpr int transfer_tag = 0x636b;  // "ck"

  void check_peer(int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw error(error_kind::invalid_argument, "ckpt::mpi: rank " + std::to_string(rank_) + " cannot exchange bytes with rank " +
                                                    std::to_string(peer) + " in a world of " + std::to_string(size_));
  }
  static void check_range(const tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, const char* what) {
    if (bytes != 0 && t.where().type != device::kind::host)
      throw error(error_kind::invalid_argument, std::string("ckpt::mpi: can only ") + what + " host memory");
    if (offset > t.nbytes() || bytes > t.nbytes() - offset)
      throw error(error_kind::invalid_argument, std::string("ckpt::mpi: ") + what + " of bytes [" + std::to_string(offset) + ", +" +
                                                    std::to_string(bytes) + ") outside a tensor of " + std::to_string(t.nbytes()) +
                                                    " bytes");
  }

  static void check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw error(error_kind::communication, std::string(call) + " failed: " + std::string(text, static_cast<std::size_t>(len)));
  }
  // MPI counts are ints: larger messages would need derived datatypes, which ckpt's collectives
  // (indexes and small values, not tensor data) never come close to.
  static int count(std::uint64_t n) {
    if (n > static_cast<std::uint64_t>(INT_MAX))
      throw error(error_kind::communication, "ckpt::mpi: a message of " + std::to_string(n) + " bytes exceeds MPI's int count");
    return static_cast<int>(n);
  }
  static std::uint64_t layout(const std::vector<std::uint64_t>& sizes, std::vector<int>& counts, std::vector<int>& displs) {
    std::uint64_t total = 0;
    counts.resize(sizes.size());
    displs.resize(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      counts[i] = count(sizes[i]);
      displs[i] = count(total);
      total += sizes[i];
    }
    count(total);
    return total;
  }
  static std::vector<std::vector<std::byte>> split(const std::vector<std::byte>& all, const std::vector<int>& counts,
                                                   const std::vector<int>& displs) {
    std::vector<std::vector<std::byte>> out(counts.size());
    for (std::size_t i = 0; i < counts.size(); ++i)
      out[i].assign(all.begin() + displs[i], all.begin() + displs[i] + counts[i]);
    return out;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace ckpt
