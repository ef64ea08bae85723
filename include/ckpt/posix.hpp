#pragma once
/// @file posix.hpp
/// `ckpt::posix`: the default Storage, a directory on a local or shared POSIX file system.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
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
#include "detail/table_memory.hpp"
#include "error.hpp"
#include "impl/decl.hpp"

namespace ckpt {

namespace detail {
class write_queue;  // detail/write_queue.hpp: the O_DIRECT writes in flight

/// fsync a directory so that the entries created or renamed in it survive a power cut.
CKPT_DECL void fsync_dir(const std::filesystem::path& dir);

/// Creates `dir` and its missing parents; returns the parents whose entries changed (to fsync).
CKPT_DECL std::vector<std::filesystem::path> make_dirs(const std::filesystem::path& dir);
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
  /// The bytes come into the reader's aligned buffer (in huge pages) in windows of 4 MiB, one
  /// request each, and are copied out (read_in_place reads some straight into the caller's memory).
  bool direct_reads = true;
  /// With O_DIRECT, read chunks of 1 MiB or more straight into the caller's memory where it
  /// lies as far into its page as the chunk into its 4 KiB block in the file (a tensor that
  /// starts at a page, a load's own buffers, a 64-byte aligned tensor loaded into memory that
  /// lies as the saved one did: a save places large chunks so), with no copy; the partial pages
  /// at either end still come through the reader's buffer. Off by default: a request into memory
  /// in 4 KiB pages carries at most `max_segments` runs of physically contiguous memory (254 on
  /// this project's VM), so the disk received a tensor's chunks as requests of 1-4 MiB, two for a
  /// 4 MiB chunk with its partial blocks, and cold loads took longer than through the buffer's
  /// windows (docs/performance.md, "Cold loads through the reader's buffer, in windows of
  /// 4 MiB"). Worth trying where the memory is in huge pages and the CPU bounds a load.
  bool read_in_place = false;
  /// With O_DIRECT, also write from where they are the whole pages of memory that is not
  /// page-aligned, where the file position lies as far into its block as the bytes into their
  /// page (a large raw chunk, placed so by the save), copying only the partial pages at either
  /// end. Page-aligned memory is always written from where it is. Off by default: on this
  /// project's VM the disk moved memory that two threads had filled 20-30 % slower than memory
  /// filled by one thread, or the writer's own buffers, and a save of such 64-byte aligned
  /// tensors took longer in place than with the copy (docs/performance.md, "Large chunks placed
  /// for their memory").
  bool write_unaligned_in_place = false;
  /// Chunks a load reads at once (`reads_in_flight()`), each on a worker that then verifies
  /// and copies it while the others wait for the disk; a worker reading with O_DIRECT holds a
  /// 4 MiB buffer during the load. One read per core leaves a disk with a deep queue (NVMe, a
  /// cloud volume) idle between requests; docs/performance.md has the figures.
  unsigned reads_in_flight = 16;
  /// O_DIRECT writes of 1 MiB a writer keeps in flight (detail/write_queue.hpp), from as many
  /// buffers of its own plus the one it fills (one block in huge pages, where the kernel gives
  /// them); 1 writes on the caller's thread, one at a time.
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
  /// `remove` and `remove_all` are unlinks, which touch no state of this object: retention may
  /// delete old tags in the background while the next save writes.
  static constexpr bool background_removal = true;

  /// Writes one file; see the class comment for the protocol.
  class writer {
   public:
    writer(writer&& o) noexcept;
    writer& operator=(writer&& o) noexcept;
    writer(const writer&) = delete;
    writer& operator=(const writer&) = delete;
    ~writer();

