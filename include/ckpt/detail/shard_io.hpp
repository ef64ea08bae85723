#pragma once
// Writing one rank's shard file, and reading chunks back with their checks.

#include <algorithm>
#include <array>
#include <sstream>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../visitor.hpp"
#include "format.hpp"
#include "hash.hpp"
#include "keys.hpp"
#include "pipeline.hpp"
#include "region.hpp"
#include "staging_buffer.hpp"
#include "table_memory.hpp"

namespace ckpt::detail {

/// What writing a shard file produced: its index and the facts rank 0 records about it.
struct written_shard {
  std::string path;  // relative to the tag directory
  std::uint64_t size = 0;
  std::uint64_t index_xxh3 = 0;
  shard_index index;
};

/// A tensor this rank stores, under its final name (validation logits use a reserved name).
struct stored_tensor {
  std::string name;
  tensor_ref ref;
};

/// A value this rank stores: its encoded bytes and the rank it belongs to.
struct stored_value {
  std::string name;
  std::uint32_t rank = 0;
  std::vector<std::byte> bytes;
};

/// How a shard file is written: the pipeline's threads and memory.
struct write_settings {
  unsigned threads = 0;                               // encode/hash workers (0: one per core, at most 8)
  std::uint64_t buffer_bytes = std::uint64_t{256} << 20;  // host buffers in flight, at most
  bool place_for_memory = true;                           // checkpointer_options::place_for_memory
};

/// The codec id a chunk of tensor `t` is stored with: the codec's own, or its per-tensor choice.
template <class C>
std::uint8_t codec_id_for(const C& codec, const tensor_ref& t) {
  if constexpr (chooses_per_tensor<C>)
    return codec.id_for(t.type(), t.nbytes());
  else
    return C::id;
}

/// One chunk a shard file will hold: the tensor it belongs to, its row in that tensor's chunk
/// table, the part of the tensor's bytes it covers, and its codec.
struct shard_chunk {
  std::size_t tensor;
  std::size_t row;
  chunk_slice slice;
  std::uint8_t codec;
};

/// A shard file before its first byte is written: every chunk's tensor, box and codec, in file
/// order. `shard.index` already says where each chunk lies in its tensor; where it lies in the
/// file (offset, stored size, checksum), the values, and the file's size and index checksum
/// are write_shard's to fill in. Rank 0 merges the ranks' plans into the commit's metadata
/// while the bytes are written (checkpointer.ipp, write_and_commit).
struct shard_plan {
  written_shard shard;
  table_vector<shard_chunk> chunks;  // in table memory, as shard_index::tensors
  std::uint64_t largest = 0;  // bytes of the largest chunk
  bool boxes = false;         // blocks of columns, which only a DevicePolicy with a host view can gather
};

/// Plans the shard file `path` of `rank`: cuts each tensor into chunks (`cut`; `cut.boxes`
/// only for a DevicePolicy with a host view) and records them in its index.
template <class C>
shard_plan plan_shard(const std::string& path, std::uint32_t rank, const std::vector<stored_tensor>& tensors, const C& codec,
                      const chunking& cut) {
  shard_plan out;
  out.shard.path = path;
  out.shard.index.rank = rank;
  out.boxes = cut.boxes;
  auto& groups = out.shard.index.tensors;
  std::vector<chunk_slice> slices;  // one tensor's, its memory reused for the next
  shape_t at;
  groups.reserve(tensors.size());
  out.chunks.reserve(tensors.size());  // at least one chunk each
  for (std::size_t ti = 0; ti < tensors.size(); ++ti) {
    const auto& t = tensors[ti];
    auto& group = groups.emplace_back();
    group.name = t.name;
    group.type = t.ref.type();
    group.global_shape = t.ref.global_shape();
    group.order = t.ref.order();
    group.chunks.ndim = static_cast<std::uint32_t>(group.global_shape.size());
    const auto id = codec_id_for(codec, t.ref);
    const auto base = t.ref.global_offset();
    slices.clear();
    chunks_of(t.ref.shape(), t.ref.global_shape(), size_of(t.ref.type()), cut, slices);
    for (auto& c : slices) {
      out.largest = std::max(out.largest, c.bytes);
      at.resize(base.size());
      for (std::size_t d = 0; d < base.size(); ++d) at[d] = base[d] + c.offset[d];
      group.chunks.push(0, at, c.shape, id, 0, 0, 0);  // its place in the file: written later
      out.chunks.push_back({ti, group.chunks.size() - 1, std::move(c), id});
    }
  }
  return out;
}

/// Writes the shard file `plan` describes (docs/format.md, section 6): header block, chunks
/// (those of 64 KiB or more at 4 KiB boundaries, smaller ones packed), values, footer index,
/// trailer; then fsyncs and publishes it. The storage writer discards the temporary file on
/// failure.
///
/// Chunks flow through run_pipeline: the caller stages each into a host buffer (or, for raw
/// chunks of host tensors, uses the tensor's bytes in place), workers encode and hash them in
/// parallel, and one thread appends them to the file in order. Small chunks that follow each
/// other travel together, as one item of up to 1 MiB (never less than the largest chunk): a
/// state of 100,000 small tensors would otherwise spend most of its save handing chunks between
/// threads. The buffers in flight never exceed `settings.buffer_bytes` (but there is always at
/// least one item's worth).
template <class S, class C, class D>
written_shard write_shard(S& storage, const std::string& tag, shard_plan&& plan, const std::vector<stored_tensor>& tensors,
                          const std::vector<stored_value>& values, const C& codec, D& device, const write_settings& settings) {
  static const std::array<std::byte, alignment> zeros{};
  // Raw chunks of host tensors need no buffer at all: they are hashed and written in place.
  constexpr bool in_place = has_host_view<D>;
  if (plan.boxes && !in_place)
    throw error(error_kind::invalid_argument, "ckpt internal error: shard file " + printable(plan.shard.path) +
                                                  " was planned with blocks of columns for a device that cannot gather them");
  if (plan.shard.index.tensors.size() != tensors.size())
    throw error(error_kind::invalid_argument, "ckpt internal error: shard file " + printable(plan.shard.path) + " was planned for " +
                                                  std::to_string(plan.shard.index.tensors.size()) + " tensors and written with " +
                                                  std::to_string(tensors.size()));
  written_shard out = std::move(plan.shard);
  const auto& jobs = plan.chunks;
  const std::uint64_t largest = plan.largest;
  // The pipeline's items: runs of consecutive chunks of at most `cap` bytes (1 MiB, or a quarter
  // of the buffer memory if less, so that several items are in flight; never less than the
  // largest chunk), each with the buffer space it needs besides its staged bytes (all of them,
  // for device tensors): gathered bytes (boxes) and encoded bytes.
  struct item {
    std::size_t first, last;  // jobs [first, last)
    std::uint64_t bytes = 0, gathered = 0, encoded = 0;
  };
  constexpr std::size_t most_per_item = 1024;
  const std::uint64_t cap = std::max(largest, std::min(std::uint64_t{1} << 20, settings.buffer_bytes / 4));
  std::vector<item> items;
  std::uint64_t most_bytes = 0, most_gathered = 0, most_encoded = 0;
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const auto& j = jobs[k];
    const std::uint64_t bytes = j.slice.bytes;
    if (items.empty() || items.back().last - items.back().first == most_per_item || items.back().bytes + bytes > cap)
      items.push_back({k, k});
    auto& it = items.back();
    it.last = k + 1;
    it.bytes += bytes;
    if (in_place && !j.slice.contiguous) it.gathered += bytes;
    if (j.codec != 0) it.encoded += codec.max_encoded_size(bytes);
    most_bytes = std::max(most_bytes, it.bytes);
    most_gathered = std::max(most_gathered, it.gathered);
    most_encoded = std::max(most_encoded, it.encoded);
  }
  const std::uint64_t most_staged = in_place ? 0 : most_bytes;  // device tensors are staged whole
  const std::uint64_t per_slot = most_staged + most_gathered + most_encoded;
  const unsigned workers = worker_count(settings.threads);
  const std::size_t slots = per_slot == 0 ? 2 * std::size_t{workers} + 2
                                          : static_cast<std::size_t>(std::clamp<std::uint64_t>(settings.buffer_bytes / per_slot, 1, 64));
  struct slot {
    staging_buffer<D> staging;        // the item's chunks one after the other; pinned memory when the DevicePolicy lends it
    copies_in_flight<D> copies;       // into `staging`; declared after it, so waited for before it is given back
    std::vector<std::byte> gathered;  // boxes of host tensors, gathered by a worker
    std::vector<std::byte> encoded;
    std::vector<std::span<const std::byte>> plain, stored;  // per chunk of the item
    std::vector<std::uint64_t> hash;
  };
  std::vector<slot> ring(std::min(slots, std::max<std::size_t>(items.size(), 1)));
  if constexpr (!in_place)
    for (auto& sl : ring) sl.staging.resize(static_cast<std::size_t>(most_staged), device);  // borrowed once, here

