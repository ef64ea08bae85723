#pragma once
// Writing one rank's shard file, and reading chunks back with their checks.

#include <array>
#include <sstream>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../visitor.hpp"
#include "format.hpp"
#include "hash.hpp"
#include "region.hpp"

namespace ckpt::detail {

/// A device policy that can hand out the tensor's bytes in place (host memory).
template <class D>
concept has_host_view = requires(const D& d, const tensor_ref& t) {
  { d.host_view(t) } -> std::same_as<std::byte*>;
};

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

/// Writes one shard file: header block, 4 KiB-aligned chunks, values, footer index, trailer;
/// then fsyncs and publishes it. The storage writer discards the temporary file on failure.
template <class S, class C, class D>
written_shard write_shard(S& storage, const std::string& tag, const std::string& path, std::uint32_t rank,
                          const std::vector<stored_tensor>& tensors, const std::vector<stored_value>& values,
                          const C& codec, D& device, std::uint64_t chunk_bytes) {
  static const std::array<std::byte, alignment> zeros{};
  written_shard out;
  out.path = path;
  out.index.rank = rank;
  auto w = storage.create(tag + "/" + path);
  {
    auto header = make_header();
    std::array<std::byte, header_bytes> block{};
    std::copy(header.begin(), header.end(), block.begin());
    w.write(block);
  }
  std::uint64_t pos = header_bytes;
  std::vector<std::byte> staging, encoded;
  constexpr bool direct = has_host_view<D> && C::id == 0;  // raw bytes straight from the tensor
  for (const auto& t : tensors) {
    const auto elem = size_of(t.ref.type());
    const auto base = t.ref.global_offset();
    auto& group = out.index.tensors.emplace_back();
    group.name = t.name;
    group.type = t.ref.type();
    group.global_shape = t.ref.global_shape();
    group.chunks.ndim = static_cast<std::uint32_t>(group.global_shape.size());
    shape_t global_offset(base.size());
    for (const auto& c : split_into_chunks(t.ref.shape(), elem, chunk_bytes)) {
      std::span<const std::byte> src;
      if constexpr (direct) {
        src = {device.host_view(t.ref) + c.byte_offset, c.bytes};
      } else {
        staging.resize(c.bytes);
        device.to_host(t.ref, c.byte_offset, staging);
        src = staging;
      }
      std::span<const std::byte> enc = src;
      if constexpr (C::id != 0) {
        encoded.resize(codec.max_encoded_size(src.size()));
        enc = std::span<const std::byte>(encoded.data(), codec.encode(src, t.ref.type(), encoded));
      }
      for (std::size_t d = 0; d < base.size(); ++d) global_offset[d] = base[d] + c.offset[d];
      group.chunks.push(0, global_offset, c.shape, C::id, pos, enc.size(), c.bytes, xxh3(enc));
      w.write(enc);
      pos += enc.size();
      if (const auto pad = align_up(pos) - pos; pad) {
        w.write(std::span<const std::byte>(zeros.data(), pad));
        pos += pad;
      }
    }
  }
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

/// Checks the parts of a shard file that metadata.json does not cover: its size, header block
/// and footer index (which must be the one rank 0 recorded). `key` is the storage key.
template <class S>
void verify_shard_file(const S& storage, const std::string& key, std::uint64_t expected_size,
                       std::uint64_t expected_index_xxh3) {
  const auto name = storage.describe(key);
  const auto size = storage.size(key);
  if (!size) throw error(error_kind::corrupt, name + " is missing");
  if (*size != expected_size)
    throw error(error_kind::corrupt, name + " has " + std::to_string(*size) + " bytes, metadata.json recorded " +
                                         std::to_string(expected_size) + " (truncated or extended)");
  std::array<std::byte, header_used> h;
  storage.read(key, 0, h);
  check_header(h, name);
  std::array<std::byte, trailer_bytes> tb;
  storage.read(key, *size - trailer_bytes, tb);
  const auto t = check_trailer(tb, *size, name);
  if (t.index_xxh3 != expected_index_xxh3)
    throw error(error_kind::corrupt, name + ": footer index checksum " + to_hex(t.index_xxh3) + " differs from the " +
                                         to_hex(expected_index_xxh3) + " recorded in metadata.json");
  std::vector<std::byte> index(t.index_size);
  storage.read(key, t.index_offset, index);
  if (xxh3(index) != t.index_xxh3) throw error(error_kind::corrupt, name + ": footer index checksum mismatch");
}

}  // namespace ckpt::detail

namespace ckpt::detail {

/// What a rank sends to the root under a gathering policy: its tensors' bytes with their
/// geometry, and its values. The root unpacks it into buffers it owns.
struct gathered {
  std::vector<std::vector<std::byte>> buffers;  // owns the tensor bytes
  std::vector<stored_tensor> tensors;
  std::vector<stored_value> values;
};

template <class D>
std::string pack_for_root(const std::vector<stored_tensor>& tensors, const std::vector<stored_value>& values, D& device) {
  std::ostringstream os(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(os);
    ar(static_cast<std::uint64_t>(tensors.size()));
    std::vector<std::byte> staging;
    for (const auto& t : tensors) {
      write_string(ar, t.name);
      ar(static_cast<std::uint8_t>(t.ref.type()));
      write_shape(ar, t.ref.shape());
      write_shape(ar, t.ref.global_shape());
      write_shape(ar, t.ref.global_offset());
      staging.resize(t.ref.nbytes());
      device.to_host(t.ref, 0, staging);
      ar(static_cast<std::uint64_t>(staging.size()));
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

inline void unpack_at_root(std::span<const std::byte> bytes, int from, gathered& into) {
  const std::string where = "the tensors sent by rank " + std::to_string(from);
  bounded_reader r(bytes, where, error_kind::communication);
  const auto n = r.count(16, "tensor");
  for (std::uint64_t i = 0; i < n; ++i) {
    auto name = r.string();
    const auto dt = dtype_from_id(r.u8());
    if (!dt) r.fail("unknown dtype");
    auto shape = r.shape();
    auto global = r.shape();
    auto offset = r.shape();
    const auto size = r.count(1, "tensor byte");
    auto& b = into.buffers.emplace_back(size);
    r.copy(b.data(), size);
    tensor_ref ref(*dt, std::move(shape), b.data());
    if (ref.nbytes() != size) r.fail("tensor size does not match its shape");
    ref.sharded(shard_spec{.global_shape = std::move(global), .offset = std::move(offset)});
    into.tensors.push_back({std::move(name), std::move(ref)});
  }
  const auto m = r.count(12, "value");
  for (std::uint64_t i = 0; i < m; ++i) {
    stored_value v;
    v.name = r.string();
    v.rank = r.u32();
    v.bytes.resize(r.count(1, "value byte"));
    r.copy(v.bytes.data(), v.bytes.size());
    into.values.push_back(std::move(v));
  }
  if (r.remaining() != 0) r.fail("stray bytes at its end");
}

}  // namespace ckpt::detail
