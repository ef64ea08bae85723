#pragma once
// metadata.json: the commit marker and the global map of a tag (docs/format.md). It is cereal
// JSON wrapped in an envelope that carries its XXH3-64, so a flipped byte anywhere in it is
// caught before a single field is trusted:
//
//   {"xxh3_64": "<16 hex digits>", "metadata": <cereal JSON document>}
//
// The checksum covers exactly the bytes of the inner document.

#include <cstdint>
#include <set>
#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include <cereal/archives/json.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "../config.hpp"
#include "../dtype.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../topology.hpp"
#include "chunk_table.hpp"
#include "format.hpp"
#include "hash.hpp"
#include "keys.hpp"
#include "span_stream.hpp"

namespace ckpt::detail {

struct file_meta {
  std::string path;  // relative to the tag directory
  std::uint32_t rank = 0;
  std::uint64_t size = 0;
  std::uint64_t index_xxh3 = 0;

  template <class A>
  void save(A& ar) const {
    ar(CEREAL_NVP(path), CEREAL_NVP(rank), CEREAL_NVP(size), cereal::make_nvp("index_xxh3", to_hex(index_xxh3)));
  }
  template <class A>
  void load(A& ar) {
    std::string h;
    ar(CEREAL_NVP(path), CEREAL_NVP(rank), CEREAL_NVP(size), cereal::make_nvp("index_xxh3", h));
    if (!from_hex(h, index_xxh3)) throw error(error_kind::corrupt, "bad index_xxh3 of file " + printable(path));
  }
};

/// One tensor: its name, dtype and global shape in metadata.json; its chunks (columns) in
/// chunk_map.bin, where metadata.json records only how many there are.
struct tensor_meta {
  std::string name;
  dtype type = dtype::f32;
  shape_t shape;  // global shape, in memory order (reversed logical shape when column-major)
  layout order = layout::row_major;
  chunk_table chunks;
  std::uint64_t chunk_count = 0;  // as metadata.json states it; chunk_map.bin must agree

  template <class A>
  void save(A& ar) const {
    ar(CEREAL_NVP(name), cereal::make_nvp("dtype", std::string(to_string(type))), CEREAL_NVP(shape),
       cereal::make_nvp("chunks", static_cast<std::uint64_t>(chunks.size())));
    // Only column-major tensors carry the member: row-major ones are written as before it existed.
    if (order == layout::column_major) ar(cereal::make_nvp("layout", std::string("column_major")));
  }
  template <class A>
  void load(A& ar) {
    std::string t;
    ar(CEREAL_NVP(name), cereal::make_nvp("dtype", t), CEREAL_NVP(shape), cereal::make_nvp("chunks", chunk_count));
    const auto dt = dtype_from_string(t);
    if (!dt) throw error(error_kind::corrupt, "unknown dtype " + printable(t) + " of tensor " + printable(name));
    type = *dt;
    order = layout::row_major;
    // "layout" is optional: peek at the next member's name rather than search for it (cereal
    // would throw at the end of the object).
    if constexpr (std::is_same_v<A, cereal::JSONInputArchive>) {
      const char* next = ar.getNodeName();
      if (next && std::string_view(next) == "layout") {
        std::string l;
        ar(cereal::make_nvp("layout", l));
        if (l == "column_major")
          order = layout::column_major;
        else if (l != "row_major")
          throw error(error_kind::corrupt, "unknown layout " + printable(l) + " of tensor " + printable(name) +
                                               " (expected \"row_major\" or \"column_major\")");
      }
    }
  }
};

/// Where the chunk columns of every tensor are: a file in the tag directory, and its checksum.
struct chunk_map_meta {
  std::string path = "chunk_map.bin";
  std::uint64_t size = 0;
  std::uint64_t xxh3 = 0;

  template <class A>
  void save(A& ar) const {
    ar(CEREAL_NVP(path), CEREAL_NVP(size), cereal::make_nvp("xxh3", to_hex(xxh3)));
  }
  template <class A>
  void load(A& ar) {
    std::string h;
    ar(CEREAL_NVP(path), CEREAL_NVP(size), cereal::make_nvp("xxh3", h));
    if (!from_hex(h, xxh3)) throw error(error_kind::corrupt, "bad chunk_map checksum text " + printable(h));
  }
};

struct value_meta {
  std::string name;
  std::uint32_t rank = 0;
  std::uint32_t file = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t size = 0;
  std::uint64_t xxh3 = 0;