    /// Appends bytes (handles short writes and EINTR). Writes under 64 KiB are gathered into
    /// one buffer of up to 1 MiB first: a state of thousands of small tensors would otherwise
    /// make a system call per chunk, and ext4 zeroes the rest of a new page-cache folio on
    /// every small write into it (a fifth of the time of saving 10 000 tensors of 1 KiB).
    /// With O_DIRECT, page-aligned bytes go to the disk from where they are, with no copy into
    /// the writer's aligned buffer, as do the whole pages of other large writes where the file
    /// position lies as far into its 4 KiB block as the bytes into their page (a save places
    /// large raw chunks so: detail/format.hpp, placed_from) and posix_options asks for it
    /// (write_unaligned_in_place); the rest is copied.
    void write(std::span<const std::byte> bytes);
    /// The same as `write(bytes)`, for bytes the caller keeps valid and unchanged until `sync`
    /// (concepts.hpp, retains_writes): with O_DIRECT, the writes from where they are stay in
    /// flight when it returns, and the next bytes are queued behind them at once; `sync` (or the
    /// writer's destruction) waits for them.
    ///
    /// @code
    /// w.write_retained(tensor_bytes);  // tensor_bytes untouched until:
    /// w.sync();
    /// @endcode
    void write_retained(std::span<const std::byte> bytes);
    /// Says that the file will hold at least `bytes` bytes (concepts.hpp, reserves_space): with
    /// O_DIRECT, the space is allocated now, in one step, instead of ahead of the writes as they
    /// go: ext4 waits for the writes in flight before each allocation, and a file written to its
    /// reserved size has nothing past its end to cut off (docs/performance.md, "Saves waited for
    /// their own file space"). Otherwise nothing.
    ///
    /// @code
    /// auto w = storage.create("global_step5/model_00.ckpt");
    /// w.reserve(header.size() + tensor_bytes.size());
    /// w.write(header);
    /// w.write(tensor_bytes);
    /// @endcode
    void reserve(std::uint64_t bytes);
    /// Makes the bytes durable under the temporary name.
    void sync();
    /// Renames the file to its final name and makes the rename durable.
    void publish();

    /// True while the file is written with O_DIRECT (posix_options::direct_writes, on a file
    /// system that takes it): false once the last partial block went through the page cache.
    bool writes_direct() const noexcept { return direct_; }

   private:
    friend class posix;
    static constexpr std::size_t small_write = std::size_t{64} * 1024, pending_bytes = std::size_t{1} << 20;
    /// O_DIRECT writes whole blocks of this many bytes from a buffer aligned to it, at file
    /// positions that are multiples of it (4 KiB: every Linux file system's and disk's limit).
    static constexpr std::size_t direct_alignment = 4096;  // write_queue::alignment (impl/posix.ipp checks)
    /// The O_DIRECT buffers, each one write. fio on this project's VM wrote and read 1 GiB
    /// with 16 requests in flight fastest in blocks of 1 MiB (4 MiB ones: 10-15 % slower).
    static constexpr std::size_t direct_buffer_bytes = std::size_t{1} << 20;
    /// File space is allocated ahead of the writes (fallocate) in steps of a quarter of the file
    /// so far, at least the writes in flight and at most this: ext4 runs O_DIRECT writes at once
    /// only where they overwrite allocated blocks, and serialises the ones that extend the file.
    /// What is allocated past the end is cut off by sync. A reserve()d file is allocated once.
    static constexpr std::uint64_t most_allocated_ahead = std::uint64_t{1} << 30;

    detail::write_queue& queue();

    /// Appends through the O_DIRECT buffers, handing each to the write queue as it fills. A
    /// caller's buffer that is itself aligned (pinned staging memory is) is written from in place.
    /// `retained`: the caller keeps the bytes until sync (write_retained).
    void write_direct(std::span<const std::byte> bytes, bool retained);
    /// Hands the buffer being filled (whole blocks) to the write queue, which gives it back once
    /// written.
    void submit_buffer();
    /// Writes whole blocks of the caller's from where they are, several at once, and waits for
    /// them unless the caller keeps them until sync (`retained`): otherwise the caller may reuse
    /// its buffer when write() returns. Returns how many bytes it queued: fewer when the file
    /// system refused O_DIRECT, which ends direct writing.
    std::size_t write_in_place(std::span<const std::byte> blocks, bool retained);
    /// Allocates file space up to `end` and beyond, so that the writes in flight overwrite
    /// allocated blocks (see most_allocated_ahead). Where the file system cannot (no fallocate, or no
    /// room for the step ahead), the writes extend the file as they go, one at a time.
    void allocate(std::uint64_t end);
    /// fallocate from allocated_ up to `until`; on failure, stops allocating ahead.
    void allocate_to(std::uint64_t until);
    /// Cuts off the space allocate() reserved past the last byte written.
    void trim();
    /// Waits for the writes in flight, then clears O_DIRECT on the descriptor: what is written
    /// from now on goes through the page cache, at the position the queued writes reached.
    void stop_direct();

