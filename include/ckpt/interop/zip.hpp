#pragma once
/// @file interop/zip.hpp
/// A minimal zip archive writer and reader, for the archives `torch.save` writes: STORED
/// (uncompressed) entries only, data aligned to 64 bytes, ZIP64 when sizes or counts need it.
///
/// The reader assumes the file is hostile: every offset, size and count is checked against the
/// file size before it is used, entries may not overlap, and entry data is verified against its
/// CRC-32. Failures are `ckpt::error(error_kind::corrupt, "<file>: ...")`.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../detail/page_copy.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../posix.hpp"

namespace ckpt::interop {

namespace detail {

inline constexpr std::uint32_t zip_local_sig = 0x04034b50;
inline constexpr std::uint32_t zip_central_sig = 0x02014b50;
inline constexpr std::uint32_t zip_eocd_sig = 0x06054b50;
inline constexpr std::uint32_t zip64_eocd_sig = 0x06064b50;
inline constexpr std::uint32_t zip64_locator_sig = 0x07064b50;
inline constexpr std::size_t zip_local_size = 30;
inline constexpr std::size_t zip_central_size = 46;
inline constexpr std::size_t zip_eocd_size = 22;
inline constexpr std::size_t zip64_eocd_size = 56;
inline constexpr std::size_t zip64_locator_size = 20;
inline constexpr std::uint32_t zip_u32_max = 0xffffffffu;
inline constexpr std::uint16_t zip_u16_max = 0xffffu;
/// Data of every entry starts at a multiple of this, so a reader can map tensors in place
/// (torch's writer uses the same alignment).
inline constexpr std::uint64_t zip_alignment = 64;
/// Extra-field id of the alignment padding ("FB", as torch writes it).
inline constexpr std::uint16_t zip_padding_id = 0x4246;
inline constexpr std::uint16_t zip64_extra_id = 0x0001;

/// CRC-32 of `bytes` continued from `crc` (zlib's, in chunks because its length is 32-bit).
inline std::uint32_t crc32_update(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
  uLong c = crc;
  const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  std::size_t left = bytes.size();
  while (left > 0) {
    const uInt n = static_cast<uInt>(std::min<std::size_t>(left, std::size_t{1} << 30));
    c = ::crc32(c, p, n);
    p += n;
    left -= n;
  }
  return static_cast<std::uint32_t>(c);
}

/// Little-endian field writer for headers.
struct le_out {
  std::vector<std::byte> bytes;
  void u16(std::uint64_t v) { put(v, 2); }
  void u32(std::uint64_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void raw(std::string_view s) {
    for (char c : s) bytes.push_back(static_cast<std::byte>(c));
  }
  void put(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
  }
};

/// Little-endian field reader over a buffer the caller has already bounds-checked as a whole.
inline std::uint64_t le_get(const std::byte* p, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(p[i]);
  return v;
}

/// Reads exactly `out.size()` bytes at `offset` into `out` itself (handles short reads and EINTR).
inline void pread_exact_direct(int fd, std::span<std::byte> out, std::uint64_t offset, const std::string& file) {
  std::size_t done = 0;
  while (done < out.size()) {
    const std::size_t want = std::min<std::size_t>(out.size() - done, std::size_t{1} << 30);
    const ssize_t n = ::pread(fd, out.data() + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw ckpt::detail::posix_error("read", file, errno);
    }
    if (n == 0)
      throw error(error_kind::corrupt, file + ": unexpected end of file at offset " + std::to_string(offset + done));
    done += static_cast<std::size_t>(n);
  }
}

/// Reads exactly `out.size()` bytes at `offset` (handles short reads and EINTR; bounced where the
/// kernel's copy would be slow, detail/page_copy.hpp).
inline void pread_exact(int fd, std::span<std::byte> out, std::uint64_t offset, const std::string& file) {
  ckpt::detail::read_avoiding_slow_copy(offset, out, [&](std::uint64_t at, std::span<std::byte> part) {
    pread_exact_direct(fd, part, at, file);
  });
}

/// Writes all of `bytes` from `bytes` itself (handles short writes and EINTR).
inline void write_all_direct(int fd, std::span<const std::byte> bytes, const std::string& file) {
  const std::byte* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, std::min<std::size_t>(left, std::size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw ckpt::detail::posix_error("write", file, errno);
    }
    if (n == 0) throw error(error_kind::io, "write " + file + ": no progress");
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

/// Writes all of `bytes` at the file's position (handles short writes and EINTR; bounced where
/// the kernel's copy would be slow, detail/page_copy.hpp: the position is asked for only when
/// the write is large enough to be bounced).
inline void write_all(int fd, std::span<const std::byte> bytes, const std::string& file) {
  const off_t position = bytes.size() >= ckpt::detail::bounce_buffer::size ? ::lseek(fd, 0, SEEK_CUR) : 0;
  if (position < 0) {  // not seekable: no position to compare
    write_all_direct(fd, bytes, file);
    return;
  }
  ckpt::detail::write_avoiding_slow_copy(static_cast<std::uint64_t>(position), bytes,
                                         [&](std::uint64_t, std::span<const std::byte> part) { write_all_direct(fd, part, file); });
}

}  // namespace detail

/// How `zip_writer` lays out the archive.
///
/// @code
/// ckpt::interop::zip_writer z("test.zip", {.force_zip64 = true});
/// @endcode
struct zip_writer_options {
  /// Write ZIP64 records for every entry and the end of the archive even when nothing needs
  /// them (the writer switches to ZIP64 on its own past 4 GiB or 65535 entries). For tests.
  bool force_zip64 = false;
};

/// Writes a zip archive of STORED entries whose data starts at 64-byte boundaries, under a
/// temporary name next to `path`; `finish()` writes the central directory, fsyncs and renames
/// it into place, so `path` is either absent (or its old contents) or the complete archive.
/// Destroying an unfinished writer removes the temporary file.
///
/// Entries are streamed: `begin` writes the local header, `write` appends data and `end`
/// back-patches the CRC-32, so an entry never has to be held whole in memory.
///
/// @code
/// ckpt::interop::zip_writer z("out.zip");
/// z.add("archive/version", std::as_bytes(std::span("3\n", 2)));
/// z.begin("archive/data/0", bytes.size());
/// z.write(std::span(bytes).first(100));
/// z.write(std::span(bytes).subspan(100));
/// z.end();
/// z.finish();
/// @endcode
class zip_writer {
 public:
  explicit zip_writer(std::filesystem::path path, zip_writer_options options = {})
      : path_(std::move(path)), options_(options) {
    static std::atomic<unsigned> counter{0};
    temp_ = path_;
    temp_ += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw ckpt::detail::posix_error("create", temp_.string(), errno);
  }
  zip_writer(const zip_writer&) = delete;
  zip_writer& operator=(const zip_writer&) = delete;
  ~zip_writer() { discard(); }

