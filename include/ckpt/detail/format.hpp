#pragma once
// Shard file records (docs/format.md, section 6, is the normative description): what a shard
// file's footer index holds, and the bounded parsing that keeps a corrupt or hostile index from causing huge
// allocations.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <cereal/archives/portable_binary.hpp>
#include <cereal/cereal.hpp>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../tensor.hpp"
#include "chunk_table.hpp"
#include "hash.hpp"
#include "packed.hpp"
#include "region.hpp"
#include "span_stream.hpp"
#include "table_memory.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

/// The shard file version ckpt writes (header, footer index and trailer): 2, where chunks of
/// under `packed_below` bytes follow each other without padding. It reads versions 1 and 2.
inline constexpr std::uint32_t format_version = 2;
inline constexpr std::uint32_t oldest_format_version = 1;
inline constexpr bool readable_version(std::uint32_t v) noexcept { return v >= oldest_format_version && v <= format_version; }
/// "this ckpt reads versions 1 to 2", for errors about a version it does not read.
inline std::string versions_read() {
  return "this ckpt reads versions " + std::to_string(oldest_format_version) + " to " + std::to_string(format_version);
}
inline constexpr std::uint64_t alignment = 4096;         // larger chunks start on 4 KiB boundaries
/// In a version-2 file, a chunk stored in fewer bytes than this starts right where the one before
/// it ends: padding each to 4 KiB wrote 400 MB of zeros for 100,000 one-element tensors, and 6 %
/// more bytes for experts of 8-56 KiB. Such chunks gain nothing from alignment: a load reads
/// chunks that follow each other as one run (detail/chunk_reader.hpp), and one of them alone is
/// too small for O_DIRECT.
inline constexpr std::uint64_t packed_below = std::uint64_t{64} * 1024;
inline constexpr std::uint64_t header_bytes = 4096;      // the header block, zero padded
inline constexpr std::array<char, 8> header_magic = {'C', 'K', 'P', 'T', 'S', 'H', 'R', 'D'};
inline constexpr std::array<char, 8> trailer_magic = {'C', 'K', 'P', 'T', 'I', 'N', 'D', 'X'};
inline constexpr std::uint64_t header_used = 24;         // magic, version, flags, checksum
inline constexpr std::uint64_t trailer_bytes = 40;

/// A raw chunk of this many bytes or more, saved from host memory, is placed in the file at the
/// same offset within a 4 KiB block as its bytes lie within their memory page (see
/// chunk_start), unless checkpointer_options::place_for_memory is off.
/// O_DIRECT moves only block-aligned file ranges to and from page-aligned (512-byte aligned)
/// memory, and tensors are seldom page-aligned: PyTorch's and most engines' allocators give 64
/// bytes, and a large allocation starts 16 or 64 bytes into its page. Placed so, all but the
/// first and last partial block of such a chunk go from the disk into the tensor itself at a
/// load into memory at the same offset within its page (and at save, where posix is asked to),
/// with no copy through an aligned buffer. Smaller chunks are not worth it: a load reads them
/// ahead through its buffer.
inline constexpr std::uint64_t placed_from = std::uint64_t{1} << 20;

inline std::uint64_t align_up(std::uint64_t x) { return (x + alignment - 1) / alignment * alignment; }
/// Where a chunk stored in `bytes` bytes starts in a version-2 file whose chunks so far end at
/// `end`: at once if it is packed (see packed_below); otherwise on the next 4 KiB boundary, or,
/// for a chunk of `placed_from` bytes or more whose bytes lie `in_page` bytes into a memory
/// page (0 when they are not saved from host memory as they are), at the first offset from
/// `end` on that is `in_page` bytes into a block (docs/format.md, section 6.3).
inline std::uint64_t chunk_start(std::uint64_t end, std::uint64_t bytes, std::uint64_t in_page = 0) {
  if (bytes < packed_below) return end;
  if (bytes < placed_from || in_page % alignment == 0) return align_up(end);
  const auto at = end / alignment * alignment + in_page % alignment;
  return at >= end ? at : at + alignment;
}

/// One tensor's chunks in one file (footer index) or in the whole tag (chunk_map.bin).
struct tensor_group {
  std::string name;
  dtype type = dtype::f32;
  shape_t global_shape;  // in memory order (see ckpt::layout)
  chunk_table chunks;    // ndim == global_shape.size()
  layout order = layout::row_major;
};

