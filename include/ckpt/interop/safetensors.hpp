#pragma once
/// @file interop/safetensors.hpp
/// Export to and import from the safetensors format (https://github.com/huggingface/safetensors),
/// single files and Hugging Face style sharded sets (`model-00001-of-00003.safetensors` plus
/// `model.safetensors.index.json`).
///
/// A safetensors file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON
///
///     {"__metadata__": {"format": "pt"},
///      "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
///
/// (optionally padded with trailing spaces), then the data buffer. Offsets are relative to the
/// buffer, tensors are dense, row-major and little-endian, and together they cover the buffer
/// exactly once.
///
/// Writing streams: the writer knows every tensor's size from its declaration, so it writes the
/// header first and each tensor's bytes straight to their place; no model is held in memory.
/// Reading validates the whole header before trusting any of it, then reads tensors with pread.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "../detail/json.hpp"
#include "../detail/page_copy.hpp"
#include "../dtype.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../posix.hpp"
#include "../tensor.hpp"
#include "host_tensor.hpp"

namespace ckpt::interop {

namespace detail {
namespace rj = ckpt::detail::rj;
using ckpt::detail::printable;
using ckpt::detail::rj_error_text;
}  // namespace detail

/// The longest header a reader accepts, as in the reference implementation: a bound on the
/// memory a hostile file can make the parser allocate.
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

/// The safetensors name of a dtype: "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8",
/// "U8", "BOOL", "U16", "U32", "U64", "F8_E4M3" (torch.float8_e4m3fn), "F8_E5M2".
///
/// @code
/// assert(ckpt::interop::safetensors_dtype_name(ckpt::dtype::bf16) == "BF16");
/// @endcode
constexpr std::string_view safetensors_dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f64: return "F64";
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::i64: return "I64";
    case dtype::i32: return "I32";
    case dtype::i16: return "I16";
    case dtype::i8: return "I8";
    case dtype::u8: return "U8";
    case dtype::boolean: return "BOOL";
    case dtype::u16: return "U16";
    case dtype::u32: return "U32";
    case dtype::u64: return "U64";
    case dtype::f8_e4m3: return "F8_E4M3";
    case dtype::f8_e5m2: return "F8_E5M2";
  }
  return "unknown";
}

/// The ckpt dtype of a safetensors dtype name, or nothing when ckpt has no such dtype.
///
/// @code
/// auto t = ckpt::interop::dtype_from_safetensors("F16");  // ckpt::dtype::f16
/// @endcode
constexpr std::optional<dtype> dtype_from_safetensors(std::string_view name) noexcept {
  for (std::uint8_t id = 1; id <= last_dtype_id; ++id)
    if (safetensors_dtype_name(static_cast<dtype>(id)) == name) return static_cast<dtype>(id);
  return std::nullopt;
}

/// The `__metadata__` of a file: string keys to string values (the format allows nothing else).
/// Ordered, so that a file's header is a function of its contents.
///
/// @code
/// ckpt::interop::safetensors_metadata meta{{"format", "pt"}};  // what transformers' loader expects
/// @endcode
using safetensors_metadata = std::map<std::string, std::string>;

/// One tensor to be written: its name, dtype and shape. Its bytes come later, through
/// `safetensors_writer::write`.
///
/// @code
/// std::vector<ckpt::interop::tensor_decl> decls{{"embed.weight", ckpt::dtype::bf16, {32000, 4096}},
///                                               {"step", ckpt::dtype::i64, {}}};
/// @endcode
struct tensor_decl {
  std::string name;
  dtype type = dtype::f32;
  shape_t shape;

  /// Bytes of the tensor: elements times the element size (throws when that overflows 64 bits).
  std::uint64_t nbytes() const {
    const std::string what = "tensor " + detail::printable(name);
    return ckpt::detail::checked_mul(ckpt::detail::element_count(shape, what), size_of(type), what);
  }
};

/// One tensor of a safetensors file: what its header entry says. `begin` and `end` are byte
/// offsets into the data buffer, which starts `data_start()` bytes into the file.
///
/// @code
/// for (const ckpt::interop::safetensors_entry& t : file.tensors())
///   std::cout << t.name << " " << ckpt::to_string(t.type) << " " << t.nbytes() << " bytes\n";
/// @endcode
struct safetensors_entry {
  std::string name;
  dtype type = dtype::f32;
  shape_t shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  std::uint64_t nbytes() const noexcept { return end - begin; }
};

/// Sorts declarations into the order the reference implementation writes: dtypes of larger
/// alignment first (8-byte, then 4, 2, 1; BOOL last), names in byte order within a dtype.
/// Declaration order is what `safetensors_writer` lays out; sorting first keeps every tensor
/// aligned to its element size in the file, which zero-copy (mmap) readers like, and lays the
/// file out as `safetensors.torch.save_file` does; with at most one metadata entry (the
/// reference keeps metadata in an unordered map) the bytes should be identical too.
///
/// @code
/// auto decls = declarations_of(model);
/// ckpt::interop::sort_by_alignment(decls);
/// ckpt::interop::safetensors_writer w("model.safetensors", decls);
/// @endcode
inline void sort_by_alignment(std::vector<tensor_decl>& decls) {
  // The reference orders its Dtype enum by alignment, BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16
  // BF16 I32 U32 F32 F64 I64 U64 (for the dtypes ckpt has), and sorts by that enum descending,
  // then by name.
  const auto rank = [](dtype t) {
    switch (t) {
      case dtype::boolean: return 0;
      case dtype::u8: return 1;
      case dtype::i8: return 2;
      case dtype::f8_e5m2: return 3;
      case dtype::f8_e4m3: return 4;
      case dtype::i16: return 5;
      case dtype::u16: return 6;
      case dtype::f16: return 7;
      case dtype::bf16: return 8;
      case dtype::i32: return 9;
      case dtype::u32: return 10;
      case dtype::f32: return 11;
      case dtype::f64: return 12;
      case dtype::i64: return 13;
      case dtype::u64: return 14;
    }
    return 15;
  };
  std::stable_sort(decls.begin(), decls.end(), [&](const tensor_decl& a, const tensor_decl& b) {
    if (rank(a.type) != rank(b.type)) return rank(a.type) > rank(b.type);
    return a.name < b.name;
  });
}

namespace detail {

/// `s` as a JSON string literal. Escapes what serde_json (the reference writer) and Python's
/// json module escape: quote, backslash and control characters, with the same short forms, so
/// headers are byte-identical to theirs. With `ascii_only` every non-ASCII code point becomes a
/// \uXXXX escape (surrogate pairs above U+FFFF), as json.dumps does by default; `s` must then
/// be valid UTF-8.
inline void append_json_string(std::string& out, std::string_view s, bool ascii_only = false) {
  static constexpr char hex[] = "0123456789abcdef";
  const auto escape_u = [&](std::uint32_t u) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += hex[(u >> shift) & 15];
  };
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      default: break;
    }
    if (c < 0x20 || (ascii_only && c == 0x7f)) {
      escape_u(c);
    } else if (c < 0x80 || !ascii_only) {
      out += static_cast<char>(c);
    } else {
      // Decode one UTF-8 sequence (the caller checked validity).
      const std::size_t n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1;
      std::uint32_t cp = c & (n == 3 ? 0x07u : n == 2 ? 0x0fu : 0x1fu);
      for (std::size_t k = 1; k <= n && i + k < s.size(); ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3fu);
      i += n;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        escape_u(0xd800 + (cp >> 10));
        escape_u(0xdc00 + (cp & 0x3ff));
      } else {
        escape_u(cp);
      }
    }
  }
  out += '"';
}