  // Where a raw chunk written from the tensor's own memory lies within its page: the file puts
  // it at the same offset within a block where asked (write_settings::place_for_memory), so
  // that O_DIRECT moves it without a copy (format.hpp, placed_from). Called on this thread, as
  // the stage below calls host_view.
  const auto in_page = [&](const shard_chunk& j) -> std::uint64_t {
    if constexpr (in_place)
      if (settings.place_for_memory && j.codec == 0 && j.slice.contiguous)
        return reinterpret_cast<std::uintptr_t>(device.host_view(tensors[j.tensor].ref) + j.slice.byte_offset) % alignment;
    return 0;
  };
  auto w = storage.create(join_key(tag, out.path));
  if constexpr (reserves_space<decltype(w)>) {
    // Raw chunks have known sizes: the file up to its footer index is known before the first
    // write, laid out as the appending stage below lays it out.
    if (std::all_of(jobs.begin(), jobs.end(), [](const shard_chunk& j) { return j.codec == 0; })) {
      std::uint64_t end = header_bytes;
      for (const auto& j : jobs) end = chunk_start(end, j.slice.bytes, in_page(j)) + j.slice.bytes;
      end = align_up(end);
      for (const auto& v : values) end += v.bytes.size();
      w.reserve(end);
    }
  }
  {
    auto header = make_header();
    std::array<std::byte, header_bytes> block{};
    std::copy(header.begin(), header.end(), block.begin());
    w.write(block);
  }
  std::uint64_t pos = header_bytes;
  const auto pad_to = [&](std::uint64_t to) {  // zeros up to `to` (at most a 4 KiB block ahead)
    if (const auto n = to - pos; n) {
      w.write(std::span<const std::byte>(zeros.data(), n));
      pos += n;
    }
  };
  run_pipeline(
      items.size(), ring.size(), workers,
      [&](std::size_t i, std::size_t s) {  // stage, on this thread
        const auto& it = items[i];
        auto& sl = ring[s];
        sl.plain.resize(it.last - it.first);
        if constexpr (!in_place) sl.staging.resize_without_borrowing(static_cast<std::size_t>(it.bytes));
        std::uint64_t at = 0;
        for (auto k = it.first; k < it.last; ++k) {
          const auto& j = jobs[k];
          const auto& ref = tensors[j.tensor].ref;
          if constexpr (in_place) {
            if (j.slice.contiguous) sl.plain[k - it.first] = {device.host_view(ref) + j.slice.byte_offset, j.slice.bytes};
          } else {
            const auto part = sl.staging.span().subspan(at, j.slice.bytes);
            sl.copies.start(device, ref, j.slice.byte_offset, part);  // waited for by the worker
            sl.plain[k - it.first] = part;
            at += j.slice.bytes;
          }
        }
      },
      [&](std::size_t i, std::size_t s) {  // gather, encode and hash, on a worker
        const auto& it = items[i];
        auto& sl = ring[s];
        sl.copies.wait();  // the staged bytes have landed
        sl.stored.resize(it.last - it.first);
        sl.hash.resize(it.last - it.first);
        sl.gathered.resize(static_cast<std::size_t>(it.gathered));
        sl.encoded.resize(static_cast<std::size_t>(it.encoded));
        std::size_t gathered = 0, encoded = 0;
        for (auto k = it.first; k < it.last; ++k) {
          const auto& j = jobs[k];
          const auto& ref = tensors[j.tensor].ref;
          auto& plain = sl.plain[k - it.first];
          if constexpr (in_place) {
            if (!j.slice.contiguous) {
              gather_box(device.host_view(ref), ref.shape(), j.slice, size_of(ref.type()), sl.gathered.data() + gathered);
              plain = {sl.gathered.data() + gathered, static_cast<std::size_t>(j.slice.bytes)};
              gathered += plain.size();
            }
          }
          auto& stored = sl.stored[k - it.first];
          stored = plain;
          if (j.codec != 0) {
            const auto room = std::span(sl.encoded).subspan(encoded, codec.max_encoded_size(plain.size()));
            std::size_t n;
            if constexpr (encodes_with<C>)
              n = codec.encode_with(j.codec, plain, ref.type(), room);  // the codec's per-tensor choice
            else
              n = codec.encode(plain, ref.type(), room);
            stored = room.first(n);
            encoded += room.size();
          }
          sl.hash[k - it.first] = xxh3(stored);
        }
      },
      [&](std::size_t i, std::size_t s) {  // append, in order
        const auto& it = items[i];
        const auto& sl = ring[s];
        for (auto k = it.first; k < it.last; ++k) {
          const auto& j = jobs[k];
          const auto stored = sl.stored[k - it.first];
          // Smaller chunks follow the one before at once; raw ones written from a tensor's memory
          // are placed for it where asked (as in_page says: `stored` is that memory).
          const bool from_tensor = in_place && j.codec == 0 && j.slice.contiguous;
          const bool placed = from_tensor && settings.place_for_memory;
          pad_to(chunk_start(pos, stored.size(), placed ? reinterpret_cast<std::uintptr_t>(stored.data()) % alignment : 0));
          auto& table = out.index.tensors[j.tensor].chunks;
          table.file_offset[j.row] = pos;
          table.stored_size[j.row] = stored.size();
          table.xxh3[j.row] = sl.hash[k - it.first];
          if constexpr (retains_writes<decltype(w)>) {
            if (from_tensor)
              w.write_retained(stored);  // the tensor stays put until the file is synced, below
            else
              w.write(stored);
          } else {
            w.write(stored);
          }
          pos += stored.size();
        }
      });
  pad_to(align_up(pos));  // the chunk area ends on a block boundary
  for (const auto& v : values) {
    out.index.values.push_back({v.name, v.rank, pos, v.bytes.size(), xxh3(v.bytes)});
    w.write(v.bytes);
    pos += v.bytes.size();
  }
  const auto index = encode_index(out.index);
  const auto index_bytes = std::as_bytes(std::span(index.data(), index.size()));
  out.index_xxh3 = xxh3(index_bytes);
  w.write(index_bytes);
  w.write(make_trailer({pos, index.size(), out.index_xxh3}));
  out.size = pos + index.size() + trailer_bytes;
  w.sync();
  w.publish();
  return out;
}

