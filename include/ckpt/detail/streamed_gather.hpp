#pragma once
// gather_to_root over a Transport (ckpt::cuda::nccl, ckpt::in_process): at save, every rank
// streams its shards to rank 0 chunk by chunk while rank 0 writes them, so no rank packs its
// whole state into one message; at load, rank 0 reads what each rank holds and sends it
// straight into that rank's tensors. Both sides of every transfer derive the same sequence of
// sizes from what they already agreed on, so nothing but the bytes goes over the wire.

#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "format.hpp"
#include "region.hpp"
#include "shard_io.hpp"
#include "staging_buffer.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

/// One transfer: bytes [offset, offset + bytes) of a tensor.
struct byte_range {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

/// The transfers a tensor's bytes move in at save: the chunks write_shard splits it into (byte
/// ranges: rank 0's receiving device has no host view, so write_shard makes no boxes), so rank 0
/// writes each chunk as it arrives and holds no more than the pipeline's buffers.
inline std::vector<byte_range> transfer_ranges(const tensor_ref& t, chunking how) {
  how.boxes = false;
  std::vector<byte_range> out;
  for (const auto& c : chunks_of(t.shape(), t.global_shape(), size_of(t.type()), how))
    if (c.bytes) out.push_back({c.byte_offset, c.bytes});
  return out;
}

/// Whether the Transport moves `t`'s memory itself (see the Transport concept's `moves`).
template <class Comm>
bool transport_moves(const Comm& comm, const tensor_ref& t) {
  if constexpr (chooses_tensors<Comm>)
    return comm.moves(t);
  else
    return true;
}

/// A rank other than 0, at save: sends every chunk of every tensor it holds, in order; a tensor
/// the Transport cannot move is staged through the DevicePolicy chunk by chunk. Rank 0 waits for
/// each chunk, so one that cannot be sent (staging failed, the Transport refused it) is replaced
/// by zeros, and so is every chunk after it; then the first error is thrown, and the save fails
/// on every rank with nothing committed.
template <class Comm, class Dev>
void send_to_root(Comm& comm, const std::vector<stored_tensor>& tensors, const chunking& how, Dev& device) {
  std::exception_ptr failure;
  std::vector<std::byte> staged;
  for (const auto& t : tensors) {
    const bool direct = transport_moves(comm, t.ref);
    for (const auto& r : transfer_ranges(t.ref, how)) {
      if (!failure) {
        try {
          if (direct) {
            comm.send_tensor(t.ref, r.offset, r.bytes, 0);
          } else {
            staged.resize(static_cast<std::size_t>(r.bytes));
            device.to_host(t.ref, r.offset, staged);
            comm.send_host(staged, 0);
          }
          continue;
        } catch (...) {
          failure = std::current_exception();
        }
      }
      try {
        staged.assign(static_cast<std::size_t>(r.bytes), std::byte{0});
        comm.send_host(staged, 0);
      } catch (...) {
        std::rethrow_exception(failure);  // the communicator itself is broken: nothing more to send
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
}

/// Rank 0's DevicePolicy while it writes a streamed gather. Tensors other ranks hold (their
/// `source` is that rank) are received when the save pipeline stages them: the pipeline stages
/// chunks in file order, one at a time, which is the order the ranks send them in. Rank 0's own
/// tensors go through the checkpointer's DevicePolicy. Should the save stop part-way, `drain`
/// receives what is left, so no rank stays blocked in a send.
template <class Dev, class Comm>
class receiving_device {
 public:
  receiving_device(Dev& local, Comm& comm, const std::vector<stored_tensor>& tensors, const std::vector<int>& source,
                   const chunking& how)
      : local_(local), comm_(comm) {
    for (std::size_t i = 0; i < tensors.size() && i < source.size(); ++i) {
      if (source[i] < 0) continue;
      remote_.emplace(&tensors[i].ref, i);
      for (const auto& r : transfer_ranges(tensors[i].ref, how)) expected_.push_back({&tensors[i].ref, source[i], r});
    }
  }

  bool accepts(device d) const { return local_.accepts(d); }

  void to_host(const tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst) {
    if (!remote_.count(&t)) return local_.to_host(t, offset, dst);
    if (dst.empty()) return;
    if (next_ == expected_.size() || expected_[next_].ref != &t || expected_[next_].range.offset != offset ||
        expected_[next_].range.bytes != dst.size())
      throw error(error_kind::communication, "gather_to_root: rank 0 staged bytes [" + std::to_string(offset) + ", +" +
                                                 std::to_string(dst.size()) + ") of a tensor out of the order the ranks send in");
    comm_.recv_host(dst, expected_[next_].from);
    ++next_;
  }

  void from_host(std::span<const std::byte> src, const tensor_ref& t, std::uint64_t offset) { local_.from_host(src, t, offset); }

  /// Rank 0's own chunks still stage into what its DevicePolicy lends (pinned memory).
  lent_buffer lend(std::size_t n)
    requires lends_buffers<Dev>
  {
    return local_.lend(n);
  }

  /// Whether every transfer the other ranks make has been received.
  bool complete() const noexcept { return next_ == expected_.size(); }

  /// Receives and discards what the save did not take. Errors are swallowed: this runs while
  /// another error is on its way out, and that one is worth reporting.
  void drain() noexcept {
    try {
      std::vector<std::byte> sink;
      for (; next_ < expected_.size(); ++next_) {
        sink.resize(static_cast<std::size_t>(expected_[next_].range.bytes));
        comm_.recv_host(sink, expected_[next_].from);
      }
    } catch (...) {
      // a broken communicator: the save already fails
    }
  }

 private:
  struct transfer {
    const tensor_ref* ref;
    int from;
    byte_range range;
  };
  Dev& local_;
  Comm& comm_;
  std::unordered_map<const tensor_ref*, std::size_t> remote_;
  std::vector<transfer> expected_;
  std::size_t next_ = 0;
};

// --- load: rank 0 scatters ---------------------------------------------------------------------

/// What a rank asks rank 0 for: slices of stored tensors, and stored values.
struct scatter_request {
  struct tensor {
    std::uint32_t stored = 0;  // index into metadata::tensors
    shape_t shape;             // the slice the rank holds
    shape_t offset;
  };
  std::vector<tensor> tensors;
  std::vector<std::uint32_t> values;  // indexes into metadata::values
};

CKPT_DECL std::string encode_request(const scatter_request& req);

/// Decodes rank `from`'s request and checks it against the checkpoint: indexes in range, every
/// slice inside its stored tensor.
CKPT_DECL scatter_request decode_request(std::span<const std::byte> bytes, int from, std::size_t stored_tensors,
                                      const std::vector<shape_t>& stored_shapes, std::size_t stored_values);

/// Before each tensor or value rank 0 sends a status word; after the last, `scatter_end`. On
/// `scatter_failed` the receiver stops: rank 0's error reaches every rank through the
/// collective step around the load.
inline constexpr std::uint64_t scatter_ok = 0, scatter_failed = 1, scatter_end = 2;

template <class Comm>
void send_status(Comm& comm, std::uint64_t status, int peer) {
  comm.send_host(std::as_bytes(std::span(&status, 1)), peer);
}

template <class Comm>
std::uint64_t recv_status(Comm& comm) {
  std::uint64_t status = scatter_failed;
  comm.recv_host(std::as_writable_bytes(std::span(&status, 1)), 0);
  if (status > scatter_end)
    throw error(error_kind::communication, "rank 0 sent an unknown load status " + std::to_string(status));
  return status;
}

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/streamed_gather.ipp"
#endif