/// "[3, 4]", shortened after 16 dimensions so that a hostile shape cannot flood a message.
inline std::string shape_text(std::span<const std::uint64_t> shape) {
  if (shape.size() <= 16) return ckpt::detail::to_string(shape);
  std::string s = ckpt::detail::to_string(shape.first(16));
  s.pop_back();
  return s + ", ... (" + std::to_string(shape.size()) + " dimensions)]";
}

/// The header and the layout of a file holding `decls` in declaration order: compact JSON
/// (`__metadata__` first when there is any, then the tensors with keys dtype, shape,
/// data_offsets), padded with spaces so that the data buffer starts at a multiple of 8.
struct st_layout {
  std::string header;  // without the 8-byte length, padding included
  std::vector<safetensors_entry> tensors;
  std::uint64_t data_bytes = 0;
};

inline st_layout plan_layout(const std::vector<tensor_decl>& decls, const safetensors_metadata& metadata) {
  const auto fail = [](const std::string& why) {
    throw error(error_kind::invalid_argument, "safetensors export: " + why);
  };
  st_layout l;
  std::map<std::string_view, std::size_t> seen;
  l.tensors.reserve(decls.size());
  for (std::size_t i = 0; i < decls.size(); ++i) {
    const auto& d = decls[i];
    if (d.name.empty()) fail("tensor " + std::to_string(i) + " has an empty name");
    if (d.name == "__metadata__") fail("'__metadata__' is reserved by the format and cannot name a tensor");
    if (!ckpt::detail::valid_utf8(d.name)) fail("tensor name " + printable(d.name) + " is not valid UTF-8");
    if (size_of(d.type) == 0) fail("tensor " + printable(d.name) + " has an unknown dtype");
    if (auto [it, fresh] = seen.emplace(d.name, i); !fresh)
      fail("tensor " + printable(d.name) + " is declared twice (declarations " + std::to_string(it->second) + " and " +
           std::to_string(i) + ")");
    std::uint64_t bytes = 0;
    try {
      bytes = d.nbytes();
    } catch (const error& e) {
      fail(std::string(e.what()) + " (shape " + shape_text(d.shape) + ")");
    }
    if (bytes > std::numeric_limits<std::uint64_t>::max() - l.data_bytes) fail("total size overflows 64 bits");
    l.tensors.push_back({d.name, d.type, d.shape, l.data_bytes, l.data_bytes + bytes});
    l.data_bytes += bytes;
  }
  for (const auto& [k, v] : metadata)
    if (!ckpt::detail::valid_utf8(k) || !ckpt::detail::valid_utf8(v))
      fail("metadata entry " + printable(k) + " is not valid UTF-8");

  std::string& h = l.header;
  h += '{';
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      append_json_string(h, k);
      h += ':';
      append_json_string(h, v);
    }
    h += '}';
  }
  for (const auto& t : l.tensors) {
    if (h.size() > 1) h += ',';
    append_json_string(h, t.name);
    h += ":{\"dtype\":\"";
    h += safetensors_dtype_name(t.type);
    h += "\",\"shape\":[";
    for (std::size_t k = 0; k < t.shape.size(); ++k) {
      if (k) h += ',';
      h += std::to_string(t.shape[k]);
    }
    h += "],\"data_offsets\":[" + std::to_string(t.begin) + ',' + std::to_string(t.end) + "]}";
  }
  h += '}';
  // The 8-byte length prefix is itself a multiple of 8, so padding the header to one aligns
  // the buffer; the reference pads with spaces the same way.
  h.append((8 - h.size() % 8) % 8, ' ');
  if (h.size() > safetensors_max_header_bytes)
    fail("the header would be " + std::to_string(h.size()) + " bytes; readers reject headers over " +
         std::to_string(safetensors_max_header_bytes));
  return l;
}

/// A file written under a temporary name in the destination's directory and renamed into place
/// only when complete, so that a failed or interrupted export never leaves a partial file at the
/// destination. The destructor removes the temporary file unless it was published.
class st_output {
 public:
  explicit st_output(std::filesystem::path final_path) : final_(std::move(final_path)) {
    static std::atomic<unsigned> counter{0};
    const auto dir = final_.has_parent_path() ? final_.parent_path() : std::filesystem::path(".");
    for (int attempt = 0;; ++attempt) {
      temp_ = dir / ("." + final_.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                     std::to_string(counter.fetch_add(1)));
      fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0) break;
      const int err = errno;
      if (err != EEXIST || attempt > 100)
        throw error(error_kind::io,
                    "cannot write " + final_.string() + ": create " + temp_.string() + ": " + std::strerror(err));
    }
  }
  st_output(st_output&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)),
        temp_(std::move(o.temp_)),
        final_(std::move(o.final_)),
        published_(std::exchange(o.published_, true)) {}
  st_output& operator=(st_output&&) = delete;
  st_output(const st_output&) = delete;
  st_output& operator=(const st_output&) = delete;
  ~st_output() { discard(); }

  void pwrite_all(std::uint64_t offset, std::span<const std::byte> bytes) {
    // Bounced where the kernel's copy would be slow (detail/page_copy.hpp).
    ckpt::detail::write_avoiding_slow_copy(offset, bytes, [this](std::uint64_t at, std::span<const std::byte> part) {
      pwrite_direct(at, part);
    });
  }
  void pwrite_direct(std::uint64_t offset, std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset));
      if (n < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        throw error(error_kind::io,
                    "write " + temp_.string() + " (for " + final_.string() + "): " + std::strerror(err));
      }
      if (n == 0) throw error(error_kind::io, "write " + temp_.string() + ": no progress");
      bytes = bytes.subspan(static_cast<std::size_t>(n));
      offset += static_cast<std::uint64_t>(n);
    }
  }
  /// Makes the bytes durable under the temporary name and closes it.
  void sync_and_close() {
    if (::fsync(fd_) != 0) throw error(error_kind::io, "fsync " + temp_.string() + ": " + std::strerror(errno));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) throw error(error_kind::io, "close " + temp_.string() + ": " + std::strerror(errno));
  }
  /// Renames the closed file to its final name and makes the rename durable.
  void publish() {
    if (::rename(temp_.c_str(), final_.c_str()) != 0)
      throw error(error_kind::io, "rename " + temp_.string() + " to " + final_.string() + ": " + std::strerror(errno));
    published_ = true;
    ckpt::detail::fsync_dir(final_.has_parent_path() ? final_.parent_path() : std::filesystem::path("."));
  }
  const std::filesystem::path& final_path() const noexcept { return final_; }
  /// False once the file was closed (finished).
  bool is_open() const noexcept { return fd_ >= 0; }

 private:
  void discard() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    if (!published_) {
      ::unlink(temp_.c_str());
      published_ = true;
    }
  }

  int fd_ = -1;
  std::filesystem::path temp_;
  std::filesystem::path final_;
  bool published_ = false;
};

}  // namespace detail

