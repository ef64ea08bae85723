#pragma once
/// @file posix.hpp
/// `ckpt::posix`: the default Storage, a directory on a local or shared POSIX file system.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
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
#include "detail/write_queue.hpp"
#include "error.hpp"

namespace ckpt {

namespace detail {
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

/// How `ckpt::posix` moves bytes to and from its files.
///
/// @code
/// ckpt::posix disk("/ckpt/run1", {.direct_writes = false});  // write through the page cache
/// @endcode
struct posix_options {
  /// Write files with O_DIRECT, straight from aligned buffers to the disk, where the file
  /// system allows it (elsewhere, and for the last partial 4 KiB of each file, through the page
  /// cache as usual). A checkpoint is written once and rarely read back soon, so caching it
  /// only evicts pages the training job wants; and filling the cache costs a kernel copy per
  /// byte into newly allocated pages: on this project's VM, `dd` wrote 2.5 GiB and fsync'd it
  /// in 12-14 s through the page cache and in 2.0-3.0 s with O_DIRECT.
  bool direct_writes = true;
  /// Read with O_DIRECT the bytes that are not in the page cache (mincore(2) tells), in reads
  /// of 64 KiB or more: a load after a restart finds its checkpoint on the disk, and reading it
  /// through the page cache first allocates a page for every 4 KiB and then copies it. On
  /// this project's VM, `dd` read 2.5 GiB from a dropped cache in 8.3-8.9 s through the page
  /// cache and in 3.2-5.7 s with O_DIRECT. Bytes already cached are read from the cache.
  bool direct_reads = true;
  /// Chunks a load reads at once (`reads_in_flight()`), each on a worker that then verifies
  /// and copies it while the others wait for the disk; a worker reading with O_DIRECT holds a
  /// 4 MiB buffer during the load. One read per core leaves a disk with a deep queue (NVMe, a
  /// cloud volume) idle between requests; docs/performance.md has the figures.
  unsigned reads_in_flight = 16;
  /// O_DIRECT writes of 1 MiB a writer keeps in flight (detail/write_queue.hpp), from as many
  /// buffers of its own plus the one it fills; 1 writes on the caller's thread, one at a time.
  unsigned writes_in_flight = 32;
};

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
          dirs_(std::move(o.dirs_)), pending_(std::move(o.pending_)), position_(o.position_), direct_(o.direct_),
          depth_(o.depth_), queue_(std::move(o.queue_)), block_(std::exchange(o.block_, nullptr)), filled_(o.filled_),
          allocated_(o.allocated_), preallocate_(o.preallocate_) {}
    writer& operator=(writer&& o) noexcept {
      if (this != &o) {
        discard();
        fd_ = std::exchange(o.fd_, -1);
        temp_ = std::exchange(o.temp_, {});  // empty: the moved-from writer must not unlink it
        final_ = std::move(o.final_);
        dirs_ = std::move(o.dirs_);
        pending_ = std::move(o.pending_);
        position_ = o.position_;
        direct_ = o.direct_;
        depth_ = o.depth_;
        queue_ = std::move(o.queue_);
        block_ = std::exchange(o.block_, nullptr);
        filled_ = o.filled_;
        allocated_ = o.allocated_;
        preallocate_ = o.preallocate_;
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
      if (direct_) {
        write_direct(bytes);
        return;
      }
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
      trim();
      if (::fsync(fd_) != 0) throw detail::posix_error("fsync", temp_.string(), errno);
    }
    /// Renames the file to its final name and makes the rename durable.
    void publish() {
      flush();
      trim();
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

    /// True while the file is written with O_DIRECT (posix_options::direct_writes, on a file
    /// system that takes it): false once the last partial block went through the page cache.
    bool writes_direct() const noexcept { return direct_; }

   private:
    friend class posix;
    static constexpr std::size_t small_write = std::size_t{64} * 1024, pending_bytes = std::size_t{1} << 20;
    /// O_DIRECT writes whole blocks of this many bytes from a buffer aligned to it, at file
    /// positions that are multiples of it (4 KiB: every Linux file system's and disk's limit).
    static constexpr std::size_t direct_alignment = detail::write_queue::alignment;
    /// The O_DIRECT buffers, each one write. fio on this project's VM wrote and read 1 GiB
    /// with 16 requests in flight fastest in blocks of 1 MiB (4 MiB ones: 10-15 % slower).
    static constexpr std::size_t direct_buffer_bytes = std::size_t{1} << 20;
    /// File space is allocated ahead of the writes (fallocate) in steps of a quarter of the file
    /// so far, at least the writes in flight and at most this: ext4 runs O_DIRECT writes at once
    /// only where they overwrite allocated blocks, and serialises the ones that extend the file.
    /// What is allocated past the end is cut off by sync.
    static constexpr std::uint64_t most_allocated_ahead = std::uint64_t{1} << 30;

    detail::write_queue& queue() {
      if (!queue_) queue_ = std::make_unique<detail::write_queue>(fd_, temp_.string(), depth_, direct_buffer_bytes);
      return *queue_;
    }

    /// Appends through the O_DIRECT buffers, handing each to the write queue as it fills. A
    /// caller's buffer that is itself aligned (pinned staging memory is) is written from in place.
    void write_direct(std::span<const std::byte> bytes) {
      while (!bytes.empty() && direct_) {
        if (filled_ == 0 && reinterpret_cast<std::uintptr_t>(bytes.data()) % direct_alignment == 0 &&
            bytes.size() >= direct_alignment) {
          bytes = bytes.subspan(write_in_place(bytes.first(bytes.size() / direct_alignment * direct_alignment)));
          continue;
        }
        if (block_ == nullptr) block_ = queue().acquire();
        const auto n = std::min(direct_buffer_bytes - filled_, bytes.size());
        std::memcpy(block_ + filled_, bytes.data(), n);
        filled_ += n;
        bytes = bytes.subspan(n);
        if (filled_ == direct_buffer_bytes) {
          allocate(position_ + filled_);
          auto* full = std::exchange(block_, nullptr);
          queue().submit({full, filled_}, position_, full);
          position_ += std::exchange(filled_, 0);
          if (queue().refused()) stop_direct();
        }
      }
      if (!bytes.empty()) write(bytes);  // the file system refused O_DIRECT: through the page cache
    }
    /// Writes whole blocks of the caller's from where they are, several at once, and waits for
    /// them: the caller may reuse its buffer when write() returns. Returns how many bytes it
    /// wrote: fewer when the file system refused O_DIRECT, which ends direct writing.
    std::size_t write_in_place(std::span<const std::byte> blocks) {
      allocate(position_ + blocks.size());
      std::size_t at = 0;
      for (; at < blocks.size() && !queue().refused(); at += direct_buffer_bytes)
        queue().submit(blocks.subspan(at, std::min(direct_buffer_bytes, blocks.size() - at)), position_ + at);
      at = std::min(at, blocks.size());
      queue().wait_all();
      position_ += at;
      if (queue().refused()) stop_direct();
      return at;
    }
    /// Allocates file space up to `end` and beyond, so that the writes in flight overwrite
    /// allocated blocks (see most_allocated_ahead). Where the file system cannot (no fallocate, or no
    /// room for the step ahead), the writes extend the file as they go, one at a time.
    void allocate(std::uint64_t end) {
      if (!preallocate_ || end <= allocated_ || depth_ < 2) return;
      const auto in_flight = std::min(std::uint64_t{depth_} * direct_buffer_bytes, most_allocated_ahead);
      const auto step = std::clamp(end / 4, in_flight, most_allocated_ahead);
      const auto until = (end + step + direct_alignment - 1) / direct_alignment * direct_alignment;
      if (::fallocate(fd_, 0, static_cast<off_t>(allocated_), static_cast<off_t>(until - allocated_)) != 0) {
        preallocate_ = false;
        return;
      }
      allocated_ = until;
    }
    /// Cuts off the space allocate() reserved past the last byte written.
    void trim() {
      if (allocated_ <= position_) return;
      if (::ftruncate(fd_, static_cast<off_t>(position_)) != 0) throw detail::posix_error("truncate", temp_.string(), errno);
      allocated_ = position_;
    }
    /// Waits for the writes in flight, then clears O_DIRECT on the descriptor: what is written
    /// from now on goes through the page cache, at the position the queued writes reached.
    void stop_direct() {
      if (queue_) queue_->wait_all();
      direct_ = false;
      const int flags = ::fcntl(fd_, F_GETFL);
      if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0)
        throw detail::posix_error("fcntl (clear O_DIRECT)", temp_.string(), errno);
      if (::lseek(fd_, static_cast<off_t>(position_), SEEK_SET) < 0) throw detail::posix_error("seek", temp_.string(), errno);
    }

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
      if (direct_) {
        // Whole blocks with O_DIRECT; the last partial block through the page cache, which ends
        // direct writing (the file is complete: sync and publish are all that is left).
        const auto whole = filled_ / direct_alignment * direct_alignment, tail = filled_ - whole;
        if (whole > 0) {  // the last write: extending the file, it need not be allocated ahead
          queue().submit({block_, whole}, position_);
          position_ += whole;
        }
        stop_direct();  // waits for every write, this one too
        if (tail > 0) write_all({block_ + whole, tail});
        if (block_ != nullptr) queue_->release(std::exchange(block_, nullptr));
        filled_ = 0;
        return;
      }
      if (pending_.empty()) return;
      struct clear_after {  // even when the write fails: a failed file is discarded, never retried
        std::vector<std::byte>& bytes;
        ~clear_after() { bytes.clear(); }
      } guard{pending_};
      write_all(pending_);
    }