/// Bit 7 of the dtype byte of the shard index and of a gather message: the tensor is
/// column-major (docs/format.md, section 6.5). Row-major tensors keep the plain id, so their
/// bytes are those of files written before layouts existed.
inline constexpr std::uint8_t column_major_bit = 0x80;
inline std::uint8_t dtype_byte(dtype t, layout l) noexcept {
  return static_cast<std::uint8_t>(static_cast<std::uint8_t>(t) | (l == layout::column_major ? column_major_bit : 0));
}
inline layout layout_of_byte(std::uint8_t b) noexcept { return (b & column_major_bit) ? layout::column_major : layout::row_major; }

/// One per-rank value (cereal portable binary, or text for <random> types).
struct value_record {
  std::string name;
  std::uint32_t rank = 0;  // the rank whose value it is (gather_to_root files hold every rank's)
  std::uint64_t file_offset = 0;
  std::uint64_t size = 0;
  std::uint64_t xxh3 = 0;
};

/// The footer index of one shard file.
struct shard_index {
  std::uint32_t rank = 0;
  // In table memory, as the visitor's table before it: a save's plan of 100,000 tensors that
  // took its memory from glibc found none freed there and faulted in megabytes afresh.
  table_vector<tensor_group> tensors;
  std::vector<value_record> values;
};

// --- chunk columns -------------------------------------------------------------------------------
// A chunk table on disk (docs/format.md, section 5.3): u64 count n; one width byte per packed
// column; the packed columns (file, each dimension's offsets, each dimension's extents, codec,
// file_offset, stored_size), each n values of its width (packed.hpp); then the xxh3 column,
// n × 8 bytes.

struct table_widths {
  /// Number of packed columns (and width bytes) of a table of `ndim`-dimensional chunks.
  static constexpr std::size_t columns(std::size_t ndim) noexcept { return 2 * ndim + 4; }
  /// The widest column c may be: the file index is a u32 and the codec id a u8 in memory.
  static constexpr unsigned limit(std::size_t c, std::size_t ndim) noexcept {
    if (c == 0) return 4;
    if (c == 2 * ndim + 1) return 1;
    return 8;
  }
  static constexpr const char* name(std::size_t c, std::size_t ndim) noexcept {
    if (c == 0) return "file";
    if (c <= ndim) return "offset";
    if (c <= 2 * ndim) return "shape";
    if (c == 2 * ndim + 1) return "codec";
    return c == 2 * ndim + 2 ? "file_offset" : "stored_size";
  }
  /// The widths of a table's packed columns, in disk order (`size()` of them). A fixed array:
  /// the footer index of 100,000 one-chunk tensors asks for 100,000 of these.
  struct column_widths {
    std::array<std::uint8_t, 2 * max_dims + 4> w{};  // columns(max_dims)
    std::size_t n = 0;
    const std::uint8_t* data() const noexcept { return w.data(); }
    std::size_t size() const noexcept { return n; }
    std::uint8_t operator[](std::size_t c) const noexcept { return w[c]; }
    operator std::span<const std::uint8_t>() const noexcept { return {w.data(), n}; }
  };
  /// The width of every packed column of `t`, in disk order: the fewest bytes its values need.
  static column_widths of(const chunk_table& t) {
    const std::size_t n = t.size(), nd = t.ndim;
    if (nd > max_dims) throw error(error_kind::invalid_argument, "a chunk table of " + std::to_string(nd) + " dimensions");
    std::array<std::uint64_t, 2 * max_dims + 4> bits{};
    bits[0] = column_bits(t.file.data(), n, 1);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t d = 0; d < 2 * nd; ++d) bits[1 + d] |= t.coords[i * 2 * nd + d];
    bits[2 * nd + 1] = column_bits(t.codec.data(), n, 1);
    bits[2 * nd + 2] = column_bits(t.file_offset.data(), n, 1);
    bits[2 * nd + 3] = column_bits(t.stored_size.data(), n, 1);
    column_widths out;
    out.n = columns(nd);
    for (std::size_t c = 0; c < out.n; ++c) out.w[c] = static_cast<std::uint8_t>(packed_width(bits[c]));
    return out;
  }
  /// Bytes one chunk takes with these widths: the packed columns and the 8-byte xxh3.
  static std::uint64_t per_chunk(std::span<const std::uint8_t> widths) noexcept {
    std::uint64_t n = 8;
    for (const auto w : widths) n += w;
    return n;
  }
  /// The fewest input bytes a reader charges each chunk of a table of more than one chunk. A
  /// chunk takes 29 + 16 × ndim bytes in memory; this keeps a table of narrow (or all-zero)
  /// columns from making ckpt allocate more than 16 times the bytes it read.
  static constexpr std::uint64_t min_charge(std::size_t ndim) noexcept { return 8 + ndim; }
  /// Bytes a table of `n` chunks with these widths takes.
  static std::uint64_t bytes(std::span<const std::uint8_t> widths, std::uint64_t n) noexcept {
    return 8 + widths.size() + n * per_chunk(widths);
  }
};