/// Writes one safetensors file without holding its tensors in memory.
///
/// Declare every tensor up front; the header is written at once, then each `write` puts bytes
/// at their final place in the file. Tensors may be written in any order, each in one call or
/// in several consecutive pieces (each call appends to that tensor). `finish()` checks that every
/// tensor is complete, fsyncs, and renames the temporary file to `path`: until then `path` is
/// untouched, and a writer destroyed without `finish()` (or whose `finish()` threw) removes its
/// temporary file.
///
/// Layout: tensors in declaration order in both the buffer and the header, `__metadata__` (if
/// not empty) first in the header, compact JSON padded with spaces to align the buffer to 8
/// bytes. Call `sort_by_alignment` on the declarations first for the reference order.
///
/// @code
/// std::vector<float> w(1024 * 1024);
/// std::int64_t step = 1000;
/// ckpt::interop::safetensors_writer out("model.safetensors",
///                                      {{"w", ckpt::dtype::f32, {1024, 1024}}, {"step", ckpt::dtype::i64, {}}},
///                                      {{"format", "pt"}});
/// out.write("step", std::as_bytes(std::span(&step, 1)));
/// out.write("w", std::as_bytes(std::span(w)).first(2 * 1024 * 1024));  // in two pieces
/// out.write("w", std::as_bytes(std::span(w)).subspan(2 * 1024 * 1024));
/// out.finish();
/// @endcode
class safetensors_writer {
 public:
  /// Validates the declarations (non-empty UTF-8 names, unique, not "__metadata__", sizes that
  /// fit 64 bits) and writes the header to a temporary file next to `path`.
  safetensors_writer(std::filesystem::path path, std::vector<tensor_decl> tensors, safetensors_metadata metadata = {})
      : layout_(detail::plan_layout(tensors, metadata)), written_(layout_.tensors.size(), 0), out_(std::move(path)) {
    for (std::size_t i = 0; i < layout_.tensors.size(); ++i) index_.emplace(layout_.tensors[i].name, i);
    std::array<std::byte, 8> len;
    const std::uint64_t n = layout_.header.size();
    for (int b = 0; b < 8; ++b) len[static_cast<std::size_t>(b)] = static_cast<std::byte>((n >> (8 * b)) & 0xff);
    out_.pwrite_all(0, len);
    out_.pwrite_all(8, std::as_bytes(std::span(layout_.header.data(), layout_.header.size())));
  }

  /// Appends `bytes` to tensor `name`. Throws `invalid_argument` for an undeclared name or more
  /// bytes than the tensor has, `io` when the file system refuses.
  void write(std::string_view name, std::span<const std::byte> bytes) {
    check_open();
    const auto it = index_.find(name);
    if (it == index_.end())
      throw error(error_kind::invalid_argument,
                  out_.final_path().string() + ": tensor " + detail::printable(name) + " was not declared");
    const auto& t = layout_.tensors[it->second];
    auto& done = written_[it->second];
    if (bytes.size() > t.nbytes() - done)
      throw error(error_kind::invalid_argument, out_.final_path().string() + ": tensor " + detail::printable(name) +
                                                    " has " + std::to_string(t.nbytes()) + " bytes; " +
                                                    std::to_string(done) + " are written and " +
                                                    std::to_string(bytes.size()) + " more were given");
    out_.pwrite_all(data_start() + t.begin + done, bytes);
    done += bytes.size();
  }

  /// Checks every tensor was written in full, then makes the file durable and moves it to its
  /// path. Throws `invalid_argument` naming the first incomplete tensor (the destination is then
  /// left as it was).
  void finish() {
    close();
    out_.publish();
  }

  /// The tensors with their offsets in the data buffer, in declaration (= file) order.
  const std::vector<safetensors_entry>& tensors() const noexcept { return layout_.tensors; }
  /// Where the data buffer starts in the file: 8 + the padded header length.
  std::uint64_t data_start() const noexcept { return 8 + layout_.header.size(); }
  /// The size the finished file has.
  std::uint64_t file_size() const noexcept { return data_start() + layout_.data_bytes; }
  /// The destination.
  const std::filesystem::path& path() const noexcept { return out_.final_path(); }

 private:
  friend class safetensors_sharded_writer;

  // First half of finish(), separate so that a sharded export can make every shard durable
  // before it publishes any.
  void check_open() const {
    if (!out_.is_open())
      throw error(error_kind::invalid_argument, out_.final_path().string() + ": the export was already finished");
  }

  void check_complete() const {
    check_open();
    for (std::size_t i = 0; i < written_.size(); ++i)
      if (written_[i] != layout_.tensors[i].nbytes())
        throw error(error_kind::invalid_argument, out_.final_path().string() + ": tensor " +
                                                      detail::printable(layout_.tensors[i].name) +
                                                      " is incomplete: " + std::to_string(written_[i]) + " of " +
                                                      std::to_string(layout_.tensors[i].nbytes()) + " bytes written");
  }

  void close() {
    check_complete();
    out_.sync_and_close();
  }

  detail::st_layout layout_;
  std::vector<std::uint64_t> written_;
  std::map<std::string, std::size_t, std::less<>> index_;
  detail::st_output out_;
};