    void write_all(std::span<const std::byte> bytes);
    void write_exactly(std::span<const std::byte> bytes);
    void flush();

    writer(int fd, std::filesystem::path temp, std::filesystem::path final_path, std::vector<std::filesystem::path> dirs,
           bool direct, unsigned depth, bool unaligned_in_place);
    void discard() noexcept;
    int fd_ = -1;
    std::filesystem::path temp_, final_;
    std::vector<std::filesystem::path> dirs_;  // directories whose entries changed when creating parents
    std::vector<std::byte> pending_;           // small writes not yet written (see write)
    std::uint64_t position_ = 0;               // bytes written, or handed to the write queue, so far
    bool direct_ = false;                      // the descriptor has O_DIRECT (see write_direct)
    unsigned depth_ = 1;                       // O_DIRECT writes in flight, at most
    bool unaligned_in_place_ = false;          // posix_options::write_unaligned_in_place
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
  writer_lock lock_writer(bool wait);

  /// The name of the lock file in the root (informative in docs/format.md; readers ignore it).
  static constexpr std::string_view lock_file = ".ckpt_lock";

  /// Opens a new temporary file that `publish()` will rename to `key`.
  writer create(std::string_view key);

  /// One file open for reading: several reads without reopening it (open_reader). One reader
  /// serves one thread at a time; several readers of one file may read at once.
  class reader {
   public:
    reader(int fd, std::filesystem::path p, bool direct = false, bool in_place = false) noexcept
        : fd_(fd), path_(std::move(p)), direct_(direct), in_place_(in_place) {
      // No readahead on the descriptor that reads through the page cache while bytes not
      // cached come with O_DIRECT: what the kernel read ahead after a shard file's header would
      // be cached by the time the first chunks are asked for, each read of those through the
      // cache would have it read further ahead, and a whole run of small chunks would pass
      // through the page cache. Large reads through the cache still go to the disk as large
      // requests. use_page_cache() turns readahead back on.
      if (direct_) (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
    }
    reader(reader&& o) noexcept
        : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), direct_(o.direct_), in_place_(o.in_place_),
          direct_fd_(std::exchange(o.direct_fd_, -1)), map_(std::exchange(o.map_, nullptr)),
          map_bytes_(std::exchange(o.map_bytes_, 0)), block_(std::move(o.block_)), held_(std::exchange(o.held_, {})),
          hint_(o.hint_), hint_cached_(o.hint_cached_), pages_(std::move(o.pages_)) {}
    reader& operator=(reader&&) = delete;
    ~reader();

    /// Reads exactly `out.size()` bytes at `offset`; a file too short is `corrupt` (truncated).
    void read(std::uint64_t offset, std::span<std::byte> out) const;

    /// Says that the next reads cover `bytes` bytes at `offset`, in order (a load reads a chunk
    /// in pieces of 256 KiB, hashing each while it is in the CPU's cache, and a run of small
    /// chunks one after another). With O_DIRECT, the reader then reads that range in windows of
    /// 4 MiB, each from the block where the last one ended, one request each, and hands the
    /// pieces out of its buffer: the disk reads large requests at
    /// twice the speed of 256 KiB ones (a 2.5 GiB state, from a dropped cache, on this
    /// project's VM: 4.1 s in 256 KiB reads on two threads, 2.3 s in 8 MiB ones on one), and
    /// the range keeps it from reading past what the load wants. Through the page cache, reads
    /// under 64 KiB in the range are batched the same way (read_batched).
    void will_read(std::uint64_t offset, std::uint64_t bytes) const noexcept {
      hint_ = {offset, offset + bytes};
      hint_cached_ = residency::unknown;
    }

    /// True while reads of bytes not in the page cache use O_DIRECT (posix_options::direct_reads,
    /// on a file system that takes it).
    bool reads_direct() const noexcept { return direct_; }