// --- bounded reading ---------------------------------------------------------------------------
// ckpt writes its binary records with cereal's PortableBinary archive: a leading byte-order flag
// (1, little-endian), then fixed-width little-endian integers and raw byte blocks. It reads them
// back with this cursor instead of cereal's stream-based archive: the layout is the same, but a
// commit at thousands of ranks parses millions of records, and direct reads from memory are
// several times faster than an istream call per field. Every count and length is checked
// against the bytes left before anything is allocated, so n bytes of input can never make ckpt
// allocate more than about 16 n bytes (the most a packed chunk row grows when unpacked; see
// skip_table).

class bounded_reader {
 public:
  /// Reads `in`, which must start with cereal's byte-order flag 1. `kind` is the error kind of
  /// malformed input (corrupt for files, communication for messages between ranks).
  bounded_reader(std::span<const std::byte> in, std::string file, error_kind kind = error_kind::corrupt)
      : in_(in), file_(std::move(file)), kind_(kind) {
    if (in_.empty() || in_[0] != std::byte{1}) fail("bad byte-order flag");
    pos_ = 1;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw error(kind_, (kind_ == error_kind::corrupt ? "corrupt " : "malformed ") + file_ + ": " + what);
  }
  std::size_t remaining() const noexcept { return in_.size() - pos_; }
  /// Where the next read starts, counted from the start of the input.
  std::size_t position() const noexcept { return pos_; }

