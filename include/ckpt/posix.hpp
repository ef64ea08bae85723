#pragma once
/// @file posix.hpp
/// `ckpt::posix`: the default Storage, a directory on a local or shared POSIX file system.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "detail/keys.hpp"
#include "detail/page_copy.hpp"
#include "error.hpp"

namespace ckpt {

namespace detail {
inline error posix_error(const std::string& op, const std::string& path, int err) {
  return error(error_kind::io, op + " " + path + ": " + std::strerror(err));
}

/// fsync a directory so that the entries created or renamed in it survive a power cut.
inline void fsync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw posix_error("open directory", dir.string(), errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) throw posix_error("fsync directory", dir.string(), err);
}

/// Creates `dir` and its missing parents; returns the parents whose entries changed (to fsync).
inline std::vector<std::filesystem::path> make_dirs(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> missing;
  for (auto p = dir; !p.empty(); p = p.parent_path()) {
    struct stat st{};
    if (::stat(p.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) throw error(error_kind::io, "not a directory: " + p.string());
      break;
    }
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  std::vector<std::filesystem::path> changed;
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0777) != 0 && errno != EEXIST) throw posix_error("mkdir", it->string(), errno);
    changed.push_back(it->parent_path().empty() ? std::filesystem::path(".") : it->parent_path());
  }
  return changed;
}
}  // namespace detail

/// A checkpoint root on a POSIX file system. Files are written under a temporary name,
/// fsync'd, renamed into place and their directory fsync'd, so a crash leaves either the old
/// file or the complete new one.
///
/// @code
/// ckpt::posix disk("/ckpt/run1");
/// auto w = disk.create("global_step10/notes.txt");
/// w.write(std::as_bytes(std::span(text)));
/// w.sync();     // durable under a temporary name
/// w.publish();  // renamed to global_step10/notes.txt, directory fsync'd
/// @endcode
class posix {
 public:
  /// `read` is a pread on its own descriptor: loads may read chunks from several threads.
  static constexpr bool concurrent_reads = true;

  /// Writes one file; see the class comment for the protocol.
  class writer {
   public:
    writer(writer&& o) noexcept
        : fd_(std::exchange(o.fd_, -1)), temp_(std::exchange(o.temp_, {})), final_(std::move(o.final_)),
          dirs_(std::move(o.dirs_)), pending_(std::move(o.pending_)), position_(o.position_) {}
    writer& operator=(writer&& o) noexcept {
      if (this != &o) {
        discard();
        fd_ = std::exchange(o.fd_, -1);
        temp_ = std::exchange(o.temp_, {});  // empty: the moved-from writer must not unlink it
        final_ = std::move(o.final_);
        dirs_ = std::move(o.dirs_);
        pending_ = std::move(o.pending_);
        position_ = o.position_;
      }
      return *this;
    }
    writer(const writer&) = delete;
    writer& operator=(const writer&) = delete;
    ~writer() { discard(); }

    /// Appends bytes (handles short writes and EINTR). Writes under 64 KiB are gathered into
    /// one buffer of up to 1 MiB first: a state of thousands of small tensors would otherwise
    /// make a system call per chunk, and ext4 zeroes the rest of a new page-cache folio on
    /// every small write into it (a fifth of the time of saving 10 000 tensors of 1 KiB).
    void write(std::span<const std::byte> bytes) {
      if (bytes.size() >= small_write) {
        flush();
        write_all(bytes);
        return;
      }
      if (pending_.size() + bytes.size() > pending_bytes) flush();
      pending_.insert(pending_.end(), bytes.begin(), bytes.end());  // grows to what the file needs
    }
    /// Makes the bytes durable under the temporary name.
    void sync() {
      flush();
      if (::fsync(fd_) != 0) throw detail::posix_error("fsync", temp_.string(), errno);
    }
    /// Renames the file to its final name and makes the rename durable.
    void publish() {
      flush();
      const int fd = std::exchange(fd_, -1);
      if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(temp_.c_str());
        throw detail::posix_error("close", temp_.string(), err);
      }
      if (::rename(temp_.c_str(), final_.c_str()) != 0) {
        const int err = errno;
        ::unlink(temp_.c_str());
        throw detail::posix_error("rename " + temp_.string() + " to", final_.string(), err);
      }
      temp_.clear();
      detail::fsync_dir(final_.parent_path());
      for (const auto& d : dirs_) detail::fsync_dir(d);
    }

   private:
    friend class posix;
    static constexpr std::size_t small_write = std::size_t{64} * 1024, pending_bytes = std::size_t{1} << 20;

