#pragma once
// The writes a posix writer keeps in flight with O_DIRECT. A loop of write(2) calls has one
// request at the disk at a time, and a disk with a deep queue (NVMe, a cloud volume) moves the
// same bytes faster with several: positional writes of whole blocks run here on up to `depth`
// threads of the queue's own, while the caller fills the next buffer. The buffers are the
// queue's, `depth` + 1 at most, cut as they are first needed from one block in huge pages
// (table_memory.hpp): a queue lives for one file of one save, and 33 buffers of 1 MiB in
// ordinary pages would be 8,448 page faults at every save.

#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../error.hpp"
#include "table_memory.hpp"

namespace ckpt::detail {

class write_queue {
 public:
  /// O_DIRECT writes need this alignment of memory, file offsets and sizes.
  static constexpr std::size_t alignment = 4096;

  /// Writes to `fd` (opened with O_DIRECT) with up to `depth` writes in flight, from buffers of
  /// `buffer_bytes`. `path` names the file in errors, and is opened again without O_DIRECT for a
  /// write the file system refuses.
  write_queue(int fd, std::string path, unsigned depth, std::size_t buffer_bytes)
      : fd_(fd), path_(std::move(path)), depth_(depth < 1 ? 1 : depth), buffer_bytes_(buffer_bytes) {}
  write_queue(const write_queue&) = delete;
  write_queue& operator=(const write_queue&) = delete;
  /// Waits for the writes in flight (their errors dropped: a queue destroyed undrained belongs to
  /// a file being discarded) and stops the threads.
  ~write_queue() {
    {
      std::unique_lock lock(mu_);
      idle_.wait(lock, [&] { return in_flight_ == 0; });
      stopping_ = true;
    }
    work_.notify_all();
    for (auto& t : threads_) t.join();
    if (buffered_fd_ >= 0) ::close(buffered_fd_);
  }

  /// A free buffer of `buffer_bytes`, waiting for a write in flight to end if all are taken.
  std::byte* acquire() {
    std::unique_lock lock(mu_);
    if (free_.empty() && cut_ < depth_ + std::size_t{1}) {
      const std::size_t stride = (buffer_bytes_ + alignment - 1) / alignment * alignment;  // each buffer aligned
      const std::size_t all = (depth_ + std::size_t{1}) * stride;
      if (!buffers_) buffers_ = kept_io_memory(all, all);  // virtual until touched, a huge page at a time
      return buffers_.get() + cut_++ * stride;
    }
    idle_.wait(lock, [&] { return !free_.empty() || failure_; });
    rethrow(lock);
    auto* b = free_.back();
    free_.pop_back();
    return b;
  }
  /// Gives back a buffer from acquire() that was not submitted.
  void release(std::byte* buffer) {
    std::lock_guard lock(mu_);
    free_.push_back(buffer);
  }

  /// Writes `bytes` (whole blocks) at `offset`. `owned`, a buffer from acquire(), goes back to
  /// the free buffers when the write ends; otherwise the bytes must stay untouched until
  /// wait_all(). Returns once the write is queued, unless `depth` writes are in flight: then it
  /// waits for one. A failure of an earlier write is thrown here or by the next call.
  void submit(std::span<const std::byte> bytes, std::uint64_t offset, std::byte* owned = nullptr) {
    if (depth_ == 1) {  // one request at a time: on the caller's thread, as a loop of writes would
      {
        std::unique_lock lock(mu_);
        rethrow(lock);
      }
      run({bytes, offset, owned});
      if (owned) release(owned);
      return;
    }
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return in_flight_ < depth_ || failure_; });
    rethrow(lock);
    jobs_.push_back({bytes, offset, owned});
    ++in_flight_;
    if (waiting_ == 0 && threads_.size() < depth_) threads_.emplace_back([this] { serve(); });
    lock.unlock();
    work_.notify_one();
  }

  /// Waits for every write in flight; throws the first failure.
  void wait_all() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return in_flight_ == 0; });
    rethrow(lock);
  }

  /// True once the file system refused an O_DIRECT write (EINVAL), which then went through the
  /// page cache: the writer writes the rest of the file that way too.
  bool refused() const {
    std::lock_guard lock(mu_);
    return refused_;
  }

 private:
  struct job {
    std::span<const std::byte> bytes;
    std::uint64_t offset;
    std::byte* owned;
  };

  void serve() {
    std::unique_lock lock(mu_);
    for (;;) {
      ++waiting_;
      work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      --waiting_;
      if (jobs_.empty()) return;  // stopping, with nothing left
      const auto j = jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      std::exception_ptr failed;
      try {
        run(j);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed && !failure_) failure_ = failed;
      if (j.owned) free_.push_back(j.owned);
      --in_flight_;
      idle_.notify_all();
    }
  }

  /// One positional write, whole. Short writes continue where they stopped; a write the file
  /// system refuses with O_DIRECT (EINVAL: no O_DIRECT there, or a stricter alignment, or the
  /// rest of a short write, now unaligned) goes through the page cache.
  void run(const job& j) {
    const std::byte* p = j.bytes.data();
    std::size_t left = j.bytes.size();
    std::uint64_t at = j.offset;
    int fd = fd_;
    while (left > 0) {
      const ssize_t n = ::pwrite(fd, p, left, static_cast<off_t>(at));
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && fd == fd_) {
          fd = buffered_fd();
          continue;
        }
        throw posix_error("write", path_, errno);
      }
      if (n == 0) throw error(error_kind::io, "write " + path_ + ": no progress");
      p += n;
      left -= static_cast<std::size_t>(n);
      at += static_cast<std::uint64_t>(n);
    }
  }

  int buffered_fd() {
    std::lock_guard lock(mu_);
    refused_ = true;
    if (buffered_fd_ < 0) {
      buffered_fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
      if (buffered_fd_ < 0) throw posix_error("open", path_, errno);
    }
    return buffered_fd_;
  }

  void rethrow(std::unique_lock<std::mutex>&) {
    if (failure_) std::rethrow_exception(failure_);  // stays set: every later call fails too
  }

  const int fd_;
  const std::string path_;
  const unsigned depth_;
  const std::size_t buffer_bytes_;
  mutable std::mutex mu_;
  std::condition_variable work_, idle_;  // jobs queued; a job ended
  std::deque<job> jobs_;
  std::vector<std::thread> threads_;
  kept_io_buffer buffers_;  // depth_ + 1 buffers of buffer_bytes_, the first cut_ of them in use
  std::size_t cut_ = 0;
  std::vector<std::byte*> free_;
  unsigned in_flight_ = 0, waiting_ = 0;  // jobs queued or running; threads waiting for one
  bool stopping_ = false, refused_ = false;
  int buffered_fd_ = -1;
  std::exception_ptr failure_;
};

}  // namespace ckpt::detail