  template <class A>
  void save(A& ar) const {
    ar(CEREAL_NVP(name), CEREAL_NVP(rank), CEREAL_NVP(file), CEREAL_NVP(file_offset), CEREAL_NVP(size),
       cereal::make_nvp("xxh3", to_hex(xxh3)));
  }
  template <class A>
  void load(A& ar) {
    std::string h;
    ar(CEREAL_NVP(name), CEREAL_NVP(rank), CEREAL_NVP(file), CEREAL_NVP(file_offset), CEREAL_NVP(size),
       cereal::make_nvp("xxh3", h));
    if (!from_hex(h, xxh3)) throw error(error_kind::corrupt, "bad checksum text of value " + printable(name));
  }
};

struct metadata {
  std::uint32_t format_version = detail::format_version;
  std::string tag;
  std::uint64_t iteration = 0;
  ckpt::topology topology;
  ckpt::config config;
  std::vector<file_meta> files;
  std::vector<tensor_meta> tensors;
  std::vector<value_meta> values;
  chunk_map_meta chunk_map;

  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(format_version), CEREAL_NVP(tag), CEREAL_NVP(iteration), CEREAL_NVP(topology), CEREAL_NVP(config),
       CEREAL_NVP(files), CEREAL_NVP(tensors), CEREAL_NVP(values), CEREAL_NVP(chunk_map));
  }
};

inline constexpr std::string_view envelope_head = "{\"xxh3_64\": \"";
inline constexpr std::string_view envelope_mid = "\", \"metadata\": ";
inline constexpr std::string_view envelope_tail = "}\n";
inline constexpr std::uint64_t max_metadata_bytes = std::uint64_t{8} << 30;
inline constexpr int max_json_depth = 32;

inline std::string encode_metadata(const metadata& md) {
  std::ostringstream os;
  {
    cereal::JSONOutputArchive ar(os, cereal::JSONOutputArchive::Options::Default());
    ar(cereal::make_nvp("ckpt", md));
  }
  const std::string doc = std::move(os).str();
  std::string out;
  out.reserve(doc.size() + 64);
  out += envelope_head;
  out += to_hex(xxh3(doc));
  out += envelope_mid;
  out += doc;
  out += envelope_tail;
  return out;
}

/// Rejects JSON nested deeper than `max_json_depth` before the recursive parser sees it.
inline void check_json_depth(std::string_view doc, const std::string& file) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    const char c = doc[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_json_depth) throw error(error_kind::corrupt, file + ": JSON nested too deeply");
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      // A number. rapidjson 1.1 (Debian's) reads past a table on some long exponents
      // (CVE-2024-38517; found again by tests/fuzz), and ckpt writes none: its numbers are
      // integers or doubles of at most 17 digits with 3-digit exponents.
      std::size_t end = i;
      std::size_t exponent_digits = 0;
      bool in_exponent = false;
      for (; end < doc.size(); ++end) {
        const char d = doc[end];
        if (d == 'e' || d == 'E') in_exponent = true;
        else if (in_exponent && d >= '0' && d <= '9') ++exponent_digits;
        else if (!((d >= '0' && d <= '9') || d == '-' || d == '+' || d == '.')) break;
      }
      if (end - i > 40 || exponent_digits > 3)
        throw error(error_kind::corrupt, file + ": number '" + printable(doc.substr(i, std::min<std::size_t>(end - i, 48))) +
                                             "' at byte " + std::to_string(i) + " is longer than any ckpt writes");
      i = end - 1;
    }
  }
}

/// Checks a metadata envelope, then parses and validates the document. `file` names it in errors.
inline metadata decode_metadata(std::string_view text, const std::string& file) {
  const auto fail = [&](const std::string& why) -> error { return error(error_kind::corrupt, file + ": " + why); };
  const std::size_t doc_begin = envelope_head.size() + 16 + envelope_mid.size();
  if (text.size() < doc_begin + envelope_tail.size() || !text.starts_with(envelope_head) ||
      text.substr(envelope_head.size() + 16, envelope_mid.size()) != envelope_mid || !text.ends_with(envelope_tail))
    throw fail("not a ckpt metadata file (bad envelope; truncated or extended?)");
  std::uint64_t want;
  if (!from_hex(text.substr(envelope_head.size(), 16), want)) throw fail("bad checksum text");
  const auto doc = text.substr(doc_begin, text.size() - doc_begin - envelope_tail.size());
  if (xxh3(doc) != want) throw fail("checksum mismatch (stored " + to_hex(want) + ", computed " + to_hex(xxh3(doc)) + ")");
  check_json_depth(doc, file);
  metadata md;
  try {
    span_streambuf buf(std::as_bytes(std::span(doc.data(), doc.size())));
    std::istream is(&buf);
    cereal::JSONInputArchive ar(is);
    ar(cereal::make_nvp("ckpt", md));
  } catch (const error& e) {
    throw fail(e.what());
  } catch (const std::exception& e) {
    throw fail(std::string("malformed JSON: ") + e.what());
  }
  return md;
}

