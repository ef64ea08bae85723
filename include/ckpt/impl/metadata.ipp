#pragma once
// The definitions of detail/metadata.hpp: metadata.json (through rapidjson), chunk_map.bin, latest.
// Header-only builds include this at the end of detail/metadata.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.

#include <set>
#include <unordered_set>

#include "../detail/coverage.hpp"
#include "../detail/json.hpp"

namespace ckpt::detail {

// The document is written and read with rapidjson directly. It is byte for byte what cereal's
// JSON archive wrote for these structures (version 1 of the format was written that way: an
// object {"ckpt": {...}}, indented by four spaces), and it is read the way cereal read it: by
// member name, extra members ignored.
namespace metadata_json {

using writer = rj::PrettyWriter<rj::StringBuffer>;

// Each tensor's and each value's record goes on one line of its own, written compactly: a model
// of 100,000 tensors has a metadata.json of 8 MB instead of 21 MB with every member on its own
// indented line, which every save writes and hashes and every load reads, hashes and parses.
using line_writer = rj::Writer<rj::StringBuffer>;

template <class W>
void string(W& w, std::string_view s) {
  w.String(s.data(), static_cast<rj::SizeType>(s.size()));
}
// One member each: its name, then its value (rapidjson's Uint writes what cereal wrote for the
// 32-bit fields, Uint64 for the 64-bit ones; the text is the same decimal either way).
template <class W>
void u32(W& w, const char* name, std::uint32_t v) {
  w.Key(name);
  w.Uint(v);
}
template <class W>
void u64(W& w, const char* name, std::uint64_t v) {
  w.Key(name);
  w.Uint64(v);
}
template <class W>
void str(W& w, std::string_view name, std::string_view v) {
  w.Key(name.data(), static_cast<rj::SizeType>(name.size()));
  string(w, v);
}

inline void write_tensor(line_writer& w, const tensor_meta& t) {
  w.StartObject();
  str(w, "name", t.name);
  str(w, "dtype", to_string(t.type));
  w.Key("shape");
  w.StartArray();
  for (auto e : t.shape) w.Uint64(e);
  w.EndArray();
  u64(w, "chunks", t.placement ? t.chunk_count : t.chunks.size());
  // Only column-major tensors carry the member: row-major ones are written as before it existed.
  if (t.order == layout::column_major) str(w, "layout", "column_major");
  w.EndObject();
}

inline void write_value(line_writer& w, const value_meta& v) {
  w.StartObject();
  str(w, "name", v.name);
  u32(w, "rank", v.rank);
  u32(w, "file", v.file);
  u64(w, "file_offset", v.file_offset);
  u64(w, "size", v.size);
  str(w, "xxh3", to_hex(v.xxh3));
  w.EndObject();
}

/// Writes `records` as the elements of an array, each on its own line: the pretty writer puts
/// the separator, the line break and the indentation (an empty raw value), and a compact writer
/// then writes the record after them into the same buffer, `out`.
template <class Records, class WriteOne>
void array_of_lines(writer& w, rj::StringBuffer& out, const Records& records, WriteOne write_one) {
  line_writer lw(out);
  w.StartArray();
  for (const auto& r : records) {
    w.RawValue("", 0, rj::kObjectType);
    lw.Reset(out);
    write_one(lw, r);
  }
  w.EndArray();
}

/// Opens the document's object and its "ckpt" member, at whose depth every member is written.
inline void open_document(writer& w) {
  w.SetIndent(' ', 4);
  w.StartObject();
  w.Key("ckpt");
}

/// The members of metadata.json's "ckpt" object but the tensors' array (encode_tensor_records),
/// which is left out (an empty raw value); returns where in `out` it belongs.
inline std::size_t write_around_records(writer& w, rj::StringBuffer& out, const metadata& md) {
  w.StartObject();
  u32(w, "format_version", md.format_version);
  str(w, "tag", md.tag);
  u64(w, "iteration", md.iteration);
  w.Key("topology");
  w.StartObject();
  u32(w, "tp", md.topology.tp);
  u32(w, "pp", md.topology.pp);
  u32(w, "dp", md.topology.dp);
  u32(w, "world", md.topology.world);
  w.EndObject();
  w.Key("config");
  w.StartObject();
  for (const auto& [k, v] : md.config.entries()) str(w, k, v);
  w.EndObject();
  w.Key("files");
  w.StartArray();
  for (const auto& f : md.files) {
    w.StartObject();
    str(w, "path", f.path);
    u32(w, "rank", f.rank);
    u64(w, "size", f.size);
    str(w, "index_xxh3", to_hex(f.index_xxh3));
    w.EndObject();
  }
  w.EndArray();
  w.Key("tensors");
  w.RawValue("", 0, rj::kArrayType);  // writes the ": " before the value, then nothing
  const auto records_at = out.GetSize();
  w.Key("values");
  array_of_lines(w, out, md.values, write_value);
  w.Key("chunk_map");
  w.StartObject();
  str(w, "path", md.chunk_map.path);
  u64(w, "size", md.chunk_map.size);
  str(w, "xxh3", to_hex(md.chunk_map.xxh3));
  w.EndObject();
  w.EndObject();
  return records_at;
}

/// How an error names an object of the document: "the config", "file #3", "tensor #3 ('w')"
/// (`number` when set, `name` once known). Put together only when a check fails: metadata.json of
/// 100,000 tensors is read at every load.
inline std::string described(std::string_view what, std::size_t number = ~std::size_t{0}, const std::string* name = nullptr) {
  std::string d(what);
  if (number != ~std::size_t{0}) d += " #" + std::to_string(number);
  if (name) d += " (" + printable(*name) + ")";
  return d;
}

/// The fields of one JSON object, each checked for its type; errors name the object (`described`).
struct fields {
  const rj::Value& object;
  std::string_view what;                       // "the config", or "file" when numbered
  std::size_t number = ~std::size_t{0};        // "#number" after `what`, when set

