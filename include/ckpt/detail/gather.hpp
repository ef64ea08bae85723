#pragma once
// The gather stage: everything gather_to_root does, in one place. At save, after every rank
// agreed on its plan, the other ranks' tensors and values move to rank 0, which writes the one
// shard file: in one gather over a Communicator, or, over a Transport, only names and shapes
// in the gather and the bytes streamed point to point while rank 0 writes (streamed_gather.hpp).
// At load, with scatter_on_load, rank 0 reads what every rank holds and sends it. For a
// ShardPolicy that does not gather, every step here is the identity.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../host_copy.hpp"
#include "../options.hpp"
#include "collective.hpp"
#include "chunk_reader.hpp"
#include "format.hpp"
#include "metadata.hpp"
#include "restore_plan.hpp"
#include "save_plan.hpp"
#include "shard_io.hpp"
#include "streamed_gather.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

/// The most one gather carries (MPI counts are ints).
inline constexpr std::uint64_t max_gather_bytes = (std::uint64_t{1} << 31) - 1;

/// What a rank sends to the root under a gathering policy: its tensors' geometry with their
/// bytes (or without, when they follow point to point over a Transport), and its values. The
/// root unpacks it into buffers it owns.
struct gathered {
  std::vector<std::vector<std::byte>> buffers;  // owns the tensor bytes (none when streamed)
  std::vector<stored_tensor> tensors;           // streamed: data pointers are null until received
  std::vector<int> from;                        // the rank each tensor came from
  std::vector<stored_value> values;
};

template <class D>
std::string pack_for_root(const std::vector<stored_tensor>& tensors, const std::vector<stored_value>& values, D& device,
                          bool with_bytes = true) {
  std::ostringstream os(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(os);
    ar(static_cast<std::uint64_t>(tensors.size()));
    std::vector<std::byte> staging;
    for (const auto& t : tensors) {
      write_string(ar, t.name);
      ar(dtype_byte(t.ref.type(), t.ref.order()));
      write_shape(ar, t.ref.shape());
      write_shape(ar, t.ref.global_shape());
      write_shape(ar, t.ref.global_offset());
      ar(static_cast<std::uint64_t>(t.ref.nbytes()));
      if (!with_bytes) continue;
      staging.resize(t.ref.nbytes());
      device.to_host(t.ref, 0, staging);
      ar(cereal::binary_data(staging.data(), staging.size()));
    }
    ar(static_cast<std::uint64_t>(values.size()));
    for (const auto& v : values) {
      write_string(ar, v.name);
      ar(v.rank, static_cast<std::uint64_t>(v.bytes.size()));
      ar(cereal::binary_data(v.bytes.data(), v.bytes.size()));
    }
  }
  return std::move(os).str();
}

/// Unpacks what rank `from` sent. Without bytes (`with_bytes` false), the tensors' data pointers
/// stay null: their bytes follow point to point, and the sizes are checked against the shapes.
CKPT_DECL void unpack_at_root(std::span<const std::byte> bytes, int from, gathered& into, bool with_bytes = true);

/// Save, after the ranks agreed: under a gathering policy, moves the other ranks' tensors and
/// values into rank 0's plan (their bytes too unless streamed, in which case each rank keeps
/// what it sends in `plan.sent` and rank 0 notes in `plan.source` whom each tensor comes from).
/// Collective; the identity for other policies.
template <class Policy, class Comm, class Dev>
void gather_plan(Comm& comm, save_plan& plan, Dev& device, const chunking& how) {
  if constexpr (gathers<Policy>) {
    // Streamed: only names and shapes go through the gather; the bytes follow point to point
    // while rank 0 writes. Otherwise everything passes through one gather.
    constexpr bool streamed = streams<Policy>;
    std::string packed;
    collective(comm, [&] {
      if (comm.rank() != 0) {
        packed = pack_for_root(plan.mine, plan.values, device, !streamed);
        if (streamed) plan.sent = std::move(plan.mine);
        plan.mine.clear();
        plan.values.clear();
      }
    });
    if constexpr (!streamed) {
      // Refuse, on every rank alike, what would not fit in a message.
      const std::uint64_t size = packed.size();
      const auto sizes = comm.all_gather(std::as_bytes(std::span(&size, 1)));
      collective(comm, [&] {
        std::uint64_t total = 0;
        for (const auto& b : sizes) {
          std::uint64_t n = 0;
          std::memcpy(&n, b.data(), std::min<std::size_t>(b.size(), 8));
          total += n;
        }
        if (total > max_gather_bytes)
          throw error(error_kind::invalid_argument, "gather_to_root: the state is " + std::to_string(total) + " bytes, more than the " +
                                                        std::to_string(max_gather_bytes) + " one gather can carry; use megatron");
      });
    }
    auto parts = comm.gather(as_bytes(packed), 0);
    gathered at_root;
    collective(comm, [&] {
      for (std::size_t r = 1; r < parts.size(); ++r) unpack_at_root(parts[r], static_cast<int>(r), at_root, !streamed);
    });
    plan.source.assign(plan.mine.size(), -1);
    for (std::size_t i = 0; i < at_root.tensors.size(); ++i) {
      plan.mine.push_back(std::move(at_root.tensors[i]));
      plan.source.push_back(streamed ? at_root.from[i] : -1);
    }
    for (auto& val : at_root.values) plan.values.push_back(std::move(val));
    plan.gathered_bytes = std::move(at_root.buffers);  // the tensors in `mine` point into them
    if constexpr (streamed) {
      // The transfers follow rank 0's chunking, whatever the other ranks' options say.
      std::vector<std::byte> cut(sizeof how.chunk_bytes + sizeof how.reshard_blocks);
      std::memcpy(cut.data(), &how.chunk_bytes, sizeof how.chunk_bytes);
      std::memcpy(cut.data() + sizeof how.chunk_bytes, &how.reshard_blocks, sizeof how.reshard_blocks);
      comm.broadcast(cut, 0);
      std::memcpy(&plan.transfers.chunk_bytes, cut.data(), sizeof how.chunk_bytes);
      std::memcpy(&plan.transfers.reshard_blocks, cut.data() + sizeof how.chunk_bytes, sizeof how.reshard_blocks);
    }
  } else {
    (void)comm, (void)plan, (void)device, (void)how;
  }
}