/// Parses a size such as "5GB", "500MB", "10GiB", "100KB", "4096" or "64 B" into bytes.
/// Decimal units are powers of 10 (GB = 10^9, as transformers reads them), binary units powers
/// of 2 (GiB = 2^30). Units are case-insensitive, except that a decimal unit must end in an
/// upper-case 'B' ("5Gb" is gigabits to transformers). Throws `invalid_argument` saying what is
/// wrong.
///
/// @code
/// std::uint64_t limit = ckpt::interop::parse_size("5GB");  // 5'000'000'000
/// @endcode
inline std::uint64_t parse_size(std::string_view text) {
  const auto fail = [&](const std::string& why) -> error {
    return error(error_kind::invalid_argument, "invalid size " + detail::printable(text) + ": " + why);
  };
  std::string_view s = text;
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  std::size_t i = 0;
  std::uint64_t value = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    const auto digit = static_cast<std::uint64_t>(s[i] - '0');
    if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) throw fail("does not fit in 64 bits");
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) throw fail("expected a whole number followed by a unit, e.g. '5GB'");
  if (i < s.size() && (s[i] == '.' || s[i] == ','))
    throw fail("fractions are not supported; write e.g. '1500MB' for 1.5GB");
  std::string_view unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  std::string upper(unit);
  for (auto& c : upper) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  struct named_unit {
    std::string_view name;
    std::uint64_t factor;
  };
  static constexpr named_unit units[] = {
      {"", 1},
      {"B", 1},
      {"KB", 1'000},
      {"MB", 1'000'000},
      {"GB", 1'000'000'000},
      {"TB", 1'000'000'000'000},
      {"KIB", std::uint64_t{1} << 10},
      {"MIB", std::uint64_t{1} << 20},
      {"GIB", std::uint64_t{1} << 30},
      {"TIB", std::uint64_t{1} << 40},
  };
  for (const auto& u : units) {
    if (upper != u.name) continue;
    // transformers reads "5Gb" as gigabits; ckpt refuses rather than silently divide by 8.
    if (!unit.empty() && unit.back() == 'b' && u.name.find('I') == std::string_view::npos)
      throw fail("a lowercase 'b' means bits (transformers divides by 8); write '" + std::to_string(value) +
                 std::string(unit.substr(0, unit.size() - 1)) + "B' for bytes");
    if (value > std::numeric_limits<std::uint64_t>::max() / u.factor) throw fail("does not fit in 64 bits");
    return value * u.factor;
  }
  throw fail("unknown unit " + detail::printable(unit) + " (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
}

/// One file of a sharded export: its name, the indices (into the declarations) of the tensors
/// it holds, in declaration order, and their total size.
///
/// @code
/// for (const auto& s : ckpt::interop::plan_shards(decls, ckpt::interop::parse_size("5GB")))
///   std::cout << s.file << ": " << s.tensors.size() << " tensors, " << s.bytes << " bytes\n";
/// @endcode
struct safetensors_shard {
  std::string file;
  std::vector<std::size_t> tensors;
  std::uint64_t bytes = 0;
};

/// The name of the single file a sharded export writes when everything fits one shard:
/// `model.safetensors` for the base name "model".
///
/// @code
/// auto single = dir / ckpt::interop::safetensors_single_name("model");  // model.safetensors
/// @endcode
inline std::string safetensors_single_name(std::string_view base = "model") {
  return std::string(base) + ".safetensors";
}
/// The name of a sharded export's index: `model.safetensors.index.json` for the base "model".
///
/// @code
/// ckpt::interop::safetensors_index idx(dir / ckpt::interop::safetensors_index_name());
/// @endcode
inline std::string safetensors_index_name(std::string_view base = "model") {
  return std::string(base) + ".safetensors.index.json";
}

namespace detail {
inline void check_base_name(std::string_view base) {
  if (base.empty() || base == "." || base == ".." || base.find('/') != std::string_view::npos ||
      base.find('\0') != std::string_view::npos || !ckpt::detail::valid_utf8(base))
    throw error(error_kind::invalid_argument,
                "safetensors export: base name " + printable(base) + " is not a plain file name");
}
inline std::string shard_number(std::size_t n) {
  std::string s = std::to_string(n);
  return std::string(s.size() < 5 ? 5 - s.size() : 0, '0') + s;
}
}  // namespace detail

/// Splits `decls`, in order, into shards of at most `max_shard_bytes` bytes, the way
/// transformers' `save_pretrained(max_shard_size=...)` does (its `shard_checkpoint` rule): a
/// tensor starts a new shard when adding it to a non-empty shard would exceed the limit, so a
/// tensor larger than the limit gets a shard of its own. (huggingface_hub's newer splitter
/// moves such a tensor's shard ahead of the one being filled; ckpt keeps declaration order.)
/// Shards are named `{base}-00001-of-00003.safetensors`, ...; when there is only one it is
/// named `{base}.safetensors`. Throws `invalid_argument` for a zero limit or a bad base name.
///
/// @code
/// auto shards = ckpt::interop::plan_shards(decls, 5'000'000'000, "model");
/// @endcode
inline std::vector<safetensors_shard> plan_shards(std::span<const tensor_decl> decls, std::uint64_t max_shard_bytes,
                                                  std::string_view base = "model") {
  detail::check_base_name(base);
  if (max_shard_bytes == 0)
    throw error(error_kind::invalid_argument, "safetensors export: the shard size limit is 0 bytes");
  std::vector<safetensors_shard> shards(1);
  for (std::size_t i = 0; i < decls.size(); ++i) {
    const std::uint64_t bytes = decls[i].nbytes();
    auto* cur = &shards.back();
    if (!cur->tensors.empty() && cur->bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      cur = &shards.back();
    }
    cur->tensors.push_back(i);
    cur->bytes += bytes;
  }
  if (shards.size() == 1) {
    shards[0].file = safetensors_single_name(base);
  } else {
    const std::string total = detail::shard_number(shards.size());
    for (std::size_t k = 0; k < shards.size(); ++k)
      shards[k].file = std::string(base) + "-" + detail::shard_number(k + 1) + "-of-" + total + ".safetensors";
  }
  return shards;
}

/// Writes a model as a Hugging Face style set of safetensors shards in a directory, streaming
/// like `safetensors_writer`: `plan_shards` decides the files, `write` routes each tensor's
/// bytes to its shard, `finish` publishes the shards and then, when there is more than one, the
/// index `{base}.safetensors.index.json`:
///
///     {"metadata": {"total_size": <bytes of all tensors>},
///      "weight_map": {"<tensor>": "<shard file>", ...}}
///
/// formatted as transformers writes it (json.dumps with indent=2, sorted keys, ASCII escapes,
/// trailing newline). Every shard gets the same `metadata`; pass {{"format", "pt"}} for
/// transformers' loader. The directory is created if missing.
///
/// `finish` makes every shard durable before renaming any of them and writes the index last, so
/// the index (or, unsharded, the single file) appears only when the whole export is in place.
/// After that it removes what a previous export with the same base name left that the new one
/// does not use (`{base}.safetensors`, the index, `{base}-NNNNN-of-NNNNN.safetensors`), as
/// `save_pretrained` does; a stale single file would otherwise shadow a new sharded export in
/// transformers' loader. All shard files are open from construction to `finish`.
///
/// @code
/// ckpt::interop::safetensors_sharded_writer out("export/", decls, {{"format", "pt"}},
///                                              ckpt::interop::parse_size("5GB"));
/// for (const auto& d : decls) out.write(d.name, bytes_of(d.name));
/// out.finish();  // export/model-00001-of-00002.safetensors, ..., model.safetensors.index.json
/// @endcode
class safetensors_sharded_writer {
 public:
  /// Validates the declarations (as `safetensors_writer` does), plans the shards, creates `dir`
  /// if needed and opens one temporary file per shard, each with the header written.
  safetensors_sharded_writer(std::filesystem::path dir, std::vector<tensor_decl> tensors, safetensors_metadata metadata,
                             std::uint64_t max_shard_bytes, std::string base = "model")
      : dir_(std::move(dir)), base_(std::move(base)), shards_(plan_shards(tensors, max_shard_bytes, base_)) {
    detail::plan_layout(tensors, metadata);  // all declaration errors before anything is created
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw error(error_kind::io, "create directory " + dir_.string() + ": " + ec.message());
    writers_.reserve(shards_.size());
    for (std::size_t k = 0; k < shards_.size(); ++k) {
      std::vector<tensor_decl> mine;
      mine.reserve(shards_[k].tensors.size());
      for (auto i : shards_[k].tensors) {
        mine.push_back(tensors[i]);
        shard_of_.emplace(tensors[i].name, k);
      }
      total_size_ += shards_[k].bytes;
      writers_.emplace_back(dir_ / shards_[k].file, std::move(mine), metadata);
    }
  }

  /// The files, as `plan_shards` decided them.
  const std::vector<safetensors_shard>& shards() const noexcept { return shards_; }
  /// Sum of the bytes of all tensors (the index's total_size).
  std::uint64_t total_size() const noexcept { return total_size_; }

  /// Appends `bytes` to tensor `name`, in whichever shard holds it (see safetensors_writer::write).
  void write(std::string_view name, std::span<const std::byte> bytes) {
    const auto it = shard_of_.find(name);
    if (it == shard_of_.end())
      throw error(error_kind::invalid_argument,
                  dir_.string() + ": tensor " + detail::printable(name) + " was not declared");
    writers_[it->second].write(name, bytes);
  }

  /// Checks every tensor is complete, publishes the shards, then the index, then removes stale
  /// files of an earlier export (see the class comment).
  void finish() {
    // Every shard is checked before any is closed, so that after a missing-tensor error the
    // caller can still write it and finish again.
    for (const auto& w : writers_) w.check_complete();
    for (auto& w : writers_) w.close();
    for (auto& w : writers_) w.out_.publish();
    if (shards_.size() > 1) {
      const std::string text = index_text();
      detail::st_output idx(dir_ / safetensors_index_name(base_));
      idx.pwrite_all(0, std::as_bytes(std::span(text.data(), text.size())));
      idx.sync_and_close();
      idx.publish();
    }
    remove_stale();
  }

  /// The index JSON this export writes (when it has more than one shard).
  std::string index_text() const {
    std::map<std::string_view, std::string_view> sorted;  // json.dumps(sort_keys=True) order
    for (const auto& [name, k] : shard_of_) sorted.emplace(name, shards_[k].file);
    std::string out =
        "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_size_) + "\n  },\n  \"weight_map\": {";
    bool first = true;
    for (const auto& [name, file] : sorted) {
      out += first ? "\n    " : ",\n    ";
      first = false;
      detail::append_json_string(out, name, true);
      out += ": ";
      detail::append_json_string(out, file, true);
    }
    out += first ? "}\n}\n" : "\n  }\n}\n";
    return out;
  }

 private:
  void remove_stale() {
    std::vector<std::string> keep;
    for (const auto& s : shards_) keep.push_back(s.file);
    if (shards_.size() > 1) keep.push_back(safetensors_index_name(base_));
    const auto is_export_file = [&](const std::string& f) {
      if (f == safetensors_single_name(base_) || f == safetensors_index_name(base_)) return true;
      // {base}-NNNNN-of-NNNNN.safetensors
      const std::string_view suffix = ".safetensors";
      if (!f.starts_with(base_ + "-") || !f.ends_with(suffix)) return false;
      const std::string_view mid =
          std::string_view(f).substr(base_.size() + 1, f.size() - base_.size() - 1 - suffix.size());
      const auto digits = [](std::string_view d) {
        return d.size() >= 5 && std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
      };
      const auto of = mid.find("-of-");
      return of != std::string_view::npos && digits(mid.substr(0, of)) && digits(mid.substr(of + 4));
    };
    std::error_code ec;
    bool removed = false;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string f = entry.path().filename().string();
      if (!is_export_file(f) || std::find(keep.begin(), keep.end(), f) != keep.end()) continue;
      if (::unlink(entry.path().c_str()) != 0 && errno != ENOENT)
        throw error(error_kind::io, "remove stale " + entry.path().string() + ": " + std::strerror(errno));
      removed = true;
    }
    if (ec) throw error(error_kind::io, "list " + dir_.string() + ": " + ec.message());
    if (removed) ckpt::detail::fsync_dir(dir_);
  }

  std::filesystem::path dir_;
  std::string base_;
  std::vector<safetensors_shard> shards_;
  std::vector<safetensors_writer> writers_;
  std::map<std::string, std::size_t, std::less<>> shard_of_;
  std::uint64_t total_size_ = 0;
};