  fields(const rj::Value& o, std::string_view w, std::size_t n = ~std::size_t{0}) : object(o), what(w), number(n) {
    if (!object.IsObject()) fail("is not a JSON object");
  }
  [[noreturn]] void fail(const std::string& why) const { throw error(error_kind::corrupt, described(what, number) + " " + why); }
  const rj::Value& get(std::string_view name) const {
    const auto* v = find_member(object, name);
    if (!v) fail("has no \"" + std::string(name) + "\"");
    return *v;
  }
  std::uint64_t u64(std::string_view name) const {
    const auto& v = get(name);
    if (!v.IsUint64()) fail("has a \"" + std::string(name) + "\" that is not an unsigned 64-bit integer");
    return v.GetUint64();
  }
  std::uint32_t u32(std::string_view name) const {
    const auto& v = get(name);
    if (!v.IsUint()) fail("has a \"" + std::string(name) + "\" that is not an unsigned 32-bit integer");
    return v.GetUint();
  }
  std::string_view view(std::string_view name) const {
    const auto& v = get(name);
    if (!v.IsString()) fail("has a \"" + std::string(name) + "\" that is not a string");
    return {v.GetString(), v.GetStringLength()};
  }
  std::string str(std::string_view name) const { return std::string(view(name)); }
  const rj::Value& array(std::string_view name) const {
    const auto& v = get(name);
    if (!v.IsArray()) fail("has a \"" + std::string(name) + "\" that is not an array");
    return v;
  }
};

/// The tensors' records of metadata.json, read as the parser meets them rather than from a DOM.
/// They are nearly all of the document (100,000 records in 9 MB for a model of many experts),
/// and their DOM was 21 MB of fresh memory, built only to be copied into the records once
/// (docs/performance.md, "What the investigations found"). Everything else goes to the DOM as
/// before: the events of the "tensors" array of the first "ckpt" object are taken here, and the
/// DOM gets that array empty, so that `read` still finds it there, an array. Other values in its
/// place ("tensors": 5, or no "tensors" at all) go to the DOM untouched, and `read` rejects them as
/// before.
///
/// Each record is checked as `fields` checks an object of the DOM, member by member in the same
/// order and with the same words: the first of two members of one name counts, others are
/// ignored. The first record found wrong is kept as `failure` and the parse goes on, so that a
/// document that is not JSON at all is still reported as such, and `read` reports the record
/// where it reported it before, after the members it checks first.
class tensor_records {
 public:
  tensor_records(rj::Document& dom, table_vector<tensor_meta>& out) : dom_(dom), out_(out) {}