  /// Starts an entry of exactly `size` bytes named `name`; the data follows through `write`.
  void begin(std::string_view name, std::uint64_t size) {
    check_open();
    if (in_entry_) throw error(error_kind::invalid_argument, temp_.string() + ": zip entry " + ckpt::detail::printable(current_.name) + " was not ended");
    if (name.empty() || name.size() > detail::zip_u16_max || name.find('\0') != std::string_view::npos)
      throw error(error_kind::invalid_argument, "zip entry name " + ckpt::detail::printable(name) + " is empty, longer than 65535 bytes or contains NUL");
    if (!names_.emplace(std::string(name), entries_.size()).second)
      throw error(error_kind::invalid_argument, temp_.string() + ": zip entry " + ckpt::detail::printable(name) + " written twice");
    current_ = entry{std::string(name), size, 0, pos_};
    const bool z64 = options_.force_zip64 || size >= detail::zip_u32_max;
    detail::le_out h;
    h.u32(detail::zip_local_sig);
    h.u16(z64 ? 45 : 20);                 // version needed to extract
    h.u16(utf8_flag(name));               // flags: no data descriptor, sizes are in the header
    h.u16(0);                             // method: stored
    h.u16(0);                             // time 00:00:00
    h.u16(0x21);                          // date 1980-01-01
    h.u32(0);                             // CRC-32, back-patched by end()
    h.u32(z64 ? detail::zip_u32_max : size);
    h.u32(z64 ? detail::zip_u32_max : size);
    h.u16(name.size());
    const std::uint64_t z64_len = z64 ? 20 : 0;
    std::uint64_t after = pos_ + detail::zip_local_size + name.size() + z64_len;
    std::uint64_t pad_len = 0;  // payload of the padding field, after its 4-byte header
    if (after % detail::zip_alignment != 0)
      pad_len = (detail::zip_alignment - (after + 4) % detail::zip_alignment) % detail::zip_alignment;
    const std::uint64_t extra_len = z64_len + (after % detail::zip_alignment != 0 ? 4 + pad_len : 0);
    h.u16(extra_len);
    h.raw(name);
    if (z64) {
      h.u16(detail::zip64_extra_id);
      h.u16(16);
      h.u64(size);
      h.u64(size);
    }
    if (after % detail::zip_alignment != 0) {
      h.u16(detail::zip_padding_id);
      h.u16(pad_len);
      h.raw(std::string(pad_len, 'Z'));
    }
    put(h.bytes);
    in_entry_ = true;
    written_ = 0;
    crc_ = 0;
  }