namespace detail {

/// Checks what rapidjson will be given: nesting depth (its destructor recurses) and numbers. A
/// safetensors header holds only integers, so fractions and exponents are rejected here, which
/// also keeps rapidjson 1.1's long-exponent bug (CVE-2024-38517) out of reach.
inline void st_prescan_json(std::string_view doc, const std::string& file, std::string_view what) {
  constexpr int max_depth = 8;
  int depth = 0;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    const char c = doc[i];
    if (c == '"') {
      for (++i; i < doc.size() && doc[i] != '"'; ++i)
        if (doc[i] == '\\') ++i;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        throw error(error_kind::corrupt, file + ": " + std::string(what) + " is nested deeper than " +
                                             std::to_string(max_depth) + " levels at byte " + std::to_string(i));
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      std::size_t end = i + 1;
      while (end < doc.size() && std::string_view("0123456789.eE+-").find(doc[end]) != std::string_view::npos) ++end;
      const auto number = doc.substr(i, end - i);
      if (number.find_first_of(".eE+") != std::string_view::npos || number.size() > 40 ||
          number.find('-', 1) != std::string_view::npos)
        throw error(error_kind::corrupt, file + ": " + std::string(what) + " holds the number " +
                                             printable(number.substr(0, 48)) + " at byte " + std::to_string(i) +
                                             ", which is not an integer");
      i = end - 1;
    }
  }
}

/// Parses a JSON object with the strict settings both safetensors headers and index files get:
/// UTF-8 checked (also after unescaping, as rapidjson lets a lone \udc00 through), integers only,
/// bounded nesting, iterative parsing. Throws `corrupt` naming `file`.
inline void st_parse_object(rj::Document& doc, std::string_view text, const std::string& file, std::string_view what) {
  if (!ckpt::detail::valid_utf8(text))
    throw error(error_kind::corrupt, file + ": " + std::string(what) + " is not valid UTF-8");
  // JSON text has no NUL byte; rapidjson stops reading at one, so anything after it (padding,
  // or a payload: a file that is two formats at once) would pass unchecked.
  if (const auto nul = text.find('\0'); nul != std::string_view::npos)
    throw error(error_kind::corrupt, file + ": " + std::string(what) + " holds a NUL byte at byte " + std::to_string(nul) +
                                         ": JSON text has none, and nothing after one would be checked");
  // Leading JSON whitespace is allowed, as the reference implementation allows it.
  text.remove_prefix(std::min(text.find_first_not_of(" \t\n\r"), text.size()));
  if (text.empty() || text.front() != '{') {
    // The first byte may begin a multi-byte character: show it as hex unless it is plain ASCII.
    static constexpr char hex[] = "0123456789abcdef";
    const auto c = text.empty() ? 0u : static_cast<unsigned char>(text.front());
    const std::string first = text.empty()           ? "nothing"
                              : c > 0x20 && c < 0x7f ? printable(text.substr(0, 1))
                                                     : std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
    throw error(error_kind::corrupt,
                file + ": " + std::string(what) + " is not a JSON object (it starts with " + first + ")");
  }
  st_prescan_json(text, file, what);
  doc.Parse<rj::kParseValidateEncodingFlag | rj::kParseIterativeFlag>(text.data(), text.size());
  if (doc.HasParseError())
    throw error(error_kind::corrupt, file + ": " + std::string(what) +
                                         " is not valid JSON: " + rj_error_text(doc.GetParseError()) + " at byte " +
                                         std::to_string(doc.GetErrorOffset()));
  if (!doc.IsObject()) throw error(error_kind::corrupt, file + ": " + std::string(what) + " is not a JSON object");
}