/// Everything a reader must check before trusting metadata: versions, names, shapes, and that
/// every chunk and value lies inside its file, so no later read can go astray.
inline void validate_metadata(const metadata& md, std::string_view expected_tag, const std::string& file) {
  const auto fail = [&](const std::string& why) { throw error(error_kind::corrupt, file + ": " + why); };
  if (md.format_version != format_version)
    fail("format version " + std::to_string(md.format_version) + ", this ckpt reads version " + std::to_string(format_version));
  if (md.tag != expected_tag) fail("records tag " + printable(md.tag) + " but lives in " + printable(expected_tag));
  if (md.topology.world == 0 || md.topology.tp == 0 || md.topology.pp == 0 || md.topology.dp == 0)
    fail("topology has a zero size");
  for (const auto& f : md.files) {
    try {
      check_key(f.path);
    } catch (const error& e) {
      fail(e.what());
    }
    if (f.size < header_bytes + trailer_bytes) fail("file " + printable(f.path) + " recorded with " + std::to_string(f.size) + " bytes");
  }
  std::unordered_set<std::string_view> names;
  for (const auto& t : md.tensors) {
    if (!names.insert(t.name).second) fail("tensor " + printable(t.name) + " is listed twice");
    if (t.name.starts_with("__ckpt.")) {
      if (name_problem(t.name.substr(2)).size()) fail("invalid tensor name " + printable(t.name));
    } else if (auto p = name_problem(t.name); !p.empty()) {
      fail("tensor name " + printable(t.name) + " " + p);
    }
    if (t.shape.size() > max_dims) fail("tensor " + printable(t.name) + " has " + std::to_string(t.shape.size()) + " dimensions");
    try {
      checked_mul(element_count(t.shape, "tensor " + t.name), size_of(t.type), "tensor " + t.name);
    } catch (const error& e) {
      fail(e.what());
    }
    const auto& c = t.chunks;
    if (c.ndim != t.shape.size() || c.size() != t.chunk_count)
      fail("tensor " + printable(t.name) + ": chunk_map.bin holds " + std::to_string(c.size()) + " chunks of rank " +
           std::to_string(c.ndim) + ", metadata.json says " + std::to_string(t.chunk_count) + " of rank " +
           std::to_string(t.shape.size()));
    const auto elem = size_of(t.type);
    for (std::size_t i = 0; i < c.size(); ++i) {
      if (c.file[i] >= md.files.size())
        fail("tensor " + printable(t.name) + " has a chunk in file #" + std::to_string(c.file[i]) + " of " +
             std::to_string(md.files.size()));
      const auto off = c.offset(i), shp = c.shape(i);
      std::uint64_t elems = 1;
      for (std::size_t d = 0; d < t.shape.size(); ++d) {
        if (off[d] > t.shape[d] || shp[d] > t.shape[d] - off[d])
          fail("tensor " + printable(t.name) + " has a chunk outside its shape " + to_string(t.shape));
        elems *= shp[d];  // cannot overflow: each extent is within the checked global shape
      }
      const auto fsize = md.files[c.file[i]].size;
      if (c.file_offset[i] > fsize || c.stored_size[i] > fsize - c.file_offset[i])
        fail("tensor " + printable(t.name) + ": chunk [" + std::to_string(c.file_offset[i]) + ", +" +
             std::to_string(c.stored_size[i]) + ") lies outside " + md.files[c.file[i]].path + " (" +
             std::to_string(fsize) + " bytes)");
      if (c.codec[i] == 0 && c.stored_size[i] != elems * elem)
        fail("tensor " + printable(t.name) + ": raw chunk of " + std::to_string(c.stored_size[i]) +
             " bytes, its shape " + to_string(shp) + " holds " + std::to_string(elems * elem));
    }
  }
  std::set<std::pair<std::string_view, std::uint32_t>> value_keys;
  for (const auto& v : md.values) {
    if (auto p = name_problem(v.name); !p.empty()) fail("value name " + printable(v.name) + " " + p);
    if (v.rank >= md.topology.world)
      fail("value " + printable(v.name) + " of rank " + std::to_string(v.rank) + " in a world of " +
           std::to_string(md.topology.world));
    if (!value_keys.emplace(v.name, v.rank).second)
      fail("value " + printable(v.name) + " of rank " + std::to_string(v.rank) + " is listed twice");
    if (v.file >= md.files.size()) fail("value " + printable(v.name) + " in file #" + std::to_string(v.file));
    const auto fsize = md.files[v.file].size;
    if (v.file_offset > fsize || v.size > fsize - v.file_offset)
      fail("value " + printable(v.name) + " lies outside " + md.files[v.file].path);
  }
}