    writer(int fd, std::filesystem::path temp, std::filesystem::path final_path, std::vector<std::filesystem::path> dirs,
           bool direct, unsigned depth)
        : fd_(fd), temp_(std::move(temp)), final_(std::move(final_path)), dirs_(std::move(dirs)), direct_(direct),
          depth_(std::max(depth, 1u)) {}
    void discard() noexcept {
      queue_.reset();  // waits for the writes in flight: they use the descriptor and the buffers
      block_ = nullptr;
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      if (!temp_.empty()) ::unlink(temp_.c_str());
      temp_.clear();
    }
    int fd_ = -1;
    std::filesystem::path temp_, final_;
    std::vector<std::filesystem::path> dirs_;  // directories whose entries changed when creating parents
    std::vector<std::byte> pending_;           // small writes not yet written (see write)
    std::uint64_t position_ = 0;               // bytes written, or handed to the write queue, so far
    bool direct_ = false;                      // the descriptor has O_DIRECT (see write_direct)
    unsigned depth_ = 1;                       // O_DIRECT writes in flight, at most
    std::unique_ptr<detail::write_queue> queue_;  // the O_DIRECT writes and their buffers, on first use
    std::byte* block_ = nullptr;                  // the O_DIRECT buffer being filled (the queue's)
    std::size_t filled_ = 0;                      // bytes of block_ not yet written
    std::uint64_t allocated_ = 0;                 // file space allocated ahead (see allocate)
    bool preallocate_ = true;                     // until fallocate fails
  };