    void write_all(std::span<const std::byte> bytes) {
      // The kernel's copy into the page cache is 3x slower when the file position lies just
      // past the buffer modulo 4 KiB (detail/page_copy.hpp): such writes are bounced.
      detail::write_avoiding_slow_copy(position_, bytes,
                                       [this](std::uint64_t, std::span<const std::byte> part) { write_exactly(part); });
    }
    void write_exactly(std::span<const std::byte> bytes) {
      const std::byte* p = bytes.data();
      std::size_t left = bytes.size();
      while (left > 0) {
        const ssize_t n = ::write(fd_, p, left);
        if (n < 0) {
          if (errno == EINTR) continue;
          throw detail::posix_error("write", temp_.string(), errno);
        }
        if (n == 0) throw error(error_kind::io, "write " + temp_.string() + ": no progress");
        p += n;
        left -= static_cast<std::size_t>(n);
        position_ += static_cast<std::uint64_t>(n);
      }
    }
    void flush() {
      if (pending_.empty()) return;
      struct clear_after {  // even when the write fails: a failed file is discarded, never retried
        std::vector<std::byte>& bytes;
        ~clear_after() { bytes.clear(); }
      } guard{pending_};
      write_all(pending_);
    }

    writer(int fd, std::filesystem::path temp, std::filesystem::path final_path, std::vector<std::filesystem::path> dirs)
        : fd_(fd), temp_(std::move(temp)), final_(std::move(final_path)), dirs_(std::move(dirs)) {}
    void discard() noexcept {
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      if (!temp_.empty()) ::unlink(temp_.c_str());
      temp_.clear();
    }
    int fd_ = -1;
    std::filesystem::path temp_, final_;
    std::vector<std::filesystem::path> dirs_;  // directories whose entries changed when creating parents
    std::vector<std::byte> pending_;           // small writes not yet written (see write)
    std::uint64_t position_ = 0;               // bytes written to the file so far
  };

  /// A storage rooted at `root` (created on the first write).
  posix(std::filesystem::path root) : root_(std::move(root)) {}  // NOLINT: implicit on purpose
  posix(const char* root) : root_(root) {}                     // NOLINT
  posix(const std::string& root) : root_(root) {}              // NOLINT

  const std::filesystem::path& root() const noexcept { return root_; }

  /// Holds the root's writer lock (an advisory `flock` on `<root>/.ckpt_lock`) until destroyed.
  /// The kernel drops it when its holder exits, however it exits, so a killed job never
  /// leaves a stale lock behind.
  class writer_lock {
   public:
    writer_lock(writer_lock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    writer_lock& operator=(writer_lock&& o) noexcept {
      if (this != &o) {
        release();
        fd_ = std::exchange(o.fd_, -1);
      }
      return *this;
    }
    writer_lock(const writer_lock&) = delete;
    writer_lock& operator=(const writer_lock&) = delete;
    ~writer_lock() { release(); }

   private:
    friend class posix;
    explicit writer_lock(int fd) noexcept : fd_(fd) {}
    void release() noexcept {
      if (fd_ >= 0) ::close(fd_);  // closing the descriptor drops the flock
      fd_ = -1;
    }
    int fd_ = -1;
  };

  /// Takes the root's writer lock, creating the root if needed. Another holder, in this
  /// process or another one on any machine that shares the file system's locks, makes this a
  /// `busy` error, or, with `wait`, blocks until it lets go.
  ///
  /// @code
  /// ckpt::posix disk("/ckpt/run1");
  /// auto lock = disk.lock_writer(false);  // throws ckpt::error (busy) if a job is saving there
  /// @endcode
  writer_lock lock_writer(bool wait) {
    detail::make_dirs(root_);
    const auto file = root_ / std::string(lock_file);
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw detail::posix_error("open", file.string(), errno);
    writer_lock lock(fd);
    while (::flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0) {
      if (errno == EINTR) continue;
      if (errno == EWOULDBLOCK)
        throw error(error_kind::busy, "another writer is saving to " + root_.string() + " (it holds the lock on " +
                                          file.string() + "); two writers to one root would overwrite each "
                                          "other's latest and delete each other's tags. Give each job its own "
                                          "root, or set checkpointer_options::wait_for_other_writer");
      throw detail::posix_error("flock", file.string(), errno);
    }
    return lock;
  }

  /// The name of the lock file in the root (informative in docs/format.md; readers ignore it).
  static constexpr std::string_view lock_file = ".ckpt_lock";

  /// Opens a new temporary file that `publish()` will rename to `key`.
  writer create(std::string_view key) {
    detail::check_key(key);
    const auto final_path = path(key);
    auto dirs = detail::make_dirs(final_path.parent_path());
    static std::atomic<unsigned> counter{0};
    auto temp = final_path;
    temp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw detail::posix_error("create", temp.string(), errno);
    return writer(fd, std::move(temp), final_path, std::move(dirs));
  }

  /// One file open for reading: several reads without reopening it (open_reader).
  class reader {
   public:
    reader(int fd, std::filesystem::path p) noexcept : fd_(fd), path_(std::move(p)) {}
    reader(reader&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
    reader& operator=(reader&&) = delete;
    ~reader() {
      if (fd_ >= 0) ::close(fd_);
    }

    /// Reads exactly `out.size()` bytes at `offset`; a file too short is `corrupt` (truncated).
    void read(std::uint64_t offset, std::span<std::byte> out) const {
      // The kernel's copy out of the page cache is 3x slower when the buffer lies just past
      // the file offset modulo 4 KiB, as a std::vector's does (detail/page_copy.hpp): such
      // reads are bounced. A short file is reported for the whole range asked for.
      detail::read_avoiding_slow_copy(offset, out, [&](std::uint64_t at, std::span<std::byte> part) {
        read_exactly(at, part, offset, out.size());
      });
    }

   private:
    /// Reads `out` at `offset`, part of the caller's `wanted` bytes at `first` (for the message).
    void read_exactly(std::uint64_t offset, std::span<std::byte> out, std::uint64_t first, std::uint64_t wanted) const {
      std::size_t done = 0;
      while (done < out.size()) {
        const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
        if (n < 0) {
          const int err = errno;
          if (err == EINTR) continue;
          throw detail::posix_error("read", path_.string(), err);
        }
        if (n == 0)
          throw error(error_kind::corrupt, path_.string() + " is truncated: needed bytes [" + std::to_string(first) +
                                               ", " + std::to_string(first + wanted) + "), the file ends at " +
                                               std::to_string(offset + done));
        done += static_cast<std::size_t>(n);
      }
    }

    int fd_;
    std::filesystem::path path_;
  };

  /// Opens the file at `key` for reading; a missing file is `not_found`.
  reader open_reader(std::string_view key) const {
    detail::check_key(key);
    auto p = path(key);
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT) throw error(error_kind::not_found, "no such file: " + p.string());
      throw detail::posix_error("open", p.string(), err);
    }
    return reader(fd, std::move(p));
  }

  /// Reads exactly `out.size()` bytes at `offset`; a file too short is `corrupt` (truncated).
  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const {
    open_reader(key).read(offset, out);
  }

  /// Size of the file at `key`, or nothing when it does not exist.
  std::optional<std::uint64_t> size(std::string_view key) const {
    detail::check_key(key);
    struct stat st{};
    const auto p = path(key);
    if (::stat(p.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
      throw detail::posix_error("stat", p.string(), errno);
    }
    if (!S_ISREG(st.st_mode)) return std::nullopt;
    return static_cast<std::uint64_t>(st.st_size);
  }

  /// Names of the entries directly under `prefix` ("" for the root), sorted.
  std::vector<std::string> list(std::string_view prefix) const {
    detail::check_key(prefix, true);
    std::vector<std::string> names;
    std::error_code ec;
    std::filesystem::directory_iterator it(path(prefix), ec), end;
    if (ec) {
      if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) return names;
      throw error(error_kind::io, "list " + path(prefix).string() + ": " + ec.message());
    }
    for (; it != end; it.increment(ec)) {
      if (ec) throw error(error_kind::io, "list " + path(prefix).string() + ": " + ec.message());
      names.push_back(it->path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  /// Removes one file (nothing when it does not exist), durably.
  void remove(std::string_view key) {
    detail::check_key(key);
    const auto p = path(key);
    if (::unlink(p.c_str()) != 0) {
      if (errno == ENOENT) return;
      throw detail::posix_error("remove", p.string(), errno);
    }
    detail::fsync_dir(p.parent_path());
  }

  /// Removes a directory tree (nothing when it does not exist), durably.
  void remove_all(std::string_view prefix) {
    detail::check_key(prefix);
    const auto p = path(prefix);
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
    if (ec) throw error(error_kind::io, "remove " + p.string() + ": " + ec.message());
    std::error_code ec2;
    if (std::filesystem::exists(p.parent_path(), ec2)) detail::fsync_dir(p.parent_path());
  }

  /// The path of `key`, for messages.
  std::string describe(std::string_view key) const { return path(key).string(); }

 private:
  std::filesystem::path path(std::string_view key) const { return key.empty() ? root_ : root_ / std::string(key); }
  std::filesystem::path root_;
};

}  // namespace ckpt
