#pragma once
// metadata.json: the commit marker and the global map of a tag (docs/format.md). It is a JSON
// document (the structures below, written and read by impl/metadata.ipp) wrapped in an envelope
// that carries its XXH3-64, so a flipped byte anywhere in it is caught before a single field is
// trusted:
//
//   {"xxh3_64": "<16 hex digits>", "metadata": {"ckpt": {...}}}
//
// The checksum covers exactly the bytes of the inner document.

#include <cstdint>
#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../config.hpp"
#include "../dtype.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../topology.hpp"
#include "chunk_layout.hpp"
#include "chunk_table.hpp"
#include "format.hpp"
#include "hash.hpp"
#include "keys.hpp"
#include "span_stream.hpp"
#include "table_memory.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

struct file_meta {
  std::string path;  // relative to the tag directory
  std::uint32_t rank = 0;
  std::uint64_t size = 0;
  std::uint64_t index_xxh3 = 0;
};

/// The version of metadata.json and chunk_map.bin that ckpt writes: 2, whose chunk map holds
/// each tensor's chunk_layout (its chunks' details stay in the shard files' footer indexes).
/// Version 1 tags, whose chunk map lists every chunk with its details, are still read. Shard
/// files have a version of their own (detail/format.hpp).
inline constexpr std::uint32_t metadata_version = 2;

/// One tensor: its name, dtype and global shape in metadata.json; where its chunks are in
/// chunk_map.bin, where metadata.json records only how many there are.
struct tensor_meta {
  std::string name;
  dtype type = dtype::f32;
  shape_t shape;  // global shape, in memory order (reversed logical shape when column-major)
  layout order = layout::row_major;
  /// The chunks' details (region, file, place, codec, size, checksum). Version 1: all of them,
  /// from chunk_map.bin. Version 2: only those of the files a load read the footers of
  /// (read_chunk_details); `placement` says where all of them are.
  chunk_table chunks;
  std::optional<chunk_layout> placement;  // version 2
  std::uint64_t chunk_count = 0;  // as metadata.json states it; chunk_map.bin must agree
};

/// Where the chunk columns of every tensor are: a file in the tag directory, and its checksum.
struct chunk_map_meta {
  std::string path = "chunk_map.bin";
  std::uint64_t size = 0;
  std::uint64_t xxh3 = 0;
};

struct value_meta {
  std::string name;
  std::uint32_t rank = 0;
  std::uint32_t file = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t size = 0;
  std::uint64_t xxh3 = 0;
};

struct metadata {
  std::uint32_t format_version = metadata_version;
  std::string tag;
  std::uint64_t iteration = 0;
  ckpt::topology topology;
  ckpt::config config;
  std::vector<file_meta> files;
  table_vector<tensor_meta> tensors;  // hundreds of bytes each: tens of MB for 100,000 tensors (table_memory.hpp)
  std::vector<value_meta> values;
  chunk_map_meta chunk_map;
};

/// The storage key of file `f` of a tag: "<tag>/<path>".
inline std::string file_key(const metadata& md, std::uint32_t f) { return join_key(md.tag, md.files[f].path); }

inline constexpr std::string_view envelope_head = "{\"xxh3_64\": \"";
inline constexpr std::string_view envelope_mid = "\", \"metadata\": ";
inline constexpr std::string_view envelope_tail = "}\n";
inline constexpr std::uint64_t max_metadata_bytes = std::uint64_t{8} << 30;
inline constexpr int max_json_depth = 32;

/// metadata.json's text in one string: encode_metadata_around's head and tail with the tensors'
/// records between them.
CKPT_DECL std::string encode_metadata(const metadata& md);

/// The tensors' records of metadata.json, its `tensors` array. They are most of the file (about 90 bytes per tensor) and known once the ranks' reports
/// are merged, so a save encodes them while its bytes are written (detail::background_merge);
/// the commit then writes them between the other parts, uncopied (metadata_text).
CKPT_DECL std::string encode_tensor_records(const metadata& md);

/// metadata.json in three parts, written one after another: `head` (the envelope with the
/// checksum of the whole document, and the members before the tensors), the tensors' records
/// (`encode_tensor_records` of the same metadata, held by the caller) and `tail` (the members
/// after them), whose checksum covers all three.
struct metadata_text {
  std::string head, tail;
};
CKPT_DECL metadata_text encode_metadata_around(const metadata& md, std::string_view tensor_records);

/// A tag's metadata as rank 0's merge leaves it for the commit, with its tensors' records
/// encoded from it (encode_tensor_records). After the merge only the files' sizes and checksums,
/// the values and the chunk map's place are added (attach_written, write_chunk_map), none of
/// which the records hold, so the two stay one.
struct merged_metadata {
  metadata md;
  std::string tensor_records;
};

/// Rejects JSON nested deeper than `max_json_depth` before the recursive parser sees it, and
/// numbers longer than any ckpt writes. Returns how many objects the document holds.
CKPT_DECL std::size_t check_json_depth(std::string_view doc, const std::string& file);

/// Checks a metadata envelope, then parses and validates the document. `file` names it in errors.
CKPT_DECL metadata decode_metadata(std::string_view text, const std::string& file);

/// Everything a reader must check before trusting metadata: versions, names, shapes, and that
/// every chunk and value lies inside its file, so no later read can go astray.
CKPT_DECL void validate_metadata(const metadata& md, std::string_view expected_tag, const std::string& file);