    /// True when `read(offset, out)` will move the bytes from the disk straight into `out`, with
    /// no copy (concepts.hpp, reads_in_place): posix_options::read_in_place (off by default),
    /// O_DIRECT reads, `out` of 1 MiB or more, as many
    /// bytes into its memory page as `offset` is into its 4 KiB block, and the bytes not in the
    /// page cache. O_DIRECT needs page-aligned memory at block-aligned offsets: the whole pages
    /// of `out` are read straight into it, the partial pages at its ends through the reader's
    /// aligned buffer, in the same request. A save asked to (checkpointer_options::place_for_memory)
    /// places each large raw chunk of a tensor as far into a block as its bytes lay into their
    /// page (detail/format.hpp, placed_from), so a load into
    /// memory that lies the same way (PyTorch's 64-byte aligned tensors, 64 bytes into their
    /// first page, at save and at load) reads in place; others go through the reader's aligned
    /// buffer and one copy.
    ///
    /// @code
    /// if (r.reads_in_place(offset, out)) r.read(offset, out);  // O_DIRECT straight into out
    /// @endcode
    bool reads_in_place(std::uint64_t offset, std::span<const std::byte> out) const {
      return direct_ && in_place(offset, out) && !cached(offset, out.size());
    }

   private:
    /// From now on every read goes through the page cache, with the kernel's readahead back on
    /// (the constructor turns it off while O_DIRECT reads the bytes not cached).
    void use_page_cache() const noexcept {
      direct_ = false;
      (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_NORMAL);
    }
    static constexpr std::size_t direct_alignment = 4096;
    /// Whether the `bytes` at `offset` lie in the range will_read announced.
    bool in_announced(std::uint64_t offset, std::size_t bytes) const noexcept {
      return offset >= hint_.first && offset + bytes <= hint_.second;
    }
    /// Smaller reads (headers, footers, values) go through the page cache, unless they are
    /// pieces of a larger range announced with will_read.
    static constexpr std::size_t direct_min = std::size_t{64} * 1024;
    /// The most bytes one O_DIRECT read brings that were asked for (see will_read). The aligned
    /// buffer it lands in holds that and the partial block at its start.
    static constexpr std::size_t direct_read_bytes = std::size_t{4} << 20;
    static constexpr std::size_t direct_buffer_bytes = direct_read_bytes + direct_alignment;
    /// The aligned buffer holds the read area, then the two blocks an in-place read brings the
    /// partial pages at either end of `out` into (read_in_place). Its first 4 MiB are 2 MiB
    /// aligned and advised as transparent huge pages: a load of many small chunks has each of
    /// its workers fill a buffer of its own, and on a virtual machine the kernel's 1,024 page
    /// faults per buffer, each zeroing a page the host may have to back first, cost more than
    /// two huge ones. The blocks past them stay ordinary pages where the buffer is mapped
    /// afresh, so an in-place read (which touches only those) faults in no huge page. Freed, the
    /// buffer is kept for the next reader (detail::kept_io_memory).
    static constexpr std::size_t block_bytes = direct_buffer_bytes + 2 * direct_alignment;
    static constexpr std::uint64_t align(std::uint64_t bytes) noexcept {
      return (bytes + direct_alignment - 1) / direct_alignment * direct_alignment;
    }

    /// Whether every page of the range is in the page cache (so a read through it costs a
    /// copy, not a trip to the disk). Asked with mincore(2) on a mapping of the file that is
    /// never touched. Where the kernel will not say (it reports every page resident for files
    /// the caller may not write to), reads go through the page cache as without O_DIRECT.
    bool cached(std::uint64_t offset, std::size_t bytes) const;

    /// Reads `out` at `offset` with O_DIRECT, unless its bytes are in the page cache: reads into
    /// the aligned buffer the whole blocks that hold them (and, within the range will_read
    /// announced, up to 4 MiB ahead), then copies them out (`read` first copies out what an
    /// earlier read already brought there). Returns false, having read nothing, when the bytes are
    /// cached or the file system refuses O_DIRECT (which ends direct reading).
    bool read_direct(std::uint64_t offset, std::span<std::byte> out) const;
    /// Copies the held bytes at file offset `offset` into `out`.
    void copy_out(std::uint64_t offset, std::span<std::byte> out) const noexcept;