/// Pointers to the members of a JSON object, in document order. rapidjson 1.1's member
/// iterators compare ambiguously under C++20's reversed operators (clang rejects them), so
/// members are reached by index instead.
inline std::vector<const rj::Value::Member*> members(const rj::Value& object) {
  std::vector<const rj::Value::Member*> out;
  out.reserve(object.MemberCount());
  const auto first = object.MemberBegin();
  for (rj::SizeType i = 0; i < object.MemberCount(); ++i) out.push_back(&first[static_cast<std::ptrdiff_t>(i)]);
  return out;
}

/// The string of a rapidjson string value, checked for UTF-8 after unescaping.
inline std::string rj_string(const rj::Value& v, const std::string& file, std::string_view what) {
  std::string s(v.GetString(), v.GetStringLength());
  if (!ckpt::detail::valid_utf8(s))
    throw error(error_kind::corrupt, file + ": " + std::string(what) + " " + printable(s) + " is not valid UTF-8");
  return s;
}

/// Reads exactly `out.size()` bytes at `offset` into `out` itself; a short read means the file shrank.
inline void pread_all_direct(int fd, std::span<std::byte> out, std::uint64_t offset, const std::string& file) {
  while (!out.empty()) {
    const ssize_t n = ::pread(fd, out.data(), out.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw error(error_kind::io, "read " + file + ": " + std::strerror(errno));
    }
    if (n == 0)
      throw error(error_kind::corrupt,
                  file + ": file ends at byte " + std::to_string(offset) + " (truncated while open?)");
    out = out.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
}

/// Reads exactly `out.size()` bytes at `offset`; bounced where the kernel's copy would be slow
/// (detail/page_copy.hpp).
inline void pread_all(int fd, std::span<std::byte> out, std::uint64_t offset, const std::string& file) {
  ckpt::detail::read_avoiding_slow_copy(offset, out, [&](std::uint64_t at, std::span<std::byte> part) {
    pread_all_direct(fd, part, at, file);
  });
}

}  // namespace detail

