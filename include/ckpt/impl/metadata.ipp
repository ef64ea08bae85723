#pragma once
// The definitions of detail/metadata.hpp: metadata.json through cereal's JSON archive, chunk_map.bin, latest.
// Header-only builds include this at the end of detail/metadata.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.

#include <cereal/archives/json.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <set>
#include <sstream>
#include <unordered_set>

namespace ckpt::detail {

CKPT_DECL std::string encode_metadata(const metadata& md) {
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

CKPT_DECL void check_json_depth(std::string_view doc, const std::string& file) {
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

CKPT_DECL metadata decode_metadata(std::string_view text, const std::string& file) {
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

CKPT_DECL void validate_metadata(const metadata& md, std::string_view expected_tag, const std::string& file) {
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

CKPT_DECL std::uint64_t chunk_map_bytes(const metadata& md) noexcept {
  std::uint64_t size = 16 + 1 + 8;
  for (const auto& t : md.tensors) size += table_bytes(t.chunks);
  return size;
}

CKPT_DECL std::string encode_chunk_map(const metadata& md) {
  std::string out(chunk_map_bytes(md), '\0');
  auto* p = out.data();
  emit_chunk_map(md, [&](const void* src, std::size_t n) {
    if (n) std::memcpy(p, src, n);
    p += n;
  });
  return out;
}

CKPT_DECL void decode_chunk_map(std::span<const std::byte> bytes, metadata& md, const std::string& file) {
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

CKPT_DECL std::string encode_latest(std::string_view tag) {
  std::string s(tag);
  s += '\n';
  s += to_hex(xxh3(tag));
  s += '\n';
  return s;
}

CKPT_DECL std::string decode_latest(std::string_view text, const std::string& file) {
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