  std::optional<std::string> failure;  // the first record's error, as `fields` would word it

  bool Null() { return scalar([&] { return dom_.Null(); }, kind::other); }
  bool Bool(bool b) { return scalar([&] { return dom_.Bool(b); }, kind::other); }
  // A DOM's IsUint64 holds for any integer that is not negative ("-0" too, which comes as Int).
  bool Int(int i) {
    if (in_records_ && i >= 0) return Uint64(static_cast<std::uint64_t>(i));
    return scalar([&] { return dom_.Int(i); }, kind::other);
  }
  bool Uint(unsigned u) { return scalar([&] { return dom_.Uint(u); }, kind::number, u); }
  bool Int64(std::int64_t i) {
    if (in_records_ && i >= 0) return Uint64(static_cast<std::uint64_t>(i));
    return scalar([&] { return dom_.Int64(i); }, kind::other);
  }
  bool Uint64(std::uint64_t u) { return scalar([&] { return dom_.Uint64(u); }, kind::number, u); }
  bool Double(double d) { return scalar([&] { return dom_.Double(d); }, kind::other); }
  bool RawNumber(const char* str, rj::SizeType n, bool copy) {
    return scalar([&] { return dom_.RawNumber(str, n, copy); }, kind::other);
  }
  bool String(const char* str, rj::SizeType n, bool copy) {
    return scalar([&] { return dom_.String(str, n, copy); }, kind::string, 0, {str, n});
  }
  bool Key(const char* str, rj::SizeType n, bool copy) {
    const std::string_view key(str, n);
    if (!in_records_) {
      if (depth_ == 1 && key == "ckpt" && !ckpt_claimed_) ckpt_claimed_ = next_is_ckpt_ = true;
      if (depth_ == 2 && in_ckpt_ && key == "tensors" && !tensors_claimed_) tensors_claimed_ = next_is_tensors_ = true;
      return dom_.Key(str, n, copy);
    }
    if (skip_ == 0 && level_ == 1) member_ = claim(key);  // a record's member
    return true;
  }
  bool StartObject() {
    if (!in_records_) {
      if (depth_ == 1) in_ckpt_ = next_is_ckpt_;  // the root's member; deeper objects leave it as it is
      next_is_ckpt_ = next_is_tensors_ = false;
      ++depth_;
      return dom_.StartObject();
    }
    if (skip_ > 0) return ++skip_, true;
    if (level_ == 0) {  // a record
      begin_record();
      level_ = 1;
      return true;
    }
    value(kind::other);  // an object where a member's value or a shape entry should be: skip it whole
    skip_ = 1;
    return true;
  }
  bool EndObject(rj::SizeType members) {
    if (!in_records_) {
      --depth_;
      if (depth_ == 1) in_ckpt_ = false;
      return dom_.EndObject(members);
    }
    if (skip_ > 0) return --skip_, true;
    end_record();  // level_ is 1: the parser pairs brackets
    level_ = 0;
    return true;
  }
  bool StartArray() {
    if (!in_records_) {
      if (next_is_tensors_ && depth_ == 2 && in_ckpt_) in_records_ = true;  // the records: the DOM gets the array empty
      next_is_ckpt_ = next_is_tensors_ = false;
      ++depth_;
      return dom_.StartArray();
    }
    if (skip_ > 0) return ++skip_, true;
    if (level_ == 1 && member_ == member::shape) {
      level_ = 2;
      have_[static_cast<int>(member::shape)] = kind::array;
      shape_.clear();
      shape_entries_ = 0;
      bad_entry_ = false;
      return true;
    }
    value(kind::other);
    skip_ = 1;
    return true;
  }
  bool EndArray(rj::SizeType elements) {
    if (!in_records_) {
      --depth_;
      return dom_.EndArray(elements);
    }
    if (skip_ > 0) return --skip_, true;
    if (level_ == 2) {  // a shape's end
      level_ = 1;
      member_ = member::none;
      return true;
    }
    in_records_ = false;  // the records' end
    --depth_;
    return dom_.EndArray(0);
  }