  /// A storage rooted at `root` (created on the first write).
  posix(std::filesystem::path root, posix_options options = {})  // NOLINT: implicit on purpose
      : root_(std::move(root)), options_(options) {}
  posix(const char* root, posix_options options = {}) : root_(root), options_(options) {}         // NOLINT
  posix(const std::string& root, posix_options options = {}) : root_(root), options_(options) {}  // NOLINT

  const std::filesystem::path& root() const noexcept { return root_; }
  const posix_options& options() const noexcept { return options_; }
  /// See posix_options::reads_in_flight.
  unsigned reads_in_flight() const noexcept { return options_.reads_in_flight; }

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
    // O_DIRECT is set after the open, not passed to it: a file system without it fails such an
    // open only after creating the file, and the file would be left behind.
    bool direct = false;
    if (options_.direct_writes) {
      const int flags = ::fcntl(fd, F_GETFL);
      direct = flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
    }
    return writer(fd, std::move(temp), final_path, std::move(dirs), direct, options_.writes_in_flight);
  }

  /// One file open for reading: several reads without reopening it (open_reader). One reader
  /// serves one thread at a time; several readers of one file may read at once.
  class reader {
   public:
    reader(int fd, std::filesystem::path p, bool direct = false) noexcept : fd_(fd), path_(std::move(p)), direct_(direct) {}
    reader(reader&& o) noexcept
        : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), direct_(o.direct_),
          direct_fd_(std::exchange(o.direct_fd_, -1)), map_(std::exchange(o.map_, nullptr)),
          map_bytes_(std::exchange(o.map_bytes_, 0)), block_(std::move(o.block_)), held_(std::exchange(o.held_, {})),
          hint_(o.hint_), hint_cached_(o.hint_cached_), pages_(std::move(o.pages_)) {}
    reader& operator=(reader&&) = delete;
    ~reader() {
      if (fd_ >= 0) ::close(fd_);
      if (direct_fd_ >= 0) ::close(direct_fd_);
      if (map_ != nullptr) ::munmap(map_, map_bytes_);
    }

    /// Reads exactly `out.size()` bytes at `offset`; a file too short is `corrupt` (truncated).
    void read(std::uint64_t offset, std::span<std::byte> out) const {
      if (direct_ && read_direct(offset, out)) return;
      // The kernel's copy out of the page cache is 3x slower when the buffer lies just past
      // the file offset modulo 4 KiB, as a std::vector's does (detail/page_copy.hpp): such
      // reads are bounced. A short file is reported for the whole range asked for.
      detail::read_avoiding_slow_copy(offset, out, [&](std::uint64_t at, std::span<std::byte> part) {
        read_exactly(at, part, offset, out.size());
      });
    }

    /// Says that the next reads cover `bytes` bytes at `offset`, in order (a load reads a chunk
    /// in pieces of 256 KiB, hashing each while it is in the CPU's cache). With O_DIRECT, the
    /// reader then reads up to 4 MiB of that range at once and hands the pieces out of its
    /// buffer: the disk reads large requests at twice the speed of 256 KiB ones (a 2.5 GiB
    /// state, from a dropped cache, on this project's VM: 4.1 s in 256 KiB reads on two
    /// threads, 2.3 s in 8 MiB ones on one), and the range keeps it from reading past what
    /// the load wants.
    void will_read(std::uint64_t offset, std::uint64_t bytes) const noexcept {
      hint_ = {offset, offset + bytes};
      hint_cached_ = residency::unknown;
    }

    /// True while reads of bytes not in the page cache use O_DIRECT (posix_options::direct_reads,
    /// on a file system that takes it).
    bool reads_direct() const noexcept { return direct_; }

   private:
    static constexpr std::size_t direct_alignment = 4096;
    /// Smaller reads (headers, footers, values) go through the page cache, unless they are
    /// pieces of a larger range announced with will_read.
    static constexpr std::size_t direct_min = std::size_t{64} * 1024;
    /// The most bytes one O_DIRECT read brings that were asked for (see will_read). The aligned
    /// buffer it lands in holds that and the partial block at its start.
    static constexpr std::size_t direct_read_bytes = std::size_t{4} << 20;
    static constexpr std::size_t direct_buffer_bytes = direct_read_bytes + direct_alignment;
    static constexpr std::uint64_t align(std::uint64_t bytes) noexcept {
      return (bytes + direct_alignment - 1) / direct_alignment * direct_alignment;
    }
    struct aligned_delete {
      void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t{direct_alignment}); }
    };

    /// Whether every page of the range is in the page cache (so a read through it costs a
    /// copy, not a trip to the disk). Asked with mincore(2) on a mapping of the file that is
    /// never touched. Where the kernel will not say (it reports every page resident for files
    /// the caller may not write to), reads go through the page cache as without O_DIRECT.
    bool cached(std::uint64_t offset, std::size_t bytes) const {
      if (map_ == nullptr) {
        struct stat st{};
        if (::fstat(fd_, &st) != 0 || st.st_size <= 0) return true;
        void* m = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd_, 0);
        if (m == MAP_FAILED) {  // no mapping, no residency: the page cache it is
          direct_ = false;
          return true;
        }
        map_ = m;
        map_bytes_ = static_cast<std::size_t>(st.st_size);
      }
      if (offset >= map_bytes_ || bytes > map_bytes_ - offset) return true;  // past the end: the read reports it
      static const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
      const auto first = offset / page * page;
      pages_.resize((offset + bytes - first + page - 1) / page);
      if (::mincore(static_cast<std::byte*>(map_) + first, offset + bytes - first, pages_.data()) != 0) return true;
      return std::all_of(pages_.begin(), pages_.end(), [](unsigned char p) { return (p & 1) != 0; });
    }

    /// Reads `out` at `offset` with O_DIRECT, unless its bytes are in the page cache: from the
    /// aligned buffer where an earlier read already brought them, or by reading into it the
    /// whole blocks that hold them (and, within the range will_read announced, up to 4 MiB
    /// ahead), then copying them out. Returns false, having read nothing, when the bytes are
    /// cached or the file system refuses O_DIRECT (which ends direct reading).
    bool read_direct(std::uint64_t offset, std::span<std::byte> out) const {
      if (out.empty()) return false;
      const auto end = offset + out.size();
      if (offset >= held_.first && end <= held_.second) {
        copy_out(offset, out);
        return true;
      }
      const bool announced = offset >= hint_.first && end <= hint_.second;
      if ((announced ? hint_.second - hint_.first : out.size()) < direct_min) return false;
      if (announced) {
        // Asked once for the whole announced range: a run of many small chunks all in the page
        // cache (a load just after the save) then costs no mincore per chunk, and goes through
        // the cache until the next will_read. Where only part of it is cached, each read asks
        // for its own bytes, as reads outside a range do.
        if (hint_cached_ == residency::unknown)
          hint_cached_ = cached(hint_.first, hint_.second - hint_.first) ? residency::all : residency::not_all;
        if (hint_cached_ == residency::all) return false;
      }
      if (cached(offset, out.size())) return false;
      if (direct_fd_ < 0) {
        direct_fd_ = ::open(path_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (direct_fd_ < 0) {
          direct_ = false;
          return false;
        }
        block_.reset(new (std::align_val_t{direct_alignment}) std::byte[direct_buffer_bytes]);  // uninitialised
      }
      auto at = offset / direct_alignment * direct_alignment;
      for (bool first = true; at < end; first = false) {  // one read, unless `out` is over 4 MiB
        const auto until = announced ? hint_.second : end;  // read ahead only in the announced range
        // 4 MiB of the bytes wanted, and the partial block before them; so reads of a chunk in
        // pieces that divide 4 MiB start each read where the last one ended.
        const auto want = std::min(align(std::max(offset, at) - at + direct_read_bytes), align(until - at));
        std::size_t got = 0;  // fewer than `want` only at the end of the file
        while (got < want) {
          const ssize_t n = ::pread(direct_fd_, block_.get() + got, want - got, static_cast<off_t>(at + got));
          if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EINVAL && first && got == 0) {
              direct_ = false;  // refused before anything was copied out: the page cache instead
              return false;
            }
            throw detail::posix_error("read", path_.string(), errno);
          }
          got += static_cast<std::size_t>(n);
          if (n == 0 || got % direct_alignment != 0) break;  // the end of the file
        }
        held_ = {at, at + got};
        const auto to = std::min<std::uint64_t>(at + want, end);
        if (at + got < to)
          throw error(error_kind::corrupt, path_.string() + " is truncated: needed bytes [" + std::to_string(offset) + ", " +
                                               std::to_string(end) + "), the file ends at " + std::to_string(at + got));
        const auto from = std::max(at, offset);
        copy_out(from, out.subspan(from - offset, to - from));
        at += want;
      }
      return true;
    }
    /// Copies the held bytes at file offset `offset` into `out`.
    void copy_out(std::uint64_t offset, std::span<std::byte> out) const noexcept {
      detail::copy_avoiding_slow_copy(out.data(), block_.get() + (offset - held_.first), out.size());
    }

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
    // O_DIRECT reads: set up on first use, so a reader of headers and footers costs nothing more.
    mutable bool direct_ = false;
    mutable int direct_fd_ = -1;
    mutable void* map_ = nullptr;  // the file mapped for mincore, never touched
    mutable std::size_t map_bytes_ = 0;
    mutable std::unique_ptr<std::byte[], aligned_delete> block_;
    mutable std::pair<std::uint64_t, std::uint64_t> held_{0, 0};  // the file's bytes in block_ [first, second)
    mutable std::pair<std::uint64_t, std::uint64_t> hint_{0, 0};  // the range will_read announced
    enum class residency : std::uint8_t { unknown, all, not_all };
    mutable residency hint_cached_ = residency::unknown;  // of hint_'s pages, when first asked
    mutable std::vector<unsigned char> pages_;                    // mincore's answer
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
    return reader(fd, std::move(p), options_.direct_reads);
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
  posix_options options_;
};

}  // namespace ckpt