/// The saved bytes of a value (a `value_meta`: file offset, size, XXH3, name, rank) in the file
/// `key`, checked against their XXH3: a mismatch is `corrupt`, naming the file and the value.
template <class S, class Value>
std::vector<std::byte> read_value(const S& storage, const std::string& key, const Value& v) {
  std::vector<std::byte> bytes(v.size);
  storage.read(key, v.file_offset, bytes);
  if (xxh3(bytes) != v.xxh3)
    throw error(error_kind::corrupt, storage.describe(key) + ": checksum mismatch in value " + printable(v.name) + " of rank " +
                                         std::to_string(v.rank));
  return bytes;
}

/// A shard file's footer index, checked, and where it starts in the file.
struct footer {
  // Megabytes for a file of 100,000 tensors, read at every load: in table memory, which a
  // process's next load finds warm, where a fresh vector's pages were faulted in and zeroed.
  table_vector<std::byte> index;
  std::uint64_t index_offset = 0;
};

/// Checks the parts of a shard file that metadata.json does not cover: its size, header block
/// and footer index (which must be the one rank 0 recorded), and returns the index. `key` is
/// the storage key.
template <class S>
footer verify_shard_file(const S& storage, const std::string& key, std::uint64_t expected_size,
                         std::uint64_t expected_index_xxh3) {
  const auto name = storage.describe(key);
  const auto size = storage.size(key);
  if (!size) throw error(error_kind::corrupt, name + " is missing");
  if (*size != expected_size)
    throw error(error_kind::corrupt, name + " has " + std::to_string(*size) + " bytes, metadata.json recorded " +
                                         std::to_string(expected_size) + " (truncated or extended)");
  std::array<std::byte, header_used> h;
  storage.read(key, 0, h);
  const auto version = check_header(h, name);
  std::array<std::byte, trailer_bytes> tb;
  storage.read(key, *size - trailer_bytes, tb);
  const auto t = check_trailer(tb, *size, name);
  if (const auto v = get_u32(tb.data() + 24); v != version)
    throw error(error_kind::corrupt, name + ": its header says format version " + std::to_string(version) + ", its trailer " +
                                         std::to_string(v));
  if (t.index_xxh3 != expected_index_xxh3)
    throw error(error_kind::corrupt, name + ": footer index checksum " + to_hex(t.index_xxh3) + " differs from the " +
                                         to_hex(expected_index_xxh3) + " recorded in metadata.json");
  footer out{table_vector<std::byte>(t.index_size), t.index_offset};
  storage.read(key, t.index_offset, out.index);
  if (xxh3(out.index) != t.index_xxh3) throw error(error_kind::corrupt, name + ": footer index checksum mismatch");
  // The index's own version follows its endianness byte; parse_index bounds the rest.
  if (out.index.size() >= 5 && get_u32(out.index.data() + 1) != version)
    throw error(error_kind::corrupt, name + ": its header says format version " + std::to_string(version) +
                                         ", its footer index " + std::to_string(get_u32(out.index.data() + 1)));
  return out;
}

}  // namespace ckpt::detail