 private:
  enum class member : int { name, dtype, shape, chunks, layout, none };  // `none`: a member not read
  static constexpr std::size_t members = static_cast<std::size_t>(member::none);
  enum class kind : std::uint8_t { absent, string, number, array, other };

  /// A scalar: to the DOM outside the records; inside them, a member's value or a shape's entry.
  template <class ToDom>
  bool scalar(ToDom to_dom, kind k, std::uint64_t number = 0, std::string_view text = {}) {
    if (!in_records_) {
      next_is_ckpt_ = next_is_tensors_ = false;
      return to_dom();
    }
    if (skip_ > 0) return true;
    if (level_ == 2) {  // a shape entry
      if (k != kind::number) bad_entry_ = true;
      else if (shape_entries_ < max_dims) shape_.push_back(number);
      ++shape_entries_;
      return true;
    }
    if (level_ == 0) return value(kind::other), true;  // a record that is not an object
    if (member_ == member::none) return true;
    auto& t = out_.back();
    if (k == kind::string && member_ == member::name) t.name.assign(text);
    if (k == kind::string && member_ == member::dtype) dtype_.assign(text);
    if (k == kind::string && member_ == member::layout) layout_.assign(text);
    if (k == kind::number && member_ == member::chunks) t.chunk_count = number;
    have_[static_cast<int>(member_)] = k;
    member_ = member::none;
    return true;
  }
  /// A value that is not a scalar (its brackets are skipped by the caller).
  void value(kind k) {
    if (level_ == 0) {  // a record that is not an object
      fail_record(index_++, nullptr, "is not a JSON object");
      return;
    }
    if (level_ == 2) {
      bad_entry_ = true;
      ++shape_entries_;
      return;
    }
    if (member_ != member::none) have_[static_cast<int>(member_)] = k;
    member_ = member::none;
  }
  member claim(std::string_view key) {
    static constexpr std::array<std::string_view, members> names{"name", "dtype", "shape", "chunks", "layout"};
    for (std::size_t m = 0; m < members; ++m)
      if (key == names[m]) {
        if (seen_[m]) return member::none;  // find_member takes the first
        seen_[m] = true;
        return static_cast<member>(m);
      }
    return member::none;
  }
  void begin_record() {
    out_.emplace_back();
    seen_.fill(false);
    have_.fill(kind::absent);
    member_ = member::none;
  }
  /// Checks a record as metadata_json::read checked one from the DOM, in the same order.
  void end_record() {
    const auto i = index_++;
    auto& t = out_.back();
    const auto has = [&](member m) { return have_[static_cast<int>(m)]; };
    const auto check = [&](member m, std::string_view key, kind want, const std::string* name, std::string_view type) {
      if (has(m) == kind::absent) return fail_record(i, name, "has no \"" + std::string(key) + "\""), false;
      if (has(m) != want) return fail_record(i, name, "has a \"" + std::string(key) + "\" that is not " + std::string(type)), false;
      return true;
    };
    if (!check(member::name, "name", kind::string, nullptr, "a string")) return;
    if (!check(member::dtype, "dtype", kind::string, &t.name, "a string")) return;
    const auto dt = dtype_from_string(dtype_);
    if (!dt) return fail_text("unknown dtype " + printable(dtype_) + " of tensor " + printable(t.name));
    t.type = *dt;
    if (!check(member::shape, "shape", kind::array, &t.name, "an array")) return;
    if (shape_entries_ > max_dims) return fail_record(i, &t.name, "has " + std::to_string(shape_entries_) + " dimensions");
    if (bad_entry_) return fail_record(i, &t.name, "has a shape entry that is not an unsigned 64-bit integer");
    t.shape.assign(shape_.begin(), shape_.end());
    if (!check(member::chunks, "chunks", kind::number, &t.name, "an unsigned 64-bit integer")) return;
    t.order = layout::row_major;
    if (has(member::layout) != kind::absent) {
      const std::string_view l = has(member::layout) == kind::string ? std::string_view(layout_) : "";
      if (l == "column_major")
        t.order = layout::column_major;
      else if (l != "row_major")
        fail_text("unknown layout " + printable(l) + " of tensor " + printable(t.name) +
                  " (expected \"row_major\" or \"column_major\")");
    }
  }
  void fail_record(std::size_t i, const std::string* name, const std::string& why) { fail_text(described("tensor", i, name) + " " + why); }
  void fail_text(std::string why) {
    if (!failure) failure = std::move(why);
  }