  /// Appends data to the entry started by `begin`.
  void write(std::span<const std::byte> data) {
    check_open();
    if (!in_entry_) throw error(error_kind::invalid_argument, temp_.string() + ": zip write outside an entry");
    if (data.size() > current_.size - written_)
      throw error(error_kind::invalid_argument, temp_.string() + ": zip entry " + ckpt::detail::printable(current_.name) +
                                                    " declared " + std::to_string(current_.size) + " bytes, got more");
    crc_ = detail::crc32_update(crc_, data);
    put(data);
    written_ += data.size();
  }

  /// Ends the current entry: checks its size and writes its CRC-32 into the local header.
  void end() {
    check_open();
    if (!in_entry_) throw error(error_kind::invalid_argument, temp_.string() + ": zip end() outside an entry");
    if (written_ != current_.size)
      throw error(error_kind::invalid_argument, temp_.string() + ": zip entry " + ckpt::detail::printable(current_.name) +
                                                    " declared " + std::to_string(current_.size) + " bytes, got " +
                                                    std::to_string(written_));
    current_.crc = crc_;
    detail::le_out c;
    c.u32(crc_);
    std::size_t done = 0;
    while (done < c.bytes.size()) {
      const ssize_t n = ::pwrite(fd_, c.bytes.data() + done, c.bytes.size() - done,
                                 static_cast<off_t>(current_.offset + 14 + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail(ckpt::detail::posix_error("write", temp_.string(), n < 0 ? errno : EIO));
      done += static_cast<std::size_t>(n);
    }
    entries_.push_back(std::move(current_));
    in_entry_ = false;
  }

  /// Writes a whole entry.
  void add(std::string_view name, std::span<const std::byte> data) {
    begin(name, data.size());
    write(data);
    end();
  }

  /// Writes the central directory, fsyncs, renames the archive to `path` and fsyncs its folder.
  void finish() {
    check_open();
    if (in_entry_) throw error(error_kind::invalid_argument, temp_.string() + ": zip entry " + ckpt::detail::printable(current_.name) + " was not ended");
    const std::uint64_t cd_offset = pos_;
    for (const auto& e : entries_) {
      const bool big_size = options_.force_zip64 || e.size >= detail::zip_u32_max;
      const bool big_offset = options_.force_zip64 || e.offset >= detail::zip_u32_max;
      detail::le_out h;
      h.u32(detail::zip_central_sig);
      h.u16(0x0300 | 45);  // made by: Unix, zip 4.5
      h.u16(big_size || big_offset ? 45 : 20);
      h.u16(utf8_flag(e.name));
      h.u16(0);
      h.u16(0);
      h.u16(0x21);
      h.u32(e.crc);
      h.u32(big_size ? detail::zip_u32_max : e.size);
      h.u32(big_size ? detail::zip_u32_max : e.size);
      h.u16(e.name.size());
      h.u16((big_size || big_offset) ? 4 + (big_size ? 16 : 0) + (big_offset ? 8 : 0) : 0);
      h.u16(0);                    // comment length
      h.u16(0);                    // disk number
      h.u16(0);                    // internal attributes
      h.u32(0100644u << 16);       // external attributes: a regular file, rw-r--r--
      h.u32(big_offset ? detail::zip_u32_max : e.offset);
      h.raw(e.name);
      if (big_size || big_offset) {
        h.u16(detail::zip64_extra_id);
        h.u16((big_size ? 16 : 0) + (big_offset ? 8 : 0));
        if (big_size) {
          h.u64(e.size);
          h.u64(e.size);
        }
        if (big_offset) h.u64(e.offset);
      }
      put(h.bytes);
    }
    const std::uint64_t cd_size = pos_ - cd_offset;
    const std::uint64_t count = entries_.size();
    const bool z64 = options_.force_zip64 || count > detail::zip_u16_max - 1 || cd_offset >= detail::zip_u32_max ||
                     cd_size >= detail::zip_u32_max;
    detail::le_out t;
    if (z64) {
      const std::uint64_t z64_eocd = pos_;
      t.u32(detail::zip64_eocd_sig);
      t.u64(detail::zip64_eocd_size - 12);  // size of the rest of the record
      t.u16(0x0300 | 45);
      t.u16(45);
      t.u32(0);  // this disk
      t.u32(0);  // disk with the central directory
      t.u64(count);
      t.u64(count);
      t.u64(cd_size);
      t.u64(cd_offset);
      t.u32(detail::zip64_locator_sig);
      t.u32(0);
      t.u64(z64_eocd);
      t.u32(1);  // total disks
    }
    t.u32(detail::zip_eocd_sig);
    t.u16(0);
    t.u16(0);
    t.u16(z64 ? detail::zip_u16_max : count);
    t.u16(z64 ? detail::zip_u16_max : count);
    t.u32(z64 ? detail::zip_u32_max : cd_size);
    t.u32(z64 ? detail::zip_u32_max : cd_offset);
    t.u16(0);  // comment length
    put(t.bytes);
    if (::fsync(fd_) != 0) fail(ckpt::detail::posix_error("fsync", temp_.string(), errno));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail(ckpt::detail::posix_error("close", temp_.string(), errno));
    if (::rename(temp_.c_str(), path_.c_str()) != 0)
      fail(ckpt::detail::posix_error("rename " + temp_.string() + " to", path_.string(), errno));
    temp_.clear();
    const auto dir = path_.parent_path();
    ckpt::detail::fsync_dir(dir.empty() ? std::filesystem::path(".") : dir);
  }

  /// Bytes written so far (the offset the next header or data byte goes to).
  std::uint64_t size() const noexcept { return pos_; }
  /// The final path.
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  struct entry {
    std::string name;
    std::uint64_t size = 0;
    std::uint32_t crc = 0;
    std::uint64_t offset = 0;  // of the local header
  };

  static std::uint16_t utf8_flag(std::string_view name) {
    for (char c : name)
      if (static_cast<unsigned char>(c) >= 0x80) return 0x0800;  // bit 11: the name is UTF-8
    return 0;
  }
  void check_open() const {
    if (fd_ < 0) throw error(error_kind::invalid_argument, path_.string() + ": zip writer already finished or failed");
  }
  void put(std::span<const std::byte> bytes) {
    try {
      detail::write_all(fd_, bytes, temp_.string());
    } catch (const error& e) {
      fail(e);
    }
    pos_ += bytes.size();
  }
  /// Removes the temporary file and rethrows: a failed archive must not stay around.
  [[noreturn]] void fail(const error& e) {
    discard();
    throw e;
  }
  void discard() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    if (!temp_.empty()) {
      ::unlink(temp_.c_str());
      temp_.clear();
    }
  }

  std::filesystem::path path_, temp_;
  zip_writer_options options_;
  int fd_ = -1;
  std::uint64_t pos_ = 0;
  std::vector<entry> entries_;
  std::unordered_map<std::string, std::size_t> names_;
  entry current_;
  bool in_entry_ = false;
  std::uint64_t written_ = 0;
  std::uint32_t crc_ = 0;
};

/// One entry of a zip archive, as the central directory describes it (already checked).
///
/// @code
/// const ckpt::interop::zip_entry& e = zip.at("archive/data/0");
/// std::vector<std::byte> bytes(e.size);
/// zip.read(e, bytes);
/// @endcode
struct zip_entry {
  std::string name;
  std::uint64_t size = 0;           ///< bytes of data (stored: compressed == uncompressed)
  std::uint32_t crc32 = 0;          ///< CRC-32 of the data
  std::uint64_t header_offset = 0;  ///< of the local header
  std::uint64_t data_offset = 0;    ///< of the first data byte
};

/// Limits the reader enforces before it allocates anything an archive asks for.
///
/// @code
/// ckpt::interop::zip_reader z("untrusted.zip", {.max_entries = 1000, .max_central_directory = 1 << 20});
/// @endcode
struct zip_reader_limits {
  std::uint64_t max_entries = 1u << 20;                       ///< entries in the central directory
  std::uint64_t max_central_directory = std::uint64_t{1} << 28;  ///< bytes of central directory read into memory
};

/// Reads a zip archive of STORED entries with `pread`, checking every structure against the
/// file size. Only the central directory is held in memory; entry data is read on demand into
/// the caller's buffer, and whole-entry reads verify the CRC-32.
///
/// @code
/// ckpt::interop::zip_reader z("model.pt");
/// for (const auto& e : z.entries()) std::cout << e.name << " " << e.size << "\n";
/// std::vector<std::byte> pkl = z.read("archive/data.pkl");  // CRC-32 checked
/// @endcode
class zip_reader {
 public:
  explicit zip_reader(std::filesystem::path path, zip_reader_limits limits = {})
      : path_(std::move(path)), file_(path_.string()) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      const int err = errno;
      throw error(err == ENOENT ? error_kind::not_found : error_kind::io,
                  "open " + file_ + ": " + std::strerror(err));
    }
    try {
      struct stat st{};
      if (::fstat(fd_, &st) != 0) throw ckpt::detail::posix_error("stat", file_, errno);
      if (!S_ISREG(st.st_mode)) throw error(error_kind::invalid_argument, file_ + ": not a regular file");
      size_ = static_cast<std::uint64_t>(st.st_size);
      parse(limits);
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  zip_reader(zip_reader&& o) noexcept
      : path_(std::move(o.path_)), file_(std::move(o.file_)), fd_(std::exchange(o.fd_, -1)), size_(o.size_),
        entries_(std::move(o.entries_)), index_(std::move(o.index_)) {}
  zip_reader& operator=(zip_reader&&) = delete;
  zip_reader(const zip_reader&) = delete;
  zip_reader& operator=(const zip_reader&) = delete;
  ~zip_reader() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// Every entry, in central-directory order.
  const std::vector<zip_entry>& entries() const noexcept { return entries_; }
  /// The entry named `name`, or nullptr.
  const zip_entry* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  /// The entry named `name`; `not_found` naming the archive when absent.
  const zip_entry& at(std::string_view name) const {
    if (const auto* e = find(name)) return *e;
    throw error(error_kind::not_found, file_ + ": no zip entry " + ckpt::detail::printable(name));
  }

  /// Reads the whole entry into `out` (exactly `e.size` bytes) and verifies its CRC-32.
  void read(const zip_entry& e, std::span<std::byte> out) const {
    if (out.size() != e.size)
      throw error(error_kind::invalid_argument, file_ + ": zip entry " + ckpt::detail::printable(e.name) + " has " +
                                                    std::to_string(e.size) + " bytes, the buffer " + std::to_string(out.size()));
    std::uint32_t crc = 0;
    constexpr std::size_t chunk = std::size_t{64} << 20;  // CRC while the chunk is still in cache
    for (std::size_t done = 0; done < out.size(); done += chunk) {
      auto part = out.subspan(done, std::min(chunk, out.size() - done));
      detail::pread_exact(fd_, part, e.data_offset + done, file_);
      crc = detail::crc32_update(crc, part);
    }
    if (crc != e.crc32)
      throw error(error_kind::corrupt, file_ + ": zip entry " + ckpt::detail::printable(e.name) + ": CRC-32 mismatch (stored " +
                                           hex(e.crc32) + ", data has " + hex(crc) + ")");
  }
  /// The whole entry named `name`, CRC-32 verified.
  std::vector<std::byte> read(std::string_view name) const {
    const auto& e = at(name);
    std::vector<std::byte> out(e.size);
    read(e, out);
    return out;
  }
  /// Reads `out.size()` bytes starting `offset` bytes into the entry, without CRC check (the
  /// CRC covers the whole entry; use `read` to verify it).
  void read_at(const zip_entry& e, std::uint64_t offset, std::span<std::byte> out) const {
    if (offset > e.size || out.size() > e.size - offset)
      throw error(error_kind::invalid_argument, file_ + ": read of " + std::to_string(out.size()) + " bytes at " +
                                                    std::to_string(offset) + " past the end of zip entry " +
                                                    ckpt::detail::printable(e.name) + " (" + std::to_string(e.size) + " bytes)");
    detail::pread_exact(fd_, out, e.data_offset + offset, file_);
  }

  /// The archive's path.
  const std::filesystem::path& path() const noexcept { return path_; }
  /// The archive's size in bytes.
  std::uint64_t file_size() const noexcept { return size_; }

 private:
  static std::string hex(std::uint32_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s = "0x";
    for (int i = 7; i >= 0; --i) s += digits[(v >> (4 * i)) & 15];
    return s;
  }
  [[noreturn]] void corrupt(const std::string& what) const { throw error(error_kind::corrupt, file_ + ": " + what); }
  std::vector<std::byte> read_bytes(std::uint64_t offset, std::uint64_t n, const char* what) const {
    if (offset > size_ || n > size_ - offset)
      corrupt(std::string(what) + " at offset " + std::to_string(offset) + " (" + std::to_string(n) +
              " bytes) extends past the end of the file (" + std::to_string(size_) + " bytes)");
    std::vector<std::byte> b(n);
    detail::pread_exact(fd_, b, offset, file_);
    return b;
  }

  void parse(const zip_reader_limits& limits) {
    // End of central directory: the last 22..65557 bytes. Its comment must run exactly to the
    // end of the file, which rules out a stray signature inside the comment.
    if (size_ < detail::zip_eocd_size)
      corrupt("not a zip archive: " + std::to_string(size_) + " bytes is too short for an end-of-central-directory record");
    const std::uint64_t tail_len = std::min<std::uint64_t>(size_, detail::zip_eocd_size + 0xffff);
    const auto tail = read_bytes(size_ - tail_len, tail_len, "end of file");
    std::uint64_t eocd = std::numeric_limits<std::uint64_t>::max();
    for (std::uint64_t i = tail_len - detail::zip_eocd_size + 1; i-- > 0;) {
      if (detail::le_get(&tail[i], 4) != detail::zip_eocd_sig) continue;
      if (i + detail::zip_eocd_size + detail::le_get(&tail[i + 20], 2) == tail_len) {
        eocd = size_ - tail_len + i;
        break;
      }
    }
    if (eocd == std::numeric_limits<std::uint64_t>::max())
      corrupt("not a zip archive: no end-of-central-directory record");
    const std::byte* r = &tail[eocd - (size_ - tail_len)];
    const auto disk = detail::le_get(r + 4, 2), cd_disk = detail::le_get(r + 6, 2);
    std::uint64_t disk_entries = detail::le_get(r + 8, 2), count = detail::le_get(r + 10, 2);
    std::uint64_t cd_size = detail::le_get(r + 12, 4), cd_offset = detail::le_get(r + 16, 4);
    if (disk != 0 || cd_disk != 0) corrupt("multi-disk zip archives are not supported");
    std::uint64_t cd_limit = eocd;  // the central directory ends before this
    if (eocd >= detail::zip64_locator_size) {
      const auto loc = read_bytes(eocd - detail::zip64_locator_size, detail::zip64_locator_size, "ZIP64 locator");
      if (detail::le_get(&loc[0], 4) == detail::zip64_locator_sig) {
        const std::uint64_t z = detail::le_get(&loc[8], 8);
        if (detail::le_get(&loc[4], 4) != 0 || detail::le_get(&loc[16], 4) > 1)
          corrupt("multi-disk zip archives are not supported");
        if (z > eocd - detail::zip64_locator_size || eocd - detail::zip64_locator_size - z < detail::zip64_eocd_size)
          corrupt("ZIP64 end-of-central-directory offset " + std::to_string(z) + " is out of range (locator at " +
                  std::to_string(eocd - detail::zip64_locator_size) + ")");
        const auto rec = read_bytes(z, detail::zip64_eocd_size, "ZIP64 end-of-central-directory record");
        if (detail::le_get(&rec[0], 4) != detail::zip64_eocd_sig)
          corrupt("bad ZIP64 end-of-central-directory signature at offset " + std::to_string(z));
        if (detail::le_get(&rec[16], 4) != 0 || detail::le_get(&rec[20], 4) != 0)
          corrupt("multi-disk zip archives are not supported");
        disk_entries = detail::le_get(&rec[24], 8);
        count = detail::le_get(&rec[32], 8);
        cd_size = detail::le_get(&rec[40], 8);
        cd_offset = detail::le_get(&rec[48], 8);
        cd_limit = z;
      }
    }
    if (disk_entries != count)
      corrupt("central directory counts disagree (" + std::to_string(disk_entries) + " vs " + std::to_string(count) + ")");
    if (cd_offset > cd_limit || cd_size > cd_limit - cd_offset)
      corrupt("central directory at offset " + std::to_string(cd_offset) + " (" + std::to_string(cd_size) +
              " bytes) overlaps the end records at " + std::to_string(cd_limit) + " (file size " + std::to_string(size_) + ")");
    if (count > limits.max_entries)
      corrupt("central directory claims " + std::to_string(count) + " entries (the limit is " +
              std::to_string(limits.max_entries) + ")");
    if (count > cd_size / detail::zip_central_size)
      corrupt("central directory claims " + std::to_string(count) + " entries but holds only " + std::to_string(cd_size) + " bytes");
    if (cd_size > limits.max_central_directory)
      corrupt("central directory of " + std::to_string(cd_size) + " bytes exceeds the limit of " +
              std::to_string(limits.max_central_directory));
    const auto cd = read_bytes(cd_offset, cd_size, "central directory");

    entries_.reserve(count);
    std::uint64_t p = 0;
    for (std::uint64_t i = 0; i < count; ++i) {
      if (cd_size - p < detail::zip_central_size)
        corrupt("central directory entry " + std::to_string(i) + " is truncated");
      const std::byte* h = &cd[p];
      if (detail::le_get(h, 4) != detail::zip_central_sig)
        corrupt("bad signature of central directory entry " + std::to_string(i) + " at offset " + std::to_string(cd_offset + p));
      const auto flags = detail::le_get(h + 8, 2), method = detail::le_get(h + 10, 2);
      zip_entry e;
      e.crc32 = static_cast<std::uint32_t>(detail::le_get(h + 16, 4));
      std::uint64_t csize = detail::le_get(h + 20, 4), usize = detail::le_get(h + 24, 4);
      const auto name_len = detail::le_get(h + 28, 2), extra_len = detail::le_get(h + 30, 2),
                 comment_len = detail::le_get(h + 32, 2), start_disk = detail::le_get(h + 34, 2);
      e.header_offset = detail::le_get(h + 42, 4);
      if (cd_size - p - detail::zip_central_size < name_len + extra_len + comment_len)
        corrupt("central directory entry " + std::to_string(i) + " is truncated");
      e.name.assign(reinterpret_cast<const char*>(h + detail::zip_central_size), name_len);
      const std::string label = "zip entry " + ckpt::detail::printable(e.name);
      // ZIP64 extra field: the 64-bit values of exactly the fields that read 0xffffffff, in order.
      const std::byte* x = h + detail::zip_central_size + name_len;
      for (std::uint64_t q = 0; q + 4 <= extra_len;) {
        const auto id = detail::le_get(x + q, 2), len = detail::le_get(x + q + 2, 2);
        if (q + 4 + len > extra_len) corrupt(label + ": extra field overruns its header");
        if (id == detail::zip64_extra_id) {
          std::uint64_t k = 0;
          auto next = [&](const char* field) {
            if (k + 8 > len) corrupt(label + ": ZIP64 extra field lacks the " + std::string(field));
            const auto v = detail::le_get(x + q + 4 + k, 8);
            k += 8;
            return v;
          };
          if (usize == detail::zip_u32_max) usize = next("uncompressed size");
          if (csize == detail::zip_u32_max) csize = next("compressed size");
          if (e.header_offset == detail::zip_u32_max) e.header_offset = next("local header offset");
        }
        q += 4 + len;
      }
      p += detail::zip_central_size + name_len + extra_len + comment_len;
      if (flags & 1u) corrupt(label + " is encrypted");
      if (start_disk != 0) corrupt(label + " starts on disk " + std::to_string(start_disk));
      if (method != 0)
        corrupt(label + " uses compression method " + std::to_string(method) + "; only stored (uncompressed) entries are supported");
      if (csize != usize)
        corrupt(label + " is stored but its compressed size " + std::to_string(csize) + " differs from its size " +
                std::to_string(usize));
      e.size = usize;
      if (!index_.emplace(e.name, entries_.size()).second) corrupt(label + " appears twice");
      entries_.push_back(std::move(e));
    }

    // Local headers: each must agree with the central directory, and the data of each entry
    // must lie before the central directory without overlapping the next entry.
    for (auto& e : entries_) {
      const std::string label = "zip entry " + ckpt::detail::printable(e.name);
      if (e.header_offset > cd_offset || cd_offset - e.header_offset < detail::zip_local_size)
        corrupt(label + ": local header offset " + std::to_string(e.header_offset) +
                " is beyond the central directory at " + std::to_string(cd_offset) + " (file size " + std::to_string(size_) + ")");
      const auto lh = read_bytes(e.header_offset, detail::zip_local_size, "local header");
      if (detail::le_get(&lh[0], 4) != detail::zip_local_sig)
        corrupt(label + ": bad local header signature at offset " + std::to_string(e.header_offset));
      if (detail::le_get(&lh[8], 2) != 0)
        corrupt(label + ": local header says compression method " + std::to_string(detail::le_get(&lh[8], 2)));
      const auto name_len = detail::le_get(&lh[26], 2), extra_len = detail::le_get(&lh[28], 2);
      const std::uint64_t start = e.header_offset + detail::zip_local_size + name_len + extra_len;
      if (start > cd_offset || e.size > cd_offset - start)
        corrupt(label + ": data at offset " + std::to_string(start) + " (" + std::to_string(e.size) +
                " bytes) runs past the central directory at " + std::to_string(cd_offset));
      const auto local_name = read_bytes(e.header_offset + detail::zip_local_size, name_len, "local file name");
      // (memcmp of zero bytes still wants valid pointers, and an empty name has none.)
      if (name_len != e.name.size() || (name_len != 0 && std::memcmp(local_name.data(), e.name.data(), name_len) != 0))
        corrupt(label + ": local header names a different file");
      e.data_offset = start;
    }
    std::vector<const zip_entry*> order;
    order.reserve(entries_.size());
    for (const auto& e : entries_) order.push_back(&e);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->header_offset < b->header_offset; });
    for (std::size_t i = 1; i < order.size(); ++i)
      if (order[i - 1]->data_offset + order[i - 1]->size > order[i]->header_offset)
        corrupt("zip entries " + ckpt::detail::printable(order[i - 1]->name) + " and " +
                ckpt::detail::printable(order[i]->name) + " overlap");
  }

  std::filesystem::path path_;
  std::string file_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::vector<zip_entry> entries_;
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace ckpt::interop
