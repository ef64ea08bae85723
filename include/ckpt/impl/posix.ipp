#pragma once
// The definitions of posix.hpp's functions and members.
// Header-only builds include this at the end of posix.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.

#include "../detail/page_copy.hpp"
#include "../detail/write_queue.hpp"

namespace ckpt {

namespace detail {

CKPT_DECL void fsync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw posix_error("open directory", dir.string(), errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) throw posix_error("fsync directory", dir.string(), err);
}

CKPT_DECL std::vector<std::filesystem::path> make_dirs(const std::filesystem::path& dir) {
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

CKPT_DECL posix::writer::writer(int fd, std::filesystem::path temp, std::filesystem::path final_path,
                                std::vector<std::filesystem::path> dirs, bool direct, unsigned depth, bool unaligned_in_place)
    : fd_(fd), temp_(std::move(temp)), final_(std::move(final_path)), dirs_(std::move(dirs)), direct_(direct),
      depth_(std::max(depth, 1u)), unaligned_in_place_(unaligned_in_place) {}

CKPT_DECL posix::writer::writer(writer&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), temp_(std::exchange(o.temp_, {})), final_(std::move(o.final_)),
      dirs_(std::move(o.dirs_)), pending_(std::move(o.pending_)), position_(o.position_), direct_(o.direct_),
      depth_(o.depth_), unaligned_in_place_(o.unaligned_in_place_), queue_(std::move(o.queue_)), block_(std::exchange(o.block_, nullptr)), filled_(o.filled_),
      allocated_(o.allocated_), preallocate_(o.preallocate_) {}

CKPT_DECL posix::writer& posix::writer::operator=(writer&& o) noexcept {
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
    unaligned_in_place_ = o.unaligned_in_place_;
    queue_ = std::move(o.queue_);
    block_ = std::exchange(o.block_, nullptr);
    filled_ = o.filled_;
    allocated_ = o.allocated_;
    preallocate_ = o.preallocate_;
  }
  return *this;
}

CKPT_DECL posix::writer::~writer() {
  discard();
}

CKPT_DECL void posix::writer::write_retained(std::span<const std::byte> bytes) {
  if (direct_) {
    write_direct(bytes, true);
    return;
  }
  write(bytes);
}

CKPT_DECL void posix::writer::write(std::span<const std::byte> bytes) {
  if (direct_) {
    write_direct(bytes, false);
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

CKPT_DECL void posix::writer::sync() {
  flush();
  trim();
  if (::fsync(fd_) != 0) throw detail::posix_error("fsync", temp_.string(), errno);
}

CKPT_DECL void posix::writer::publish() {
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

CKPT_DECL detail::write_queue& posix::writer::queue() {
  static_assert(direct_alignment == detail::write_queue::alignment);
  if (!queue_) queue_ = std::make_unique<detail::write_queue>(fd_, temp_.string(), depth_, direct_buffer_bytes);
  return *queue_;
}

CKPT_DECL void posix::writer::write_direct(std::span<const std::byte> bytes, bool retained) {
  // Memory that is not page-aligned is copied, unless asked otherwise (write_unaligned_in_place),
  // even where the copying brings the rest of it to a page boundary (as it does for a chunk
  // placed for its memory): see posix_options.
  const bool may_write_in_place =
      unaligned_in_place_ || reinterpret_cast<std::uintptr_t>(bytes.data()) % direct_alignment == 0;
  while (!bytes.empty() && direct_) {
    if (may_write_in_place && reinterpret_cast<std::uintptr_t>(bytes.data()) % direct_alignment == 0 &&
        bytes.size() >= direct_alignment) {
      if (filled_ == 0) {
        bytes = bytes.subspan(write_in_place(bytes.first(bytes.size() / direct_alignment * direct_alignment), retained));
        continue;
      }
      // Aligned bytes after whole blocks in the buffer (a chunk after the padded tail of the one
      // before): the buffer goes out as a shorter write, so that the bytes need no copy.
      if (filled_ % direct_alignment == 0 && bytes.size() >= direct_buffer_bytes) {
        submit_buffer();
        continue;
      }
    }
    if (block_ == nullptr) block_ = queue().acquire();
    auto n = std::min(direct_buffer_bytes - filled_, bytes.size());
    // Bytes as far into their page as the file position is into its block (a large chunk placed
    // for its memory, detail/format.hpp), where asked to (posix_options::write_unaligned_in_place):
    // copied only up to the block boundary, from where they are page-aligned and go out from
    // where they are (above).
    const auto in_page = reinterpret_cast<std::uintptr_t>(bytes.data()) % direct_alignment;
    if (unaligned_in_place_ && in_page != 0 && (position_ + filled_) % direct_alignment == in_page &&
        bytes.size() >= direct_alignment - in_page + direct_buffer_bytes)
      n = std::min<std::size_t>(n, direct_alignment - in_page);
    std::memcpy(block_ + filled_, bytes.data(), n);
    filled_ += n;
    bytes = bytes.subspan(n);
    if (filled_ == direct_buffer_bytes) submit_buffer();
  }
  if (!bytes.empty()) write(bytes);  // the file system refused O_DIRECT: through the page cache
}

CKPT_DECL void posix::writer::submit_buffer() {
  allocate(position_ + filled_);
  auto* full = std::exchange(block_, nullptr);
  queue().submit({full, filled_}, position_, full);
  position_ += std::exchange(filled_, 0);
  if (queue().refused()) stop_direct();
}

CKPT_DECL std::size_t posix::writer::write_in_place(std::span<const std::byte> blocks, bool retained) {
  allocate(position_ + blocks.size());
  std::size_t at = 0;
  for (; at < blocks.size() && !queue().refused(); at += direct_buffer_bytes)
    queue().submit(blocks.subspan(at, std::min(direct_buffer_bytes, blocks.size() - at)), position_ + at);
  at = std::min(at, blocks.size());
  if (!retained || queue().refused()) queue().wait_all();
  position_ += at;
  if (queue().refused()) stop_direct();
  return at;
}

CKPT_DECL void posix::writer::reserve(std::uint64_t bytes) {
  // Exactly `bytes`, not rounded up to a block: a file that ends where it was reserved has
  // nothing past its end to cut off.
  if (direct_ && preallocate_ && bytes > allocated_) allocate_to(bytes);
}

CKPT_DECL void posix::writer::allocate_to(std::uint64_t until) {
  if (::fallocate(fd_, 0, static_cast<off_t>(allocated_), static_cast<off_t>(until - allocated_)) == 0) {
    allocated_ = until;
    return;
  }
  // A failed fallocate (no room, or none on this file system) may still have allocated part of
  // the range and moved the file's end: sync cuts the file back to what was written.
  preallocate_ = false;
  allocated_ = std::numeric_limits<std::uint64_t>::max();
}

CKPT_DECL void posix::writer::allocate(std::uint64_t end) {
  if (!preallocate_ || end <= allocated_ || depth_ < 2) return;
  const auto in_flight = std::min(std::uint64_t{depth_} * direct_buffer_bytes, most_allocated_ahead);
  const auto step = std::clamp(end / 4, in_flight, most_allocated_ahead);
  allocate_to((end + step + direct_alignment - 1) / direct_alignment * direct_alignment);
}

CKPT_DECL void posix::writer::trim() {
  if (allocated_ <= position_) return;
  if (::ftruncate(fd_, static_cast<off_t>(position_)) != 0) throw detail::posix_error("truncate", temp_.string(), errno);
  allocated_ = position_;
}

CKPT_DECL void posix::writer::stop_direct() {
  if (queue_) queue_->wait_all();
  direct_ = false;
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0)
    throw detail::posix_error("fcntl (clear O_DIRECT)", temp_.string(), errno);
  if (::lseek(fd_, static_cast<off_t>(position_), SEEK_SET) < 0) throw detail::posix_error("seek", temp_.string(), errno);
}

CKPT_DECL void posix::writer::write_all(std::span<const std::byte> bytes) {
  // The kernel's copy into the page cache is 3x slower when the file position lies just
  // past the buffer modulo 4 KiB (detail/page_copy.hpp): such writes are bounced.
  detail::write_avoiding_slow_copy(position_, bytes,
                                   [this](std::uint64_t, std::span<const std::byte> part) { write_exactly(part); });
}

CKPT_DECL void posix::writer::write_exactly(std::span<const std::byte> bytes) {
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

CKPT_DECL void posix::writer::flush() {
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

CKPT_DECL void posix::writer::discard() noexcept {
  queue_.reset();  // waits for the writes in flight: they use the descriptor and the buffers
  block_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

CKPT_DECL posix::writer_lock posix::lock_writer(bool wait) {
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

CKPT_DECL posix::writer posix::create(std::string_view key) {
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
  return writer(fd, std::move(temp), final_path, std::move(dirs), direct, options_.writes_in_flight,
                options_.write_unaligned_in_place);
}

CKPT_DECL posix::reader posix::open_reader(std::string_view key) const {
  detail::check_key(key);
  auto p = path(key);
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) throw error(error_kind::not_found, "no such file: " + p.string());
    throw detail::posix_error("open", p.string(), err);
  }
  return reader(fd, std::move(p), options_.direct_reads, options_.read_in_place);
}

CKPT_DECL void posix::read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const {
  open_reader(key).read(offset, out);
}

CKPT_DECL std::optional<std::uint64_t> posix::size(std::string_view key) const {
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

CKPT_DECL std::vector<std::string> posix::list(std::string_view prefix) const {
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

CKPT_DECL void posix::remove(std::string_view key) {
  detail::check_key(key);
  const auto p = path(key);
  if (::unlink(p.c_str()) != 0) {
    if (errno == ENOENT) return;
    throw detail::posix_error("remove", p.string(), errno);
  }
  detail::fsync_dir(p.parent_path());
}

CKPT_DECL void posix::remove_all(std::string_view prefix) {
  detail::check_key(prefix);
  const auto p = path(prefix);
  std::error_code ec;
  std::filesystem::remove_all(p, ec);
  if (ec) throw error(error_kind::io, "remove " + p.string() + ": " + ec.message());
  std::error_code ec2;
  if (std::filesystem::exists(p.parent_path(), ec2)) detail::fsync_dir(p.parent_path());
}

CKPT_DECL posix::reader::~reader() {
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

CKPT_DECL void posix::reader::read(std::uint64_t offset, std::span<std::byte> out) const {
  const bool announced = in_announced(offset, out.size());
  if (!out.empty() && offset >= held_.first && offset < held_.second &&
      (announced || offset + out.size() <= held_.second)) {
    // Brought into the buffer by an earlier read (read_direct, read_batched): copied out. In an
    // announced range, what lies past the buffer's bytes is then read from their end on (the
    // next window); elsewhere a read the buffer holds only in part is read whole, as it would
    // be without the buffer (a small rest would go through the page cache).
    const auto held = static_cast<std::size_t>(std::min<std::uint64_t>(held_.second - offset, out.size()));
    copy_out(offset, out.first(held));
    if (held == out.size()) return;
    offset += held;
    out = out.subspan(held);
  }
  if (direct_ && read_direct(offset, out)) return;
  if (read_batched(offset, out)) return;
  // The kernel's copy out of the page cache is 3x slower when the buffer lies just past
  // the file offset modulo 4 KiB, as a std::vector's does (detail/page_copy.hpp): such
  // reads are bounced. A short file is reported for the whole range asked for.
  detail::read_avoiding_slow_copy(offset, out, [&](std::uint64_t at, std::span<std::byte> part) {
    read_exactly(at, part, offset, out.size());
  });
}

CKPT_DECL bool posix::reader::cached(std::uint64_t offset, std::size_t bytes) const {
  if (map_ == nullptr) {
    struct stat st{};
    if (::fstat(fd_, &st) != 0 || st.st_size <= 0) return true;
    void* m = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) {  // no mapping, no residency: the page cache it is
      use_page_cache();
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

CKPT_DECL bool posix::reader::read_direct(std::uint64_t offset, std::span<std::byte> out) const {
  if (out.empty()) return false;
  const auto end = offset + out.size();
  const bool announced = in_announced(offset, out.size());
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
  if (cached(offset, out.size())) {
    // A cached piece of a range that was not all cached: read the range with O_DIRECT from
    // here, unless all of it is cached by now. Reading such pieces through the cache one by one
    // has the kernel read further ahead at each, so the next piece is cached by the time it is
    // asked for, and a few cached chunks at the start of a run (another reader's, or the
    // kernel's readahead after the file's header was read) took the whole run through the cache.
    if (!announced) return false;
    if (cached(hint_.first, hint_.second - hint_.first)) {
      hint_cached_ = residency::all;
      return false;
    }
  }
  if (direct_fd_ < 0) {
    direct_fd_ = ::open(path_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (direct_fd_ < 0) {
      use_page_cache();
      return false;
    }
    block_ = detail::kept_io_memory(block_bytes, direct_read_bytes);
  }
  if (in_place(offset, out) && read_in_place(offset, out)) return true;
  auto at = offset / direct_alignment * direct_alignment;
  for (bool first = true; at < end; first = false) {  // one read, unless `out` is over 4 MiB
    const auto until = announced ? hint_.second : end;  // read ahead only in the announced range
    // 4 MiB from the block that holds the first byte wanted: one request of the disk's largest
    // size (max_sectors_kb), where 4 MiB and the partial block before them made two. `read`
    // copies out what a window holds of the next read and reads the rest from the window's end,
    // so a run read in pieces is read in windows one after the other.
    const auto want = std::min<std::uint64_t>(direct_read_bytes, align(until - at));
    std::size_t got = 0;  // fewer than `want` only at the end of the file
    while (got < want) {
      const ssize_t n = ::pread(direct_fd_, block_.get() + got, want - got, static_cast<off_t>(at + got));
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && first && got == 0) {
          use_page_cache();  // refused before anything was copied out: the page cache instead
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
      throw truncated(offset, end, at + got);
    const auto from = std::max(at, offset);
    copy_out(from, out.subspan(from - offset, to - from));
    at += want;
  }
  return true;
}

CKPT_DECL bool posix::reader::read_in_place(std::uint64_t offset, std::span<std::byte> out) const {
  // `out` lies as far into its page as `offset` into its block (in_place): its whole pages are
  // whole blocks of the file. One O_DIRECT request brings them straight into `out`, and the
  // blocks that hold its partial pages at either end into the aligned buffer, copied from there.
  // Read on their own, through the page cache, those two small reads doubled the requests a load
  // waits for: each waits behind the large ones in flight.
  const auto head = static_cast<std::size_t>((direct_alignment - offset % direct_alignment) % direct_alignment);
  const auto whole = (out.size() - head) / direct_alignment * direct_alignment;
  const auto tail = out.size() - head - whole;
  const auto first = offset + head - (head > 0 ? direct_alignment : 0);  // the first block read
  std::array<iovec, 3> parts{};
  std::size_t count = 0;
  std::byte* const head_block = block_.get() + direct_buffer_bytes;  // past the read area (block_bytes)
  std::byte* const tail_block = head_block + direct_alignment;
  if (head > 0) parts[count++] = {head_block, direct_alignment};
  parts[count++] = {out.data() + head, whole};
  if (tail > 0) parts[count++] = {tail_block, direct_alignment};
  std::size_t asked = 0;
  for (std::size_t k = 0; k < count; ++k) asked += parts[k].iov_len;
  const std::size_t needed = asked - (tail > 0 ? direct_alignment - tail : 0);  // past them: the rest of the last block
  // (The read area, and what it holds, stays as it is: these blocks lie past it.)
  std::size_t got = 0;  // fewer than `needed` only at the end of the file
  while (got < asked) {
    // The parts not read yet (a read cut short goes on where it stopped).
    std::array<iovec, 3> rest{};
    std::size_t n_rest = 0, skip = got;
    for (std::size_t k = 0; k < count; ++k) {
      if (skip >= parts[k].iov_len) {
        skip -= parts[k].iov_len;
        continue;
      }
      rest[n_rest++] = {static_cast<std::byte*>(parts[k].iov_base) + skip, parts[k].iov_len - skip};
      skip = 0;
    }
    const ssize_t n = ::preadv(direct_fd_, rest.data(), static_cast<int>(n_rest), static_cast<off_t>(first + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && got == 0) {
        in_place_ = false;  // this memory or file refuses: the aligned buffer from now on
        return false;
      }
      throw detail::posix_error("read", path_.string(), errno);
    }
    got += static_cast<std::size_t>(n);
    if (n == 0 || got % direct_alignment != 0) break;  // the end of the file
  }
  if (got < needed)
    throw truncated(offset, offset + out.size(), first + got);
  if (head > 0) std::memcpy(out.data(), head_block + (direct_alignment - head), head);
  if (tail > 0) std::memcpy(out.data() + head + whole, tail_block, tail);
  return true;
}

CKPT_DECL bool posix::reader::read_batched(std::uint64_t offset, std::span<std::byte> out) const {
  const auto end = offset + out.size();
  if (out.empty() || out.size() >= batched_max) return false;
  // Only inside an announced run, and only when it holds more than this read: a run of small
  // chunks, read one by one, costs a system call each.
  if (!in_announced(offset, out.size()) || hint_.second - offset <= out.size()) return false;
  if (!block_) block_ = detail::kept_io_memory(block_bytes, direct_read_bytes);
  const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(hint_.second - offset, direct_read_bytes));
  held_ = {0, 0};  // nothing valid in the buffer until the read has ended
  std::size_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(fd_, block_.get() + got, want - got, static_cast<off_t>(offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw detail::posix_error("read", path_.string(), errno);
    }
    if (n == 0) break;  // the end of the file
    got += static_cast<std::size_t>(n);
  }
  held_ = {offset, offset + got};
  if (got < out.size()) throw truncated(offset, end, offset + got);
  copy_out(offset, out);
  return true;
}

CKPT_DECL error posix::reader::truncated(std::uint64_t first, std::uint64_t end, std::uint64_t ends_at) const {
  return error(error_kind::corrupt, path_.string() + " is truncated: needed bytes [" + std::to_string(first) + ", " +
                                        std::to_string(end) + "), the file ends at " + std::to_string(ends_at));
}

CKPT_DECL void posix::reader::copy_out(std::uint64_t offset, std::span<std::byte> out) const noexcept {
  detail::copy_avoiding_slow_copy(out.data(), block_.get() + (offset - held_.first), out.size());
}

CKPT_DECL void posix::reader::read_exactly(std::uint64_t offset, std::span<std::byte> out, std::uint64_t first, std::uint64_t wanted) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      throw detail::posix_error("read", path_.string(), err);
    }
    if (n == 0)
      throw truncated(first, first + wanted, offset + done);
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace ckpt