  rj::Document& dom_;
  table_vector<tensor_meta>& out_;
  // Outside the records: where the parser is, and whether the next value is the "ckpt" object
  // or its "tensors" array.
  int depth_ = 0;
  bool in_ckpt_ = false, ckpt_claimed_ = false, next_is_ckpt_ = false, tensors_claimed_ = false, next_is_tensors_ = false;
  // Inside them: 0 between records, 1 in a record, 2 in its shape; `skip_` counts the brackets
  // of a value skipped whole.
  bool in_records_ = false;
  int level_ = 0;
  int skip_ = 0;
  std::size_t index_ = 0;
  member member_ = member::none;
  std::array<bool, members> seen_{};
  std::array<kind, members> have_{};
  std::string dtype_, layout_;
  small_vector<std::uint64_t, max_dims> shape_;
  std::size_t shape_entries_ = 0;
  bool bad_entry_ = false;
};

/// The metadata of a document parsed into `doc` and `records` (parse).
inline metadata read(const rj::Value& doc, table_vector<tensor_meta>&& records, const std::optional<std::string>& bad_record) {
  const fields root(doc, "the document");
  const fields m(root.get("ckpt"), "\"ckpt\"");
  metadata md;
  md.format_version = m.u32("format_version");
  md.tag = m.str("tag");
  md.iteration = m.u64("iteration");
  const fields topo(m.get("topology"), "the topology");
  md.topology = {topo.u32("tp"), topo.u32("pp"), topo.u32("dp"), topo.u32("world")};
  const fields cfg(m.get("config"), "the config");
  const auto first = cfg.object.MemberBegin();
  for (rj::SizeType i = 0; i < cfg.object.MemberCount(); ++i) {
    const auto& e = first[static_cast<std::ptrdiff_t>(i)];
    const std::string key(e.name.GetString(), e.name.GetStringLength());
    if (!e.value.IsString()) cfg.fail("has a value of " + printable(key) + " that is not a string");
    md.config.set(key, std::string(e.value.GetString(), e.value.GetStringLength()));
  }
  const auto& files = m.array("files");
  md.files.reserve(files.Size());
  for (rj::SizeType i = 0; i < files.Size(); ++i) {
    const fields f(files[i], "file", i);
    auto& out = md.files.emplace_back();
    out.path = f.str("path");
    out.rank = f.u32("rank");
    out.size = f.u64("size");
    const auto h = f.view("index_xxh3");
    if (!from_hex(h, out.index_xxh3)) throw error(error_kind::corrupt, "bad index_xxh3 of file " + printable(out.path));
  }
  (void)m.array("tensors");  // empty in the DOM: `tensor_records` took its records
  if (bad_record) throw error(error_kind::corrupt, *bad_record);
  md.tensors = std::move(records);
  const auto& values = m.array("values");
  md.values.reserve(values.Size());
  for (rj::SizeType i = 0; i < values.Size(); ++i) {
    const fields f(values[i], "value", i);
    auto& v = md.values.emplace_back();
    v.name = f.str("name");
    v.rank = f.u32("rank");
    v.file = f.u32("file");
    v.file_offset = f.u64("file_offset");
    v.size = f.u64("size");
    const auto h = f.view("xxh3");
    if (!from_hex(h, v.xxh3)) throw error(error_kind::corrupt, "bad checksum text of value " + printable(v.name));
  }
  const fields cm(m.get("chunk_map"), "the chunk_map entry");
  md.chunk_map.path = cm.str("path");
  md.chunk_map.size = cm.u64("size");
  const auto h = cm.view("xxh3");
  if (!from_hex(h, md.chunk_map.xxh3)) throw error(error_kind::corrupt, "bad chunk_map checksum text " + printable(h));
  return md;
}

}  // namespace metadata_json

CKPT_DECL std::string encode_metadata(const metadata& md) {
  const auto records = encode_tensor_records(md);
  const auto around = encode_metadata_around(md, records);
  return around.head + records + around.tail;
}

CKPT_DECL std::string encode_tensor_records(const metadata& md) {
  // Written at the depth of the other members (inside {"ckpt": {...}}), so that the indentation
  // of their lines and of the closing bracket is the same.
  rj::StringBuffer doc;
  metadata_json::writer w(doc);
  metadata_json::open_document(w);
  w.StartObject();
  w.Key("tensors");
  const auto before = doc.GetSize() + 2;  // the array's first byte, after ": "
  metadata_json::array_of_lines(w, doc, md.tensors, metadata_json::write_tensor);
  return std::string(doc.GetString() + before, doc.GetSize() - before);
}

CKPT_DECL metadata_text encode_metadata_around(const metadata& md, std::string_view tensor_records) {
  rj::StringBuffer doc;
  std::size_t records_at = 0;
  {
    metadata_json::writer w(doc);
    metadata_json::open_document(w);
    records_at = metadata_json::write_around_records(w, doc, md);
    w.EndObject();
  }
  const std::string_view text(doc.GetString(), doc.GetSize());
  const auto before = text.substr(0, records_at), after = text.substr(records_at);
  xxh3_stream hash;
  for (const auto part : {before, tensor_records, after}) hash.update(std::as_bytes(std::span(part.data(), part.size())));
  metadata_text out;
  out.head.reserve(envelope_head.size() + 16 + envelope_mid.size() + before.size());
  out.head += envelope_head;
  out.head += to_hex(hash.digest());
  out.head += envelope_mid;
  out.head += before;
  out.tail.reserve(after.size() + envelope_tail.size());
  out.tail += after;
  out.tail += envelope_tail;
  return out;
}

CKPT_DECL std::size_t check_json_depth(std::string_view doc, const std::string& file) {
  int depth = 0;
  std::size_t objects = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    const char c = doc[i];
    if (in_string) {
      // To the closing quote at once (memchr): the first '"' after an even run of backslashes.
      // Names are most of a large metadata.json's strings, and its indentation most of the
      // rest (below); stepping through them byte by byte was a tenth of a load.
      for (;;) {
        const auto* q = static_cast<const char*>(std::memchr(doc.data() + i, '"', doc.size() - i));
        if (!q) return objects;  // unterminated: rapidjson says where
        std::size_t k = static_cast<std::size_t>(q - doc.data()), escapes = 0;
        while (doc[k - 1 - escapes] == '\\') ++escapes;  // stops at the opening quote at the latest
        i = k;
        if (escapes % 2 == 0) break;
        ++i;
      }
      in_string = false;
    } else if (c == ' ' || c == '\n') {
      continue;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      objects += c == '{';
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
        throw error(error_kind::corrupt, file + ": number " + printable(doc.substr(i, std::min<std::size_t>(end - i, 48))) +
                                             " at byte " + std::to_string(i) + " is longer than any ckpt writes");
      i = end - 1;
    }
  }
  return objects;
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
  const auto objects = check_json_depth(doc, file);
  // The records are parsed straight into the table (metadata_json::tensor_records), made once
  // and never moved: no more entries than the document has objects, nor than it has room for
  // records of the four members a record needs, {"name":"","dtype":"u8","shape":[],"chunks":0}.
  table_vector<tensor_meta> records;
  records.reserve(std::min(objects, doc.size() / 45 + 1));
  rj::Document parsed;
  metadata_json::tensor_records handler(parsed, records);
  rj::Reader reader;
  const auto parse = [&](rj::Document&) {
    rj::MemoryStream ms(doc.data(), doc.size());
    rj::EncodedInputStream<rj::UTF8<>, rj::MemoryStream> in(ms);
    return !reader.Parse<rj::kParseDefaultFlags>(in, handler).IsError();
  };
  try {
    parsed.Populate(parse);
    if (reader.HasParseError())
      throw error(error_kind::corrupt, "malformed JSON: " + rj_error_text(reader.GetParseErrorCode()) + " at byte " +
                                           std::to_string(reader.GetErrorOffset()) + " of the document");
    return metadata_json::read(parsed, std::move(records), handler.failure);
  } catch (const error& e) {
    throw fail(e.what());
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // rapidjson's assertions, as cereal configures them ("NaNE5": an exponent after NaN)
    throw fail(std::string("malformed JSON: ") + e.what());
  }
}