/// Whether through_gather runs its stage on a receiving_device (rank 0 of a streamed gather,
/// with other ranks' bytes still to come) rather than on the device it is given. A receiving
/// device has no host view, so the shard file's plan makes no blocks of columns.
template <class Policy>
bool receives_through_gather(const save_plan& plan) {
  if constexpr (streams<Policy>)
    return std::any_of(plan.source.begin(), plan.source.end(), [](int r) { return r >= 0; });
  else
    return (void)plan, false;
}

/// Save, where bytes leave the tensors (the snapshot, or the write): runs `use(dev)` with the
/// device rank 0 stages its tensors through. Under a streamed gather, a rank first sends what
/// it streams to rank 0, and rank 0's device is a receiving_device that takes the other ranks'
/// bytes as the stage asks for them; should the stage fail or leave some unread, what is left
/// is drained so that no rank stays blocked in a send. Afterwards every tensor of the plan is
/// this rank's own. Otherwise `use(device)`.
template <class Policy, class Comm, class Dev, class Use>
void through_gather(Comm& comm, save_plan& plan, Dev& device, Use&& use) {
  if constexpr (streams<Policy>) {
    if (!plan.sent.empty()) {
      send_to_root(comm, plan.sent, plan.transfers, device);
      plan.sent.clear();
    }
    if (receives_through_gather<Policy>(plan)) {
      receiving_device<Dev, Comm> rx(device, comm, plan.mine, plan.source, plan.transfers);
      try {
        use(rx);
      } catch (...) {
        rx.drain();
        throw;
      }
      if (!rx.complete()) {
        rx.drain();
        throw error(error_kind::communication, "gather_to_root: rank 0 wrote its file without every chunk sent to it");
      }
      plan.source.clear();
      return;
    }
  } else {
    (void)comm;
  }
  use(device);
}

/// Rank 0: its own load, then each other rank's tensors and values, in rank order. Whatever
/// fails, every rank still waiting is told so (one status word each), then the error is thrown.
template <class Comm, class Store, class Chunks, class ReadOwn>
void serve_scatter(Comm& comm, const Store& storage, const metadata& md, const restore_plan& own, const Chunks& chunks,
                   ReadOwn&& read_own, const std::vector<std::vector<std::byte>>& requests, load_result& result) {
  file_verifier<Store> verify_file(storage, md);
  std::exception_ptr failure;
  try {
    read_own(own, verify_file);
  } catch (...) {
    failure = std::current_exception();
  }
  std::vector<shape_t> shapes;
  for (const auto& t : md.tensors) shapes.push_back(t.shape);
  host_copy host;
  std::vector<std::byte> buffer;
  auto tell_failed = [&](int r) {
    try {
      send_status(comm, scatter_failed, r);
    } catch (...) {
      // a broken communicator: the error already on its way out is the one to report
    }
  };
  for (int r = 1; r < comm.size(); ++r) {
    if (failure) {
      tell_failed(r);
      continue;
    }
    try {
      const auto req = decode_request(requests[static_cast<std::size_t>(r)], r, md.tensors.size(), shapes, md.values.size());
      for (const auto& t : req.tensors) {
        const auto& stored = md.tensors[t.stored];
        const std::string what = "tensor " + printable(stored.name) + " for rank " + std::to_string(r);
        buffer.resize(static_cast<std::size_t>(checked_mul(element_count(t.shape, what), size_of(stored.type), what)));
        tensor_ref slice(stored.type, t.shape, buffer.data());
        slice.sharded(shard_spec{.global_shape = stored.shape, .offset = t.offset});
        const tensor_load one[]{{&stored, &stored.name, &slice}};
        (void)chunks.load(std::span(one), md, verify_file, host);  // not rank 0's own bytes_read
        send_status(comm, scatter_ok, r);
        comm.send_host(buffer, r);
      }
      for (auto index : req.values) {
        const auto& pick = md.values[index];
        verify_file(pick.file);
        const auto bytes = read_value(storage, file_key(md, pick.file), pick);
        send_status(comm, scatter_ok, r);
        comm.send_host(bytes, r);
      }
      send_status(comm, scatter_end, r);
    } catch (...) {
      failure = std::current_exception();
      tell_failed(r);
    }
  }
  result.bytes_read += verify_file.bytes_read();
  if (failure) std::rethrow_exception(failure);
}