    /// Reads through the page cache smaller than this, inside a range will_read announced, are
    /// batched (read_batched), as O_DIRECT's small reads are; batching larger ones gained nothing
    /// (docs/performance.md, "Small chunks read through the page cache").
    static constexpr std::size_t batched_max = direct_min;
    /// Reads `out` at `offset` through the page cache together with what follows it in the
    /// announced range, up to 4 MiB, into the aligned buffer, and copies it out; `read` copies
    /// later reads of those bytes from there. A run of small chunks (a model's biases and norms, or
    /// the experts of a mixture of experts) read warm or from a file system without O_DIRECT (a
    /// memory tier's tmpfs) otherwise costs a system call per chunk. Returns false, having read
    /// nothing, for a read of `batched_max` or more, or one outside an announced range.
    bool read_batched(std::uint64_t offset, std::span<std::byte> out) const;

    /// Smaller reads into aligned memory still go through the aligned buffer, which reads 4 MiB
    /// ahead within an announced range: a disk moves 256 KiB requests at half the speed of 4 MiB
    /// ones (see will_read).
    static constexpr std::size_t in_place_min = std::size_t{1} << 20;
    /// Whether `out` and `offset` allow O_DIRECT reads straight into `out`: as far into a page
    /// as `offset` is into a block.
    bool in_place(std::uint64_t offset, std::span<const std::byte> out) const noexcept {
      return in_place_ && out.size() >= in_place_min &&
             offset % direct_alignment == reinterpret_cast<std::uintptr_t>(out.data()) % direct_alignment;
    }
    /// Reads `out` at `offset` with one O_DIRECT request: its whole pages straight into it, the
    /// blocks holding its partial pages at either end into the aligned buffer, then copied.
    /// Returns false, having read nothing, when the kernel refuses O_DIRECT into that memory
    /// (which ends reading in place, not O_DIRECT).
    bool read_in_place(std::uint64_t offset, std::span<std::byte> out) const;

    /// The `corrupt` error for a file that ends at `ends_at`, short of the bytes [first, end) asked for.
    error truncated(std::uint64_t first, std::uint64_t end, std::uint64_t ends_at) const;

    /// Reads `out` at `offset`, part of the caller's `wanted` bytes at `first` (for the message).
    void read_exactly(std::uint64_t offset, std::span<std::byte> out, std::uint64_t first, std::uint64_t wanted) const;

    int fd_;
    std::filesystem::path path_;
    // O_DIRECT reads: set up on first use, so a reader of headers and footers costs nothing more.
    mutable bool direct_ = false;
    mutable bool in_place_ = false;  // posix_options::read_in_place; false once the kernel refused O_DIRECT into the caller's memory
    mutable int direct_fd_ = -1;
    mutable void* map_ = nullptr;  // the file mapped for mincore, never touched
    mutable std::size_t map_bytes_ = 0;
    mutable detail::kept_io_buffer block_;
    mutable std::pair<std::uint64_t, std::uint64_t> held_{0, 0};  // the file's bytes in block_ [first, second)
    mutable std::pair<std::uint64_t, std::uint64_t> hint_{0, 0};  // the range will_read announced
    enum class residency : std::uint8_t { unknown, all, not_all };
    mutable residency hint_cached_ = residency::unknown;  // of hint_'s pages, when first asked
    mutable std::vector<unsigned char> pages_;                    // mincore's answer
  };

  /// Opens the file at `key` for reading; a missing file is `not_found`.
  reader open_reader(std::string_view key) const;

  /// Reads exactly `out.size()` bytes at `offset`; a file too short is `corrupt` (truncated).
  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const;

  /// Size of the file at `key`, or nothing when it does not exist.
  std::optional<std::uint64_t> size(std::string_view key) const;

  /// Names of the entries directly under `prefix` ("" for the root), sorted.
  std::vector<std::string> list(std::string_view prefix) const;

  /// Removes one file (nothing when it does not exist), durably.
  void remove(std::string_view key);

  /// Removes a directory tree (nothing when it does not exist), durably.
  void remove_all(std::string_view prefix);

  /// The path of `key`, for messages.
  std::string describe(std::string_view key) const { return path(key).string(); }

 private:
  std::filesystem::path path(std::string_view key) const { return key.empty() ? root_ : root_ / std::string(key); }
  std::filesystem::path root_;
  posix_options options_;
};

}  // namespace ckpt

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "impl/posix.ipp"
#endif
