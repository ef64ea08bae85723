#pragma once
/// @file detail/page_copy.hpp
/// When the kernel's copy between a user buffer and the page cache runs slowly, and how reads
/// and writes avoid it (posix's reader and writer, and the torch and safetensors files).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

namespace ckpt::detail {

/// True when a large copy from `source` to `destination` lies in the window where some CPUs
/// copy about 3x slower than usual: the destination 1-63 bytes past the source, modulo 4 KiB.
/// Whether this machine's CPU is one of them is slow_copy_window_here().
///
/// Linux's read(2) and write(2) copy between the page cache and user memory with `rep movsb`,
/// as glibc's memcpy does for copies between 4 KiB and the L2 cache's size. On this project's
/// AMD EPYC (Zen 3) VM, that copy took 0.40-0.45 s per GiB on one thread when the destination
/// was 1-31 bytes ahead of the source modulo 4096, and 0.12-0.16 s at every other distance
/// measured (0, 32-160, 192-3072 and 3936-4080; reads and writes alike). The stores then
/// alias the loads that follow them within 4 KiB, a false dependency the CPU resolves slowly.
/// The window is taken as a whole cache line for margin. A std::vector's data sits 16 bytes
/// into its page and chunks of 64 KiB or more sit at 4 KiB boundaries in the file, so loading
/// into vectors meets it on every such chunk. For the page cache, the address is the file position.
constexpr bool slow_page_copy(std::uint64_t destination, std::uint64_t source) noexcept {
  const auto ahead = (destination - source) % 4096;
  return ahead != 0 && ahead < 64;
}

/// What CKPT_SLOW_COPY_WINDOW says: "1" (copies in the window are slow here: bounce them), "0"
/// (they are not: never bounce), nothing for anything else or when it is unset (measure).
inline std::optional<bool> slow_copy_window_from_env(const char* value) noexcept {
  if (value == nullptr) return std::nullopt;
  const std::string_view v(value);
  if (v == "1") return true;
  if (v == "0") return false;
  return std::nullopt;
}

/// Times `rep movsb` of 128 KiB with the destination 16 bytes past the source modulo 4 KiB
/// and 2 KiB past it, five times each, alternating, and calls the window slow when the fastest
/// copy in it took over 1.5x the fastest outside it. The kernel's copy, the same instruction,
/// was 3x slower in the window on the Zen 3 where it was found (this probe has not run on one);
/// on a Zen 5 `rep movsb` runs as fast in the window as outside it (0.9-1.1x), and the bounce
/// was a second copy of every byte for nothing. Under a millisecond,
/// most of it faulting the 264 KiB in, once per process. Only x86-64 has been seen to have the
/// window; elsewhere: false.
inline bool measure_slow_copy_window() noexcept {
#if defined(__x86_64__)
  constexpr std::size_t bytes = std::size_t{128} * 1024, rounds = 5;
  // The source, then the destination a page past its end (bytes is a multiple of 4 KiB, so a
  // destination `ahead` bytes into its area lies `ahead` past the source modulo 4 KiB).
  void* block = std::aligned_alloc(4096, 2 * bytes + 2 * 4096);
  if (block == nullptr) return true;  // no memory to measure with: the safe side
  auto* source = static_cast<std::byte*>(block);
  std::byte* destination = source + bytes + 4096;
  std::memset(block, 1, 2 * bytes + 2 * 4096);  // fault every page in first
  const auto copy = [&](std::size_t ahead) {
    void* d = destination + ahead;
    const void* s = source;
    std::size_t n = bytes;
    const auto t0 = std::chrono::steady_clock::now();
    asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  (void)copy(2048);  // caches warm
  double in = 1e9, out = 1e9;
  for (std::size_t r = 0; r < rounds; ++r) {
    in = std::min(in, copy(16));
    out = std::min(out, copy(2048));
  }
  std::free(block);
  return in > 1.5 * out;
#else
  return false;
#endif
}

/// Tests set this to 1 or 0 to have slow_copy_window_here() answer so; -1 (the default) lets it
/// decide.
inline std::atomic<int>& slow_copy_window_forced() noexcept {
  static std::atomic<int> forced{-1};
  return forced;
}

/// Whether copies in the slow window (slow_page_copy) are slow on this machine, so that reads
/// and writes there are worth a bounce: CKPT_SLOW_COPY_WINDOW where it is "0" or "1", otherwise
/// measured on first use (measure_slow_copy_window). The answer is kept for the process: a
/// virtual machine that moves to another host keeps the first one until it restarts.
inline bool slow_copy_window_here() noexcept {
  if (const int forced = slow_copy_window_forced().load(std::memory_order_relaxed); forced >= 0) return forced != 0;
  static const bool slow = [] {
    const auto set = slow_copy_window_from_env(std::getenv("CKPT_SLOW_COPY_WINDOW"));
    return set ? *set : measure_slow_copy_window();
  }();
  return slow;
}

/// A copy from `source` to `destination` in the slow window, on a machine where that is slow.
inline bool avoid_copy(std::uint64_t destination, std::uint64_t source) noexcept {
  return slow_page_copy(destination, source) && slow_copy_window_here();
}

/// A 64 KiB buffer for a transfer that would meet the slow window: it starts 2 KiB past the
/// file position modulo 4 KiB, so that neither the kernel's copy between it and the page cache
/// nor the memcpy between it and the user's buffer (1-63 bytes from the file position) does.
/// Each 64 KiB piece of the transfer keeps that placement, as 64 KiB is a multiple of 4 KiB.
///
/// @code
/// detail::bounce_buffer bounce(offset);  // then pread into bounce.data(), memcpy out
/// @endcode
class bounce_buffer {
 public:
  static constexpr std::size_t size = std::size_t{64} * 1024;

  explicit bounce_buffer(std::uint64_t file_position)
      : block_(std::make_unique_for_overwrite<std::byte[]>(size + 4096)) {
    const auto at = reinterpret_cast<std::uintptr_t>(block_.get()) % 4096;
    const auto want = (file_position + 2048) % 4096;
    data_ = block_.get() + (want + 4096 - at) % 4096;
  }
  std::byte* data() const noexcept { return data_; }

 private:
  std::unique_ptr<std::byte[]> block_;
  std::byte* data_;
};

/// memcpy, except that a copy in the slow window (destination 1-63 bytes past the source,
/// modulo 4 KiB), on a machine where that is slow, goes in 2 KiB pieces: glibc copies pieces
/// that small with vector loads and stores, not with `rep movsb`, which is what is slow there.
inline void copy_avoiding_slow_copy(std::byte* destination, const std::byte* source, std::size_t bytes) noexcept {
  if (!avoid_copy(reinterpret_cast<std::uintptr_t>(destination), reinterpret_cast<std::uintptr_t>(source))) {
    std::memcpy(destination, source, bytes);
    return;
  }
  constexpr std::size_t piece = 2048;
  for (std::size_t at = 0; at < bytes; at += piece) std::memcpy(destination + at, source + at, std::min(piece, bytes - at));
}

/// Reads `out` from file position `offset` with `read_exactly(position, span)`, which must fill
/// the span or throw. A read of 64 KiB or more in the slow window, on a machine where that is
/// slow, goes through a bounce buffer, 64 KiB at a time; any other goes straight into `out` in
/// one call.
template <class ReadExactly>
void read_avoiding_slow_copy(std::uint64_t offset, std::span<std::byte> out, ReadExactly&& read_exactly) {
  if (out.size() < bounce_buffer::size || !avoid_copy(reinterpret_cast<std::uintptr_t>(out.data()), offset)) {
    read_exactly(offset, out);
    return;
  }
  const bounce_buffer bounce(offset);
  for (std::size_t at = 0; at < out.size(); at += bounce_buffer::size) {
    const auto part = out.subspan(at, std::min(bounce_buffer::size, out.size() - at));
    read_exactly(offset + at, std::span<std::byte>(bounce.data(), part.size()));
    std::memcpy(part.data(), bounce.data(), part.size());
  }
}

/// Writes `bytes` at file position `position` with `write_exactly(position, span)`, which must
/// write the whole span or throw; the counterpart of read_avoiding_slow_copy.
template <class WriteExactly>
void write_avoiding_slow_copy(std::uint64_t position, std::span<const std::byte> bytes, WriteExactly&& write_exactly) {
  if (bytes.size() < bounce_buffer::size || !avoid_copy(position, reinterpret_cast<std::uintptr_t>(bytes.data()))) {
    write_exactly(position, bytes);
    return;
  }
  const bounce_buffer bounce(position);
  for (std::size_t at = 0; at < bytes.size(); at += bounce_buffer::size) {
    const auto part = bytes.subspan(at, std::min(bounce_buffer::size, bytes.size() - at));
    std::memcpy(bounce.data(), part.data(), part.size());
    write_exactly(position + at, std::span<const std::byte>(bounce.data(), part.size()));
  }
}

}  // namespace ckpt::detail
