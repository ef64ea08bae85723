#pragma once
// The definitions of detail/format.hpp: a shard file's footer index, header and trailer.
// Header-only builds include this at the end of detail/format.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.

#include <cassert>

namespace ckpt::detail {

CKPT_DECL std::string encode_index(const shard_index& idx) {
  // cereal's PortableBinary layout (what bounded_reader reads: the byte-order flag, then
  // little-endian fields, the host's own order: packed.hpp requires a little-endian host),
  // written straight into a string of its exact size: through cereal's stream, an index of
  // 100,000 tensors cost a stream call per field and a buffer per table.
  std::vector<table_widths::column_widths> widths;
  widths.reserve(idx.tensors.size());
  std::size_t n = 1 + 4 + 4 + 8 + 8;
  for (const auto& g : idx.tensors) {
    widths.push_back(table_widths::of(g.chunks));
    n += 8 + g.name.size() + 1 + 8 + 8 * g.global_shape.size() + table_widths::bytes(widths.back(), g.chunks.size());
  }
  for (const auto& v : idx.values) n += 8 + v.name.size() + 4 + 3 * 8;
  std::string out(n, '\0');
  auto* p = reinterpret_cast<std::byte*>(out.data());
  const auto put = [&](const void* src, std::size_t k) {
    if (k) std::memcpy(p, src, k);
    p += k;
  };
  const auto u64 = [&](std::uint64_t v) { put(&v, 8); };
  const auto str = [&](const std::string& v) {
    u64(v.size());
    put(v.data(), v.size());
  };
  const std::uint8_t flag = 1;
  put(&flag, 1);
  put(&format_version, 4);
  put(&idx.rank, 4);
  u64(idx.tensors.size());
  for (std::size_t i = 0; i < idx.tensors.size(); ++i) {
    const auto& g = idx.tensors[i];
    str(g.name);
    const auto type = dtype_byte(g.type, g.order);
    put(&type, 1);
    u64(g.global_shape.size());
    put(g.global_shape.data(), 8 * g.global_shape.size());
    emit_table(g.chunks, widths[i], put);
  }
  u64(idx.values.size());
  for (const auto& v : idx.values) {
    str(v.name);
    put(&v.rank, 4);
    u64(v.file_offset);
    u64(v.size);
    u64(v.xxh3);
  }
  assert(p == reinterpret_cast<std::byte*>(out.data()) + out.size());  // the sizes above are what was written
  return out;
}

CKPT_DECL shard_index decode_index(std::span<const std::byte> bytes, const std::string& file) {
  shard_index idx;
  idx.rank = parse_index(
      bytes, "index of " + file,
      [&](std::string_view name, dtype t, layout l, const shape_t& shape, bounded_reader& r) {
        auto& g = idx.tensors.emplace_back();
        g.name = std::string(name);
        g.type = t;
        g.order = l;
        g.global_shape = shape;
        r.table(g.chunks, shape.size());
      },
      [&](value_record&& v) { idx.values.push_back(std::move(v)); });
  return idx;
}

CKPT_DECL std::uint32_t check_header(std::span<const std::byte, header_used> h, const std::string& file) {
  if (std::memcmp(h.data(), header_magic.data(), 8) != 0)
    throw error(error_kind::corrupt, file + " is not a ckpt shard file (bad magic)");
  if (get_u64(h.data() + 16) != xxh3(std::span<const std::byte>(h.data(), 16)))
    throw error(error_kind::corrupt, file + ": header checksum mismatch");
  if (const auto v = get_u32(h.data() + 8); !readable_version(v))
    throw error(error_kind::corrupt, file + " has format version " + std::to_string(v) + ", " + versions_read());
  if (get_u32(h.data() + 12) != 0) throw error(error_kind::corrupt, file + ": unknown header flags");
  return get_u32(h.data() + 8);
}

CKPT_DECL std::array<std::byte, trailer_bytes> make_trailer(const trailer& t) {
  std::array<std::byte, trailer_bytes> b{};
  put_u64(b.data(), t.index_offset);
  put_u64(b.data() + 8, t.index_size);
  put_u64(b.data() + 16, t.index_xxh3);
  put_u32(b.data() + 24, format_version);
  put_u32(b.data() + 28, 0);
  std::memcpy(b.data() + 32, trailer_magic.data(), 8);
  return b;
}

CKPT_DECL trailer check_trailer(std::span<const std::byte, trailer_bytes> b, std::uint64_t file_size, const std::string& file) {
  if (std::memcmp(b.data() + 32, trailer_magic.data(), 8) != 0)
    throw error(error_kind::corrupt, file + ": no index trailer at the end of the file (truncated or extended?)");
  if (!readable_version(get_u32(b.data() + 24)) || get_u32(b.data() + 28) != 0)
    throw error(error_kind::corrupt, file + ": bad trailer version or flags");
  trailer t{get_u64(b.data()), get_u64(b.data() + 8), get_u64(b.data() + 16)};
  if (t.index_offset < header_bytes || t.index_offset > file_size || t.index_size > file_size - t.index_offset ||
      t.index_offset + t.index_size + trailer_bytes != file_size)
    throw error(error_kind::corrupt, file + ": trailer places the index at [" + std::to_string(t.index_offset) + ", +" +
                                         std::to_string(t.index_size) + ") in a file of " + std::to_string(file_size) +
                                         " bytes");
  return t;
}

}  // namespace ckpt::detail