/// That the chunks of `t`, a tensor of `md`, cover it exactly once, or a `corrupt` error naming
/// `md_name`. (Not a template: compiled once with CKPT_SEPARATE_COMPILATION, where it was once
/// instantiated for every Storage.)
CKPT_DECL void check_stored_tiling(const metadata& md, const tensor_meta& t, const std::string& md_name);

// --- chunk_map.bin --------------------------------------------------------------------------------
// "CKPTCMAP", u32 version, u32 flags (0), then cereal portable binary: u64 tensor count, and for
// each tensor of metadata.json, in its order: version 1, the packed chunk columns (emit_table);
// version 2, its chunk_layout (emit_layout). Its size and XXH3-64 are recorded in
// metadata.json, which is written after it. The version is metadata.json's.

inline constexpr std::array<char, 8> chunk_map_magic = {'C', 'K', 'P', 'T', 'C', 'M', 'A', 'P'};

/// Hands a version-2 layout's bytes to `put(const void*, std::size_t)`: u8 kind; a grid's cell
/// shape (ndim u64), u64 piece count and each piece's offset and shape (2 ndim u64), u64 run
/// count and each run (u64 cells, u32 first file, u32 step); a list's u64 chunk count and each
/// chunk's u32 file, offset and shape. Unpacked: at a few dozen bytes per grid, size does not
/// matter, and a list is only for the rare layouts that are not a grid.
template <class Put>
void emit_layout(const chunk_layout& l, std::size_t ndim, Put&& put) {
  const auto kind = static_cast<std::uint8_t>(l.how);
  put(&kind, 1);
  if (l.how == chunk_layout::kind::grid) {
    put(l.block.data(), ndim * 8);
    const std::uint64_t pieces = l.pieces().size(), runs = l.runs.size();
    put(&pieces, 8);
    if (pieces) put(l.pieces().coords.data(), pieces * 2 * ndim * 8);
    put(&runs, 8);
    for (const auto& r : l.runs) {
      put(&r.cells, 8);
      put(&r.first, 4);
      put(&r.step, 4);
    }
    return;
  }
  const std::uint64_t n = l.chunks().size();
  put(&n, 8);
  for (std::size_t i = 0; i < n; ++i) {
    put(&l.chunks().file[i], 4);
    if (ndim) put(l.chunks().coords.data() + i * 2 * ndim, 2 * ndim * 8);
  }
}

/// Hands the bytes of chunk_map.bin to `put(const void*, std::size_t)` in file order: the
/// header, then every tensor's chunk columns. The same bytes cereal's PortableBinary archive
/// writes for these fields (byte-order flag, then little-endian integers and column blocks),
/// without an ostream: at millions of chunks, going through one costs more than the write.
template <class Put>
void emit_chunk_map(const metadata& md, Put&& put) {
  put(chunk_map_magic.data(), 8);
  const std::uint32_t version = md.format_version, flags = 0;
  put(&version, 4);
  put(&flags, 4);
  const std::uint8_t little = 1;
  put(&little, 1);
  const std::uint64_t count = md.tensors.size();
  put(&count, 8);
  for (const auto& t : md.tensors) {
    if (md.format_version == 1)
      emit_table(t.chunks, put);
    else
      emit_layout(*t.placement, t.shape.size(), put);
  }
}

/// The size of chunk_map.bin for `md`.
CKPT_DECL std::uint64_t chunk_map_bytes(const metadata& md) noexcept;

/// Encodes chunk_map.bin into memory (tools and tests; a commit streams it with
/// write_chunk_map instead).
CKPT_DECL std::string encode_chunk_map(const metadata& md);

/// Writes chunk_map.bin through `w` (a Storage writer: write(bytes), then the caller syncs
/// and publishes), staged through `staging` (reused from commit to commit), and records its
/// size and XXH3-64 in `md.chunk_map`. At 4096 ranks the map is hundreds of MB: streaming it
/// from the chunk tables through a buffer that stays in cache, hashing each piece as it goes
/// out, avoids building (and page-faulting in) a second copy of it.
template <class Writer>
void write_chunk_map(metadata& md, Writer& w, std::vector<std::byte>& staging) {
  constexpr std::size_t piece = std::size_t{4} << 20;
  staging.resize(piece);
  xxh3_stream hash;
  std::size_t used = 0;
  std::uint64_t total = 0;
  auto flush = [&] {
    const std::span<const std::byte> b(staging.data(), used);
    hash.update(b);
    w.write(b);
    total += used;
    used = 0;
  };
  emit_chunk_map(md, [&](const void* src, std::size_t n) {
    const auto* s = static_cast<const std::byte*>(src);
    while (n > 0) {
      if (used == piece) flush();
      const auto k = std::min(n, piece - used);
      std::memcpy(staging.data() + used, s, k);
      used += k;
      s += k;
      n -= k;
    }
  });
  flush();
  md.chunk_map.size = total;
  md.chunk_map.xxh3 = hash.digest();
}

/// Fills the chunk tables of `md` (whose JSON part is already parsed) from chunk_map.bin.
CKPT_DECL void decode_chunk_map(std::span<const std::byte> bytes, metadata& md, const std::string& file);

// --- latest ---------------------------------------------------------------------------------------
// `latest` holds the committed tag and its checksum: "<tag>\n<16 hex of XXH3-64(tag)>\n".

CKPT_DECL std::string encode_latest(std::string_view tag);

CKPT_DECL std::string decode_latest(std::string_view text, const std::string& file);

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/metadata.ipp"
#endif