/// A safetensors file opened for reading. The constructor validates the whole header before
/// anything is trusted: header length at most 100 MB and within the file; UTF-8 JSON object
/// without duplicate keys; each tensor with a known dtype, a shape of non-negative integers
/// whose byte size fits 64 bits and equals its data_offsets range; the ranges inside the data
/// buffer, not overlapping and covering it without holes; `__metadata__` of strings only. Every
/// violation is a `ckpt::error` of kind `corrupt` whose message names the file, the tensor and
/// the values. A dtype that safetensors defines but ckpt lacks (F8_E8M0, F4, C64, ...) is kind
/// `mismatch`: the file is sound, ckpt cannot represent it.
///
/// Reads use pread on the descriptor held open, so they may run concurrently and never map
/// or read the whole file.
///
/// @code
/// ckpt::interop::safetensors_file f("model.safetensors");
/// for (const auto& t : f.tensors())
///   std::cout << t.name << ": " << t.shape.size() << "-d, " << t.nbytes() << " bytes\n";
/// ckpt::interop::host_tensor w = f.read("lm_head.weight");
/// std::vector<float> bias(1024);
/// f.read("lm_head.bias", std::as_writable_bytes(std::span(bias)));
/// @endcode
class safetensors_file {
 public:
  explicit safetensors_file(const std::filesystem::path& path) : path_(path.string()) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw error(errno == ENOENT ? error_kind::not_found : error_kind::io,
                  "open " + path_ + ": " + std::strerror(errno));
    try {
      open_header();
    } catch (...) {
      ::close(std::exchange(fd_, -1));
      throw;
    }
  }
  safetensors_file(safetensors_file&& o) noexcept
      : path_(std::move(o.path_)),
        fd_(std::exchange(o.fd_, -1)),
        data_start_(o.data_start_),
        tensors_(std::move(o.tensors_)),
        index_(std::move(o.index_)),
        metadata_(std::move(o.metadata_)) {}
  safetensors_file& operator=(safetensors_file&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      path_ = std::move(o.path_);
      fd_ = std::exchange(o.fd_, -1);
      data_start_ = o.data_start_;
      tensors_ = std::move(o.tensors_);
      index_ = std::move(o.index_);
      metadata_ = std::move(o.metadata_);
    }
    return *this;
  }
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  ~safetensors_file() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// The tensors, in the order of their bytes in the file.
  const std::vector<safetensors_entry>& tensors() const noexcept { return tensors_; }
  /// The `__metadata__` entries (empty when the header has none).
  const safetensors_metadata& metadata() const noexcept { return metadata_; }
  /// The path this file was opened with, as errors name it.
  const std::string& path() const noexcept { return path_; }
  /// Offset of the data buffer in the file (8 + header length).
  std::uint64_t data_start() const noexcept { return data_start_; }

  /// The tensor called `name`, or nullptr.
  const safetensors_entry* find(std::string_view name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  /// The tensor called `name`; throws `not_found` when there is none.
  const safetensors_entry& at(std::string_view name) const {
    if (const auto* t = find(name)) return *t;
    throw error(error_kind::not_found, path_ + ": no tensor " + detail::printable(name));
  }

  /// Reads tensor `name` into a new host_tensor.
  host_tensor read(std::string_view name) const {
    const auto& t = at(name);
    host_tensor h{t.type, t.shape, std::vector<std::byte>(static_cast<std::size_t>(t.nbytes()))};
    detail::pread_all(fd_, h.data, data_start_ + t.begin, path_);
    return h;
  }
  /// Reads tensor `name` into `out`, which must be exactly its size (`invalid_argument` if not).
  void read(std::string_view name, std::span<std::byte> out) const {
    const auto& t = at(name);
    if (out.size() != t.nbytes())
      throw error(error_kind::invalid_argument, path_ + ": tensor " + detail::printable(name) + " has " +
                                                    std::to_string(t.nbytes()) + " bytes, the buffer given holds " +
                                                    std::to_string(out.size()));
    detail::pread_all(fd_, out, data_start_ + t.begin, path_);
  }
  /// Reads `out.size()` bytes of tensor `name` starting `offset` bytes into it: a large tensor
  /// in pieces. The range must lie inside the tensor (`invalid_argument` if not).
  void read_part(std::string_view name, std::uint64_t offset, std::span<std::byte> out) const {
    const auto& t = at(name);
    if (offset > t.nbytes() || out.size() > t.nbytes() - offset)
      throw error(error_kind::invalid_argument, path_ + ": bytes [" + std::to_string(offset) + ", +" +
                                                    std::to_string(out.size()) + ") are outside tensor " +
                                                    detail::printable(name) + " of " + std::to_string(t.nbytes()) +
                                                    " bytes");
    detail::pread_all(fd_, out, data_start_ + t.begin + offset, path_);
  }

 private:
  void open_header() {
    const auto fail = [&](const std::string& why) -> error { return error(error_kind::corrupt, path_ + ": " + why); };
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw error(error_kind::io, "stat " + path_ + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw error(error_kind::io, path_ + ": not a regular file");
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    if (file_size < 8)
      throw fail("file is " + std::to_string(file_size) +
                 " bytes, too short for the 8-byte header length (truncated?)");
    std::array<std::byte, 8> len_bytes;
    detail::pread_all(fd_, len_bytes, 0, path_);
    std::uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | std::to_integer<std::uint64_t>(len_bytes[static_cast<std::size_t>(b)]);
    if (n > safetensors_max_header_bytes)
      throw fail("header length " + std::to_string(n) + " exceeds the limit of " +
                 std::to_string(safetensors_max_header_bytes) + " bytes");
    if (n > file_size - 8)
      throw fail("header length " + std::to_string(n) + " is larger than the " + std::to_string(file_size - 8) +
                 " bytes that follow it (truncated file?)");
    std::string header(static_cast<std::size_t>(n), '\0');
    detail::pread_all(fd_, std::as_writable_bytes(std::span(header.data(), header.size())), 8, path_);
    data_start_ = 8 + n;
    parse_header(header, file_size - data_start_);
  }

  void parse_header(std::string_view text, std::uint64_t buffer_bytes) {
    const auto fail = [&](const std::string& why) -> error { return error(error_kind::corrupt, path_ + ": " + why); };
    detail::rj::Document doc;
    detail::st_parse_object(doc, text, path_, "header");
    std::map<std::string, std::size_t, std::less<>> seen;  // for duplicate keys
    bool have_metadata = false;
    for (const auto* m : detail::members(doc)) {
      std::string key = detail::rj_string(m->name, path_, "key");
      if (key == "__metadata__") {
        if (have_metadata) throw fail("'__metadata__' appears twice in the header");
        have_metadata = true;
        if (m->value.IsNull()) continue;  // no metadata, as the reference reads it
        if (!m->value.IsObject()) throw fail("'__metadata__' is not an object of strings");
        for (const auto* e : detail::members(m->value)) {
          std::string k = detail::rj_string(e->name, path_, "metadata key");
          if (!e->value.IsString()) throw fail("metadata entry " + detail::printable(k) + " is not a string");
          std::string v = detail::rj_string(e->value, path_, "metadata value of " + detail::printable(k) + ":");
          if (!metadata_.emplace(k, std::move(v)).second)
            throw fail("metadata key " + detail::printable(k) + " appears twice");
        }
        continue;
      }
      if (seen.count(key)) throw fail("tensor " + detail::printable(key) + " appears twice in the header");
      seen.emplace(key, tensors_.size());
      tensors_.push_back(parse_entry(key, m->value, buffer_bytes));
    }

    // Ranges must tile the buffer: sort by position and walk it.
    std::vector<std::size_t> order(tensors_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return std::pair(tensors_[a].begin, tensors_[a].end) < std::pair(tensors_[b].begin, tensors_[b].end);
    });
    std::uint64_t cursor = 0;
    const safetensors_entry* prev = nullptr;
    for (auto i : order) {
      const auto& t = tensors_[i];
      if (t.begin < cursor)
        throw fail("tensor " + detail::printable(t.name) + " at data_offsets [" + std::to_string(t.begin) + ", " +
                   std::to_string(t.end) + "] overlaps tensor " + detail::printable(prev->name) + " at [" +
                   std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
      if (t.begin > cursor)
        throw fail("hole in the data buffer: bytes [" + std::to_string(cursor) + ", " + std::to_string(t.begin) +
                   ") belong to no tensor (the next is " + detail::printable(t.name) + ")");
      cursor = t.end;
      prev = &t;
    }
    if (cursor != buffer_bytes)
      throw fail("the tensors end at byte " + std::to_string(cursor) + " of the " + std::to_string(buffer_bytes) +
                 "-byte data buffer: the bytes after it belong to no tensor (hole at the end)");

    std::vector<safetensors_entry> sorted;
    sorted.reserve(tensors_.size());
    for (auto i : order) sorted.push_back(std::move(tensors_[i]));
    tensors_ = std::move(sorted);
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  }

  safetensors_entry parse_entry(const std::string& name, const detail::rj::Value& v, std::uint64_t buffer_bytes) const {
    const std::string who = "tensor " + detail::printable(name);
    const auto fail = [&](const std::string& why) -> error {
      return error(error_kind::corrupt, path_ + ": " + who + ": " + why);
    };
    if (!v.IsObject()) throw fail("entry is not an object");
    const detail::rj::Value* dt = nullptr;
    const detail::rj::Value* shape = nullptr;
    const detail::rj::Value* offsets = nullptr;
    for (const auto* m : detail::members(v)) {
      const std::string_view k(m->name.GetString(), m->name.GetStringLength());
      const detail::rj::Value** slot = k == "dtype"          ? &dt
                                       : k == "shape"        ? &shape
                                       : k == "data_offsets" ? &offsets
                                                             : nullptr;
      if (!slot) continue;  // unknown keys are ignored, as the reference does
      if (*slot) throw fail("key '" + std::string(k) + "' appears twice");
      *slot = &m->value;
    }
    if (!dt || !shape || !offsets)
      throw fail(std::string("has no '") + (!dt ? "dtype" : !shape ? "shape" : "data_offsets") + "'");

    safetensors_entry t;
    t.name = name;
    if (!dt->IsString()) throw fail("dtype is not a string");
    const std::string dname(dt->GetString(), dt->GetStringLength());
    if (const auto d = dtype_from_safetensors(dname)) {
      t.type = *d;
    } else {
      // The reference implementation's other dtypes (it has no C128).
      static constexpr std::string_view other_known[] = {"F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4",
                                                         "F6_E2M3", "F6_E3M2",     "C64"};
      if (std::find(std::begin(other_known), std::end(other_known), dname) != std::end(other_known))
        throw error(error_kind::mismatch, path_ + ": " + who + ": dtype " + detail::printable(dname) +
                                              " is valid safetensors but has no ckpt dtype");
      throw fail("unknown dtype " + detail::printable(dname));
    }
    if (!shape->IsArray()) throw fail("shape is not an array");
    for (const auto* e = shape->Begin(); e != shape->End(); ++e) {
      if (!e->IsUint64())
        throw fail("shape has an entry that is not a non-negative integer (dimension " +
                   std::to_string(t.shape.size()) + ")");
      t.shape.push_back(e->GetUint64());
    }
    if (!offsets->IsArray() || offsets->Size() != 2 || !(*offsets)[0].IsUint64() || !(*offsets)[1].IsUint64())
      throw fail("data_offsets is not a pair of non-negative integers");
    t.begin = (*offsets)[0].GetUint64();
    t.end = (*offsets)[1].GetUint64();
    if (t.end < t.begin)
      throw fail("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] end before they begin");
    // Elements first, dimension by dimension, as the reference counts them: a zero dimension
    // empties the shape however large the others ([2^62, 0] holds no bytes), but a product that
    // overflows before the zero is reached is refused, as the reference refuses it.
    std::uint64_t elements = 1;
    for (auto d : t.shape) {
      if (d != 0 && elements > std::numeric_limits<std::uint64_t>::max() / d)
        throw fail("shape " + detail::shape_text(t.shape) + " of " + dname + " overflows 64 bits of elements");
      elements *= d;
    }
    if (elements > std::numeric_limits<std::uint64_t>::max() / size_of(t.type))
      throw fail("shape " + detail::shape_text(t.shape) + " of " + dname + " overflows 64 bits of bytes");
    const std::uint64_t bytes = elements * size_of(t.type);
    if (bytes != t.nbytes())
      throw fail("shape " + detail::shape_text(t.shape) + " of " + dname + " needs " + std::to_string(bytes) +
                 " bytes but data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] span " +
                 std::to_string(t.nbytes()));
    if (t.end > buffer_bytes)
      throw fail("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                 "] run past the end of the " + std::to_string(buffer_bytes) + "-byte data buffer (truncated file?)");
    return t;
  }

  std::string path_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::vector<safetensors_entry> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
  safetensors_metadata metadata_;
};

/// A sharded safetensors set opened through its index (`model.safetensors.index.json`). The
/// constructor parses the index (a JSON object with a "weight_map" object of tensor name to
/// shard file name, and an optional "metadata" object whose "total_size", if present, must be a
/// non-negative integer), opens and validates every shard it names (files in the index's
/// directory; a name with a path separator is rejected), and checks that every listed tensor is
/// in its shard and that no shard holds a tensor the index does not list there. Errors are
/// `corrupt` and name the index or the shard.
///
/// `total_size` is reported, not checked against the shards: exporters compute it in ways that
/// differ (quantised weights, tied weights), and the shards' own headers are the authority.
///
/// @code
/// ckpt::interop::safetensors_index model("llama/model.safetensors.index.json");
/// for (const auto& [name, file] : model.weight_map()) {
///   ckpt::interop::host_tensor t = model.read(name);
///   std::cout << name << " (" << file << "): " << t.data.size() << " bytes\n";
/// }
/// @endcode
class safetensors_index {
 public:
  explicit safetensors_index(const std::filesystem::path& index_path) : path_(index_path.string()) {
    const auto fail = [&](const std::string& why) -> error { return error(error_kind::corrupt, path_ + ": " + why); };
    const std::string text = read_small_file(index_path);
    detail::rj::Document doc;
    detail::st_parse_object(doc, text, path_, "index");
    const detail::rj::Value* wm = nullptr;
    const detail::rj::Value* meta = nullptr;
    for (const auto* m : detail::members(doc)) {
      const std::string_view k(m->name.GetString(), m->name.GetStringLength());
      const detail::rj::Value** slot = k == "weight_map" ? &wm : k == "metadata" ? &meta : nullptr;
      if (!slot) continue;
      if (*slot) throw fail("key '" + std::string(k) + "' appears twice");
      *slot = &m->value;
    }
    if (meta) {
      if (!meta->IsObject()) throw fail("'metadata' is not an object");
      for (const auto* e : detail::members(*meta)) {
        if (std::string_view(e->name.GetString(), e->name.GetStringLength()) != "total_size") continue;
        if (total_size_) throw fail("'total_size' appears twice");
        if (!e->value.IsUint64()) throw fail("'total_size' is not a non-negative integer");
        total_size_ = e->value.GetUint64();
      }
    }
    if (!wm || !wm->IsObject()) throw fail("has no 'weight_map' object");
    std::map<std::string, std::size_t> shard_ids;
    for (const auto* e : detail::members(*wm)) {
      std::string name = detail::rj_string(e->name, path_, "tensor name");
      if (!e->value.IsString())
        throw fail("weight_map entry of tensor " + detail::printable(name) + " is not a string");
      std::string file = detail::rj_string(e->value, path_, "shard name");
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
          file.find('\0') != std::string::npos)
        throw fail("tensor " + detail::printable(name) + " is mapped to " + detail::printable(file) +
                   ", which is not a file name in the index's directory");
      if (!weight_map_.emplace(name, file).second)
        throw fail("tensor " + detail::printable(name) + " appears twice in weight_map");
      shard_ids.emplace(file, 0);
    }
    const auto dir = index_path.has_parent_path() ? index_path.parent_path() : std::filesystem::path(".");
    for (auto& [file, id] : shard_ids) {
      id = shards_.size();
      try {
        shards_.emplace_back(dir / file);
      } catch (const error& e) {
        if (e.kind() == error_kind::not_found)
          throw fail("shard " + detail::printable(file) + " does not exist: " + e.what());
        throw;
      }
    }
    for (const auto& [name, file] : weight_map_) {
      const auto& shard = shards_[shard_ids.at(file)];
      if (!shard.find(name))
        throw fail("tensor " + detail::printable(name) + " is mapped to shard " + detail::printable(file) +
                   ", which does not hold it");
      shard_of_.emplace(name, shard_ids.at(file));
    }
    for (const auto& shard : shards_)
      for (const auto& t : shard.tensors()) {
        const auto it = shard_of_.find(t.name);
        if (it == shard_of_.end() || &shards_[it->second] != &shard)
          throw fail("shard " + shard.path() + " holds tensor " + detail::printable(t.name) +
                     (it == shard_of_.end() ? ", which the weight_map does not list"
                                            : ", which the weight_map places in " + shards_[it->second].path()));
      }
  }

  /// Tensor name to shard file name, as the index lists them.
  const std::map<std::string, std::string>& weight_map() const noexcept { return weight_map_; }
  /// The index's metadata.total_size, if it has one.
  std::optional<std::uint64_t> total_size() const noexcept { return total_size_; }
  /// The opened shards, ordered by file name.
  const std::vector<safetensors_file>& shards() const noexcept { return shards_; }
  /// The shard that holds `name`; throws `not_found`.
  const safetensors_file& shard_of(std::string_view name) const {
    const auto it = shard_of_.find(name);
    if (it == shard_of_.end()) throw error(error_kind::not_found, path_ + ": no tensor " + detail::printable(name));
    return shards_[it->second];
  }
  /// The header entry of tensor `name` (offsets relative to its shard's buffer); throws `not_found`.
  const safetensors_entry& at(std::string_view name) const { return shard_of(name).at(name); }
  /// Reads tensor `name` from its shard.
  host_tensor read(std::string_view name) const { return shard_of(name).read(name); }
  /// Reads tensor `name` into `out`, which must be exactly its size.
  void read(std::string_view name, std::span<std::byte> out) const { shard_of(name).read(name, out); }

 private:
  std::string read_small_file(const std::filesystem::path& p) const {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw error(errno == ENOENT ? error_kind::not_found : error_kind::io,
                  "open " + path_ + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw error(error_kind::io, "stat " + path_ + ": " + std::strerror(err));
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size > safetensors_max_header_bytes) {
      ::close(fd);
      throw error(error_kind::corrupt, path_ + ": index is " + std::to_string(size) + " bytes, more than the " +
                                           std::to_string(safetensors_max_header_bytes) + " accepted");
    }
    std::string text(static_cast<std::size_t>(size), '\0');
    try {
      detail::pread_all(fd, std::as_writable_bytes(std::span(text.data(), text.size())), 0, path_);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    // Hand-edited indexes may start with whitespace; rapidjson takes the trailing newline.
    const auto first = text.find_first_not_of(" \t\r\n");
    return first == std::string::npos ? std::string() : text.substr(first);
  }

  std::string path_;
  std::map<std::string, std::string> weight_map_;
  std::optional<std::uint64_t> total_size_;
  std::vector<safetensors_file> shards_;
  std::map<std::string, std::size_t, std::less<>> shard_of_;
};

}  // namespace ckpt::interop