/// A rank other than 0: receives its tensors and values from rank 0, in the order it asked.
/// Rank 0 sends every item whatever happens here, so a local failure (a value whose type
/// changed, a tensor the Transport cannot receive into) does not stop the receiving: the
/// rest is received (into a sink if need be) up to rank 0's last word, then the first error
/// is thrown.
template <class Comm, class Store, class Dev>
void receive_scatter(Comm& comm, const Store& storage, Dev& device, const metadata& md, const restore_plan& plan) {
  auto expect = [&](const std::string& what) {
    const auto status = recv_status(comm);
    if (status == scatter_ok) return;
    throw error(error_kind::io, std::string(status == scatter_failed ? "rank 0 failed to read " : "rank 0 sent nothing for ") + what +
                                    " (rank 0's error follows from rank 0)");
  };
  std::exception_ptr failure;
  std::vector<std::byte> bytes;
  auto sink = [&](std::uint64_t n) {  // what could not land where it belongs
    try {
      bytes.resize(static_cast<std::size_t>(n));
      comm.recv_host(bytes, 0);
    } catch (...) {
      std::rethrow_exception(failure);  // the communicator itself is broken
    }
  };
  for (const auto& t : plan.tensors) {
    expect("tensor " + printable(*t.name));
    if (failure) {
      sink(t.ref->nbytes());
      continue;
    }
    bool received = false;
    try {
      if (transport_moves(comm, *t.ref)) {
        comm.recv_tensor(*t.ref, 0, t.ref->nbytes(), 0);
        received = true;
      } else {  // staged through the DevicePolicy (GPU memory over MPI)
        bytes.resize(static_cast<std::size_t>(t.ref->nbytes()));
        comm.recv_host(bytes, 0);
        received = true;
        device.from_host(bytes, *t.ref, 0);
      }
    } catch (...) {
      failure = std::current_exception();
      if (!received) sink(t.ref->nbytes());
    }
  }
  for (const auto& [val, pick] : plan.values) {
    expect("value " + printable(val->name));
    bytes.resize(static_cast<std::size_t>(pick->size));
    comm.recv_host(bytes, 0);
    if (failure) continue;
    try {
      val->load(bytes, "value " + printable(val->name) + " received from rank 0 (" +
                           storage.describe(file_key(md, pick->file)) + ")");
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (recv_status(comm) != scatter_end)
    throw error(error_kind::io, "rank 0 failed after sending this rank's state (rank 0's error follows from rank 0)");
  if (failure) std::rethrow_exception(failure);
}

/// Load, under a scattering policy: rank 0 loads its own plan with `read_own(verify)` and then
/// each other rank's tensors and values, in rank order, and sends them; the others receive them
/// straight into their tensors (GPU memory, with NCCL) and never touch storage. Rank 0 holds one
/// tensor of another rank at a time. Collective.
template <class Comm, class Store, class Chunks, class Dev, class ReadOwn>
void scatter_load(Comm& comm, const Store& storage, const metadata& md, const restore_plan& plan, const Chunks& chunks, Dev& device,
                  ReadOwn&& read_own, load_result& result) {
  std::string request;
  collective(comm, [&] {
    if (comm.rank() == 0) return;  // rank 0 also checks the validation logits; the others read nothing
    scatter_request req;
    for (const auto& t : plan.tensors)
      req.tensors.push_back({static_cast<std::uint32_t>(t.stored - md.tensors.data()), t.ref->shape(), t.ref->global_offset()});
    for (const auto& pv : plan.values) req.values.push_back(static_cast<std::uint32_t>(pv.second - md.values.data()));
    request = encode_request(req);
  });
  const auto requests = comm.gather(as_bytes(request), 0);
  collective(comm, [&] {
    if (comm.rank() == 0)
      serve_scatter(comm, storage, md, plan, chunks, read_own, requests, result);
    else
      receive_scatter(comm, storage, device, md, plan);
  });
}

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/gather.ipp"
#endif