/// Why a metadata.json of `version` cannot be read ("" when it can).
inline std::string version_problem(std::uint32_t version) {
  if (version == 1 || version == metadata_version) return "";
  return "format version " + std::to_string(version) + ", this ckpt reads versions 1 and " + std::to_string(metadata_version);
}

CKPT_DECL void validate_metadata(const metadata& md, std::string_view expected_tag, const std::string& file) {
  const auto fail = [&](const std::string& why) { throw error(error_kind::corrupt, file + ": " + why); };
  if (const auto p = version_problem(md.format_version); !p.empty()) fail(p);
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
  // ckpt lists tensors in name order, and strictly ascending names are distinct: no set of
  // 100,000 names to build for the file ckpt writes, one for any other.
  bool ascending = true;
  for (std::size_t k = 1; k < md.tensors.size() && ascending; ++k) ascending = md.tensors[k - 1].name < md.tensors[k].name;
  std::unordered_set<std::string_view> names;
  for (const auto& t : md.tensors) {
    if (!ascending && !names.insert(t.name).second) fail("tensor " + printable(t.name) + " is listed twice");
    if (t.name.starts_with("__ckpt.")) {
      if (name_problem(t.name.substr(2)).size()) fail("invalid tensor name " + printable(t.name));
    } else if (auto p = name_problem(t.name); !p.empty()) {
      fail("tensor name " + printable(t.name) + " " + p);
    }
    if (t.shape.size() > max_dims) fail("tensor " + printable(t.name) + " has " + std::to_string(t.shape.size()) + " dimensions");
    if (!checked_size(t.shape, size_of(t.type))) fail("tensor " + t.name + ": element count overflows 64 bits");
    const auto& c = t.chunks;
    if (t.placement) {  // version 2: decode_chunk_map checked the layout against the shape and files
      if (t.placement->chunk_count(t.shape) != t.chunk_count)
        fail("tensor " + printable(t.name) + ": chunk_map.bin places " + std::to_string(t.placement->chunk_count(t.shape)) +
             " chunks, metadata.json says " + std::to_string(t.chunk_count));
    } else if (c.ndim != t.shape.size() || c.size() != t.chunk_count)
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
  std::uint64_t size = 0;
  emit_chunk_map(md, [&](const void*, std::size_t n) { size += n; });
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
  if (get_u32(bytes.data() + 8) != md.format_version || get_u32(bytes.data() + 12) != 0)
    fail("bad version or flags (version " + std::to_string(get_u32(bytes.data() + 8)) + ", metadata.json's is " +
         std::to_string(md.format_version) + ")");
  if (const auto p = version_problem(md.format_version); !p.empty()) fail(p);
  bounded_reader r(bytes.subspan(16), file);
  if (r.u64() != md.tensors.size()) fail("tensor count differs from metadata.json");
  const layout_files files{static_cast<std::uint32_t>(std::min<std::size_t>(md.files.size(), ~std::uint32_t{0})),
                           [&](std::uint32_t f) { return f < md.files.size() ? md.files[f].path : "file #" + std::to_string(f); },
                           [&](std::uint32_t f) { return f < md.files.size() ? md.files[f].size : 0; }};
  const std::string context = file + ": ";  // once, not per tensor
  for (auto& t : md.tensors) {
    const auto ndim = t.shape.size();
    if (ndim > max_dims) fail("tensor " + printable(t.name) + " has too many dimensions");
    if (md.format_version == 1) {
      r.table(t.chunks, ndim);
      continue;
    }
    // The layout's arithmetic is on the shape: a shape whose size overflows is damage.
    if (!checked_size(t.shape, size_of(t.type)))
      fail("tensor " + printable(t.name) + ": the size of its shape " + to_string(t.shape) + " overflows 64 bits");
    auto& l = t.placement.emplace();
    const auto kind = r.u8();
    const auto coords = [&](region_table& into, std::uint64_t n, bool with_file) {
      into.ndim = static_cast<std::uint32_t>(ndim);
      into.resize(n);
      for (std::uint64_t i = 0; i < n; ++i) {
        if (with_file) into.file[i] = r.u32();
        if (ndim) r.copy(into.coords.data() + i * 2 * ndim, 2 * ndim * 8);
      }
    };
    if (kind == static_cast<std::uint8_t>(chunk_layout::kind::grid)) {
      l.how = chunk_layout::kind::grid;
      l.block.resize(ndim);
      if (ndim) r.copy(l.block.data(), ndim * 8);
      coords(l.pieces(), r.count(std::max<std::uint64_t>(16 * ndim, 1), "grid piece"), false);
      l.runs.resize(r.count(16, "file run"));
      for (auto& run : l.runs) {
        run.cells = r.u64();
        run.first = r.u32();
        run.step = r.u32();
      }
    } else if (kind == static_cast<std::uint8_t>(chunk_layout::kind::list)) {
      l.how = chunk_layout::kind::list;
      coords(l.chunks(), r.count(4 + 16 * ndim, "chunk"), true);
    } else {
      fail("tensor " + printable(t.name) + ": unknown layout kind " + std::to_string(kind));
    }
    check_layout(t.name, t.shape, l, files, error_kind::corrupt, context);
    t.chunks.ndim = static_cast<std::uint32_t>(ndim);
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

CKPT_DECL void check_stored_tiling(const metadata& md, const tensor_meta& t, const std::string& md_name) {
  check_tiling(t.name, t.shape, t.chunks, [&](std::size_t i) -> const std::string& { return md.files[t.chunks.file[i]].path; },
               error_kind::corrupt, md_name + ": ");
}

}  // namespace ckpt::detail