  void copy(void* out, std::size_t n) {
    if (n > remaining()) fail("ends early (needed " + std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left)");
    if (n) std::memcpy(out, in_.data() + pos_, n);
    pos_ += n;
  }
  std::uint8_t u8() {
    std::uint8_t v;
    copy(&v, 1);
    return v;
  }
  std::uint32_t u32() {
    std::uint32_t v;
    copy(&v, 4);
    return v;
  }
  std::uint64_t u64() {
    std::uint64_t v;
    copy(&v, 8);
    return v;
  }
  /// The next `n` bytes, without copying.
  std::span<const std::byte> take(std::uint64_t n) {
    if (n > remaining()) fail("ends early");
    const auto out = in_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  /// A count of items of at least `min_bytes_each` bytes, checked against the bytes left.
  std::uint64_t count(std::uint64_t min_bytes_each, const char* what) {
    const auto n = u64();
    if (n > remaining() / (min_bytes_each ? min_bytes_each : 1))
      fail(std::string(what) + " count " + std::to_string(n) + " cannot fit in the " + std::to_string(remaining()) +
           " bytes left");
    return n;
  }
  std::string string() {
    std::string s;
    string_into(s);
    return s;
  }
  /// Reads a string into `s`, reusing its capacity.
  void string_into(std::string& s) {
    const auto n = count(1, "string length");
    s.resize(n);
    copy(s.data(), n);
  }
  shape_t shape() {
    shape_t s;
    shape_into(s);
    return s;
  }
  /// Reads a shape into `s`, reusing its capacity.
  void shape_into(shape_t& s) {
    const auto n = u64();
    if (n > max_dims) fail(std::to_string(n) + " dimensions");
    s.resize(n);
    copy(s.data(), n * 8);
  }
  /// Steps over a chunk table (tensors of `ndim` dimensions), checking that it fits and that
  /// its column widths are valid. Returns its number of chunks.
  std::size_t skip_table(std::size_t ndim) {
    const auto n = u64();
    const auto widths = take(table_widths::columns(ndim));
    std::uint64_t per_chunk = 8;  // the xxh3 column
    for (std::size_t c = 0; c < widths.size(); ++c) {
      const auto w = std::to_integer<unsigned>(widths[c]);
      if (w > table_widths::limit(c, ndim))
        fail("chunk column " + std::string(table_widths::name(c, ndim)) + " is " + std::to_string(w) +
             " bytes wide, at most " + std::to_string(table_widths::limit(c, ndim)) + " allowed");
      per_chunk += w;
    }
    if (n > remaining() / per_chunk)
      fail("chunk count " + std::to_string(n) + " cannot fit in the " + std::to_string(remaining()) + " bytes left");
    // The memory bound (table_widths::min_charge). ckpt's own tables pass: a chunk's
    // file_offset (≥ 4096) takes 2 bytes and each extent column 1 or more, unless the tensor is
    // empty (format 1's merge refused an empty one split over files that would not pass; format
    // 2 keeps one file's chunks in its footer, where an empty tensor has one).
    if (n > 1 && n > remaining() / std::max(per_chunk, table_widths::min_charge(ndim)))
      fail("chunk count " + std::to_string(n) + " with columns " + std::to_string(per_chunk) +
           " bytes wide is more than the " + std::to_string(remaining()) + " bytes left can describe");
    take(n * per_chunk);
    return static_cast<std::size_t>(n);
  }
  /// Reads a chunk table's columns (tensors of `ndim` dimensions) and appends them to `t`.
  /// Returns the number of chunks read.
  std::size_t table(chunk_table& t, std::size_t ndim) {
    const auto at = pos_;
    const auto n = skip_table(ndim);  // checks that the whole table is there
    t.ndim = static_cast<std::uint32_t>(ndim);
    const auto old = t.size();
    t.resize(old + n);
    copy_table_at(in_, at, t, old);
    return n;
  }

  /// Unpacks the chunk table that starts at `at` in `in` (its count, widths and columns) into
  /// rows [row, row + its count) of `t`, whose columns must already be that long. Returns the
  /// count. No bounds are checked: `at` must be a position where skip_table or table succeeded
  /// on the same bytes.
  static std::size_t copy_table_at(std::span<const std::byte> in, std::size_t at, chunk_table& t, std::size_t row) {
    const std::byte* p = in.data() + at;
    std::uint64_t n;
    std::memcpy(&n, p, 8);
    p += 8;
    const std::size_t ndim = t.ndim;
    if (n == 0) return 0;  // no columns to unpack (and an empty column's data() may be null)
    const std::byte* widths = p;
    p += table_widths::columns(ndim);
    std::size_t c = 0;
    auto column = [&](auto* out, std::size_t stride) {
      const auto w = std::to_integer<unsigned>(widths[c++]);
      unpack(p, w, n, out, stride);
      p += n * w;
    };
    column(t.file.data() + row, 1);
    for (std::size_t d = 0; d < 2 * ndim; ++d) column(t.coords.data() + row * 2 * ndim + d, 2 * ndim);
    column(t.codec.data() + row, 1);
    column(t.file_offset.data() + row, 1);
    column(t.stored_size.data() + row, 1);
    std::memcpy(t.xxh3.data() + row, p, n * 8);
    return static_cast<std::size_t>(n);
  }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  std::string file_;
  error_kind kind_;
};

inline void write_shape(cereal::PortableBinaryOutputArchive& ar, std::span<const std::uint64_t> s) {
  ar(static_cast<std::uint64_t>(s.size()));
  for (auto e : s) ar(e);
}
inline void write_string(cereal::PortableBinaryOutputArchive& ar, const std::string& s) {
  ar(static_cast<std::uint64_t>(s.size()));
  ar(cereal::binary_data(s.data(), s.size()));
}
static_assert(table_widths::columns(max_dims) == 2 * max_dims + 4, "column_widths holds every column");

/// Bytes put_table writes for `t`.
inline std::uint64_t table_bytes(const chunk_table& t) { return table_widths::bytes(table_widths::of(t), t.size()); }

/// Hands a chunk table's bytes to `put(const void*, std::size_t)` in file order: u64 count,
/// the column widths, each packed column, the xxh3 column. The one place that fixes the order
/// of the columns on disk; bounded_reader::table reads them back.
template <class Put>
void emit_table(const chunk_table& t, const table_widths::column_widths& widths, Put&& put) {
  const std::uint64_t n = t.size();
  const std::size_t nd = t.ndim;
  put(&n, 8);
  put(widths.data(), widths.size());
  std::size_t c = 0;
  std::array<std::byte, 32768> piece;  // packed a few thousand values at a time
  auto column = [&](const auto* values, std::size_t stride) {
    const unsigned w = widths[c++];
    if (w == sizeof(*values) && stride == 1) {  // already in its packed form
      put(values, n * w);
      return;
    }
    if (w == 0) return;
    const std::size_t per_piece = piece.size() / w;
    for (std::size_t i = 0; i < n; i += per_piece) {
      const auto k = std::min(per_piece, n - i);
      pack(piece.data(), values + i * stride, k, stride, w);
      put(piece.data(), k * w);
    }
  };
  if (n == 0) return;  // every width is 0 (and an empty column's data() may be null)
  column(t.file.data(), 1);
  for (std::size_t d = 0; d < 2 * nd; ++d) column(t.coords.data() + d, 2 * nd);
  column(t.codec.data(), 1);
  column(t.file_offset.data(), 1);
  column(t.stored_size.data(), 1);
  put(t.xxh3.data(), n * 8);
}

/// emit_table with the widths of `t`'s columns.
template <class Put>
void emit_table(const chunk_table& t, Put&& put) {
  emit_table(t, table_widths::of(t), put);
}

/// Lays down a chunk table at `p` (table_bytes(t) of room) and returns the end.
inline std::byte* put_table(std::byte* p, const chunk_table& t) {
  emit_table(t, [&](const void* src, std::size_t n) {
    if (n) std::memcpy(p, src, n);
    p += n;
  });
  return p;
}

/// Encodes an index as cereal portable binary (layout in docs/format.md).
CKPT_DECL std::string encode_index(const shard_index& idx);

/// Parses an index, streaming: `group(name, dtype, layout, global_shape, reader)` is called for each
/// tensor and must read its chunk columns with `reader.table(...)`; `value(record)` for each
/// value. Names and shapes live in buffers reused from group to group, so merging thousands of
/// indexes allocates nothing per tensor. Returns the writing rank. Every malformed input is a
/// `corrupt` error naming `file`.
template <class Group, class Value>
std::uint32_t parse_index(std::span<const std::byte> bytes, const std::string& file, Group&& group, Value&& value) {
  bounded_reader r(bytes, file);
  const auto version = r.u32();
  const auto rank = r.u32();
  if (!readable_version(version)) r.fail("format version " + std::to_string(version) + ", " + versions_read());
  const auto groups = r.count(26, "tensor");
  std::string name;
  shape_t shape;
  for (std::uint64_t i = 0; i < groups; ++i) {
    r.string_into(name);
    const auto t = r.u8();
    const auto dt = dtype_from_id(t & 0x7fu);
    if (!dt) r.fail("unknown dtype id " + std::to_string(t) + " for tensor " + name);
    r.shape_into(shape);
    group(std::string_view(name), *dt, layout_of_byte(t), static_cast<const shape_t&>(shape), r);
  }
  const auto values = r.count(36, "value");
  for (std::uint64_t i = 0; i < values; ++i) {
    value_record v;
    v.name = r.string();
    v.rank = r.u32();
    v.file_offset = r.u64();
    v.size = r.u64();
    v.xxh3 = r.u64();
    value(std::move(v));
  }
  if (r.remaining() != 0) r.fail(std::to_string(r.remaining()) + " stray bytes at its end");
  return rank;
}

/// Parses a whole index into memory (for tools and tests; the commit streams with parse_index).
CKPT_DECL shard_index decode_index(std::span<const std::byte> bytes, const std::string& file);

// --- header and trailer ---------------------------------------------------------------------------

inline void put_u32(std::byte* p, std::uint32_t v) { std::memcpy(p, &v, 4); }
inline void put_u64(std::byte* p, std::uint64_t v) { std::memcpy(p, &v, 8); }
inline std::uint32_t get_u32(const std::byte* p) { std::uint32_t v; std::memcpy(&v, p, 4); return v; }
inline std::uint64_t get_u64(const std::byte* p) { std::uint64_t v; std::memcpy(&v, p, 8); return v; }

/// The 24 meaningful bytes of the header block: magic, version, flags (0), XXH3 of the first 16.
inline std::array<std::byte, header_used> make_header() {
  std::array<std::byte, header_used> h{};
  std::memcpy(h.data(), header_magic.data(), 8);
  put_u32(h.data() + 8, format_version);
  put_u32(h.data() + 12, 0);
  put_u64(h.data() + 16, xxh3(std::span<const std::byte>(h.data(), 16)));
  return h;
}

/// Checks a header block's first bytes; returns the file's version.
CKPT_DECL std::uint32_t check_header(std::span<const std::byte, header_used> h, const std::string& file);

/// The 40-byte trailer: index offset, index size, index XXH3, version, reserved (0), magic.
struct trailer {
  std::uint64_t index_offset = 0;
  std::uint64_t index_size = 0;
  std::uint64_t index_xxh3 = 0;
};

CKPT_DECL std::array<std::byte, trailer_bytes> make_trailer(const trailer& t);

/// Parses and bounds-checks a trailer against the file's size.
CKPT_DECL trailer check_trailer(std::span<const std::byte, trailer_bytes> b, std::uint64_t file_size, const std::string& file);

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/format.ipp"
#endif