// --- chunk_map.bin --------------------------------------------------------------------------------
// "CKPTCMAP", u32 version, u32 flags (0), then cereal portable binary: u64 tensor count, and for
// each tensor of metadata.json, in its order, the packed chunk columns (emit_table). Its size and
// XXH3-64 are recorded in metadata.json, which is written after it.

inline constexpr std::array<char, 8> chunk_map_magic = {'C', 'K', 'P', 'T', 'C', 'M', 'A', 'P'};

/// Hands the bytes of chunk_map.bin to `put(const void*, std::size_t)` in file order: the
/// header, then every tensor's chunk columns. The same bytes cereal's PortableBinary archive
/// writes for these fields (byte-order flag, then little-endian integers and column blocks),
/// without an ostream: at millions of chunks, going through one costs more than the write.
template <class Put>
void emit_chunk_map(const metadata& md, Put&& put) {
  put(chunk_map_magic.data(), 8);
  const std::uint32_t version = format_version, flags = 0;
  put(&version, 4);
  put(&flags, 4);
  const std::uint8_t little = 1;
  put(&little, 1);
  const std::uint64_t count = md.tensors.size();
  put(&count, 8);
  for (const auto& t : md.tensors) emit_table(t.chunks, put);
}

/// The size of chunk_map.bin for `md`.
inline std::uint64_t chunk_map_bytes(const metadata& md) noexcept {
  std::uint64_t size = 16 + 1 + 8;
  for (const auto& t : md.tensors) size += table_bytes(t.chunks);
  return size;
}

/// Encodes chunk_map.bin into memory (tools and tests; a commit streams it with
/// write_chunk_map instead).
inline std::string encode_chunk_map(const metadata& md) {
  std::string out(chunk_map_bytes(md), '\0');
  auto* p = out.data();
  emit_chunk_map(md, [&](const void* src, std::size_t n) {
    if (n) std::memcpy(p, src, n);
    p += n;
  });
  return out;
}

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
inline void decode_chunk_map(std::span<const std::byte> bytes, metadata& md, const std::string& file) {
  const auto fail = [&](const std::string& why) { throw error(error_kind::corrupt, file + ": " + why); };
  if (bytes.size() != md.chunk_map.size)
    fail("has " + std::to_string(bytes.size()) + " bytes, metadata.json recorded " + std::to_string(md.chunk_map.size));
  if (xxh3(bytes) != md.chunk_map.xxh3) fail("checksum mismatch");
  if (bytes.size() < 17 || std::memcmp(bytes.data(), chunk_map_magic.data(), 8) != 0) fail("not a ckpt chunk map (bad magic)");
  if (get_u32(bytes.data() + 8) != format_version || get_u32(bytes.data() + 12) != 0) fail("bad version or flags");
  bounded_reader r(bytes.subspan(16), file);
  if (r.u64() != md.tensors.size()) fail("tensor count differs from metadata.json");
  for (auto& t : md.tensors) {
    if (t.shape.size() > max_dims) fail("tensor " + printable(t.name) + " has too many dimensions");
    r.table(t.chunks, t.shape.size());
  }
  if (r.remaining() != 0) fail(std::to_string(r.remaining()) + " stray bytes at its end");
}

// --- latest ---------------------------------------------------------------------------------------
// `latest` holds the committed tag and its checksum: "<tag>\n<16 hex of XXH3-64(tag)>\n".

inline std::string encode_latest(std::string_view tag) {
  std::string s(tag);
  s += '\n';
  s += to_hex(xxh3(tag));
  s += '\n';
  return s;
}

inline std::string decode_latest(std::string_view text, const std::string& file) {
  const auto nl = text.find('\n');
  if (nl == std::string_view::npos || text.size() != nl + 18 || text.back() != '\n')
    throw error(error_kind::corrupt, file + ": not a ckpt 'latest' file (expected a tag line and a checksum line)");
  const auto tag = text.substr(0, nl);
  std::uint64_t h;
  if (!from_hex(text.substr(nl + 1, 16), h) || h != xxh3(tag))
    throw error(error_kind::corrupt, file + ": checksum mismatch for tag " + printable(tag));
  if (auto p = tag_problem(tag); !p.empty()) throw error(error_kind::corrupt, file + ": names an invalid tag " + printable(tag) + " (" + p + ")");
  return std::string(tag);
}

}  // namespace ckpt::detail
