#pragma once
// Memory in transparent huge pages: the tables a save or a load keeps with one entry per tensor,
// and the large I/O buffers a save's writer and a load's readers fill each time.
//
// The tables: a save or a load keeps tables with one entry per tensor. A model of 100,000
// tensors gives each such table tens of MB (metadata::tensors alone: 46 MB), allocated afresh by
// every save and load, and the kernel maps fresh memory one 4 KiB page at a time, on first
// touch. On a virtual machine each of those page faults can cost tens of microseconds, and
// filling such a table took longer than parsing the JSON it came from (docs/performance.md,
// "Many tensors on the disk": what this changed).
//
// So a table of 2 MiB or more is placed in whole 2 MiB-aligned blocks (at most 2 MiB more than
// it needs), and the kernel is asked to back them with transparent huge pages
// (madvise(MADV_HUGEPAGE): THP mode "madvise" gives huge pages only where asked, "always"
// everywhere it can). Where the kernel has no huge page to give, or THP is off, the advice is
// ignored and the table is in ordinary pages, as before. Smaller tables come from operator new
// as usual.
//
// A table's block, once freed, is kept for the next table (huge_page_cache, up to 256 MiB in
// all). Unmapped, its memory would go back to the kernel, and on a virtual machine that hands
// freed memory back to its host (free page reporting) the next save's or load's tables would be
// faulted in afresh from the host, where glibc's heap would have given ordinary pages it still
// held: a process that saves every few minutes found the save's tables slower in huge pages than
// in those (docs/performance.md, "What the investigations found"). The O_DIRECT buffers of a
// posix writer and of a load's readers are kept the same way, in a cache of their own of up to
// 160 MiB (kept_io_memory), so that they never push out the tables.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ckpt::detail {

/// The size of a transparent huge page on x86-64 (and the alignment asked for here elsewhere).
inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

/// `bytes` rounded up to whole huge pages: what huge_page_memory maps for them.
inline constexpr std::size_t whole_huge_pages(std::size_t bytes) noexcept {
  return (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
}

/// Unmaps a huge_page_buffer (or frees it, where there is no mmap).
struct huge_page_delete {
  std::size_t bytes = 0;  // as mapped
  void operator()(std::byte* p) const noexcept {
#if defined(__linux__)
    ::munmap(p, bytes);
#else
    ::operator delete[](p, std::align_val_t{huge_page_bytes});
#endif
  }
};
/// An I/O buffer from huge_page_memory.
using huge_page_buffer = std::unique_ptr<std::byte[], huge_page_delete>;

/// `bytes` of memory, 2 MiB aligned, whose first `advised` bytes (rounded down to whole 2 MiB)
/// the kernel is asked to back with huge pages. For buffers of megabytes that O_DIRECT fills or
/// drains at every save or load: in ordinary pages, the kernel faults each 4 KiB page in
/// (and zeroes it) inside the first read or write that touches it, one fault per page. Past
/// `advised`, pages stay ordinary: a buffer's rarely used parts then cost no huge page. Mapped
/// straight from the kernel, not through malloc, so only the pages used are ever touched (glibc's
/// MALLOC_PERTURB_, which Meson's test runner sets, fills all of a malloc'd block).
inline huge_page_buffer huge_page_memory(std::size_t bytes, std::size_t advised) {
  constexpr auto huge = huge_page_bytes;
#if defined(__linux__)
  const auto whole = whole_huge_pages(bytes);
  void* m = ::mmap(nullptr, whole + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  // Keep the 2 MiB-aligned `whole` bytes inside the mapping; give the rest back.
  auto* base = static_cast<std::byte*>(m);
  auto* start = base + (huge - reinterpret_cast<std::uintptr_t>(base) % huge) % huge;
  if (start > base) ::munmap(base, static_cast<std::size_t>(start - base));
  if (auto* end = start + whole; end < base + whole + huge) ::munmap(end, static_cast<std::size_t>(base + whole + huge - end));
#if defined(MADV_HUGEPAGE)
  if (const auto advise = std::min(advised, bytes) / huge * huge; advise > 0)
    (void)::madvise(start, advise, MADV_HUGEPAGE);  // advice only, as for tables
#endif
  return huge_page_buffer(start, huge_page_delete{whole});
#else
  (void)advised;
  return huge_page_buffer(new (std::align_val_t{huge}) std::byte[bytes]);
#endif
}

#if defined(__SANITIZE_ADDRESS__)
#define CKPT_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKPT_UNDER_ASAN 1
#endif
#endif
#if !defined(CKPT_UNDER_ASAN)
#define CKPT_UNDER_ASAN 0
#endif

/// Blocks of whole huge pages that tables (or, in the io() cache, O_DIRECT buffers) freed, kept
/// mapped for the ones that follow: the oldest go once more than the bound are kept, and blocks
/// larger than `largest_block` are not kept at all (a snapshot's buffers, or a table too large
/// to be worth holding). A block is handed out whole or split, its tail kept. Under AddressSanitizer
/// nothing is kept, so that memory used after it was freed still faults.
class huge_page_cache {
 public:
  static constexpr std::size_t most_bytes = std::size_t{256} << 20;  // the tables' cache
  static constexpr std::size_t largest_block = std::size_t{64} << 20;
  /// The O_DIRECT buffers' cache: a load's 16 readers (6 MiB each) and a save's writer (34 MiB).
  static constexpr std::size_t most_io_bytes = std::size_t{160} << 20;

  explicit huge_page_cache(std::size_t most = most_bytes) noexcept : most_(most) {}

  /// The tables' cache of the process. Never destroyed: tables held by static objects may be
  /// freed after every other static object is gone.
  static huge_page_cache& process() {
    static auto* cache = new huge_page_cache;
    return *cache;
  }
  /// The O_DIRECT buffers' cache of the process (kept_io_memory): apart from the tables', so
  /// that buffers never push out the tables a save or load would reuse, which would then be
  /// faulted in afresh.
  static huge_page_cache& io() {
    static auto* cache = new huge_page_cache(most_io_bytes);
    return *cache;
  }

  /// A kept block of `bytes` (a multiple of huge_page_bytes), or nullptr: the smallest that is
  /// large enough, its tail kept.
  std::byte* take(std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    std::size_t best = blocks_.size();
    for (std::size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].bytes >= bytes && (best == blocks_.size() || blocks_[i].bytes < blocks_[best].bytes)) best = i;
    if (best == blocks_.size()) return nullptr;
    auto* p = blocks_[best].at;
    if (blocks_[best].bytes > bytes) {
      blocks_[best].at += bytes;
      blocks_[best].bytes -= bytes;
    } else {
      blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(best));
    }
    kept_ -= bytes;
    return p;
  }

  /// Keeps a freed block of `bytes` (a multiple of huge_page_bytes, mapped by huge_page_memory);
  /// false when the caller must unmap it.
  bool keep(std::byte* p, std::size_t bytes) {
#if !defined(__linux__) || CKPT_UNDER_ASAN  // elsewhere a block is one new[], not to be split
    (void)p, (void)bytes;
    return false;
#else
    if (bytes > largest_block) return false;
    const std::lock_guard lock(mutex_);
    while (kept_ + bytes > most_ && !blocks_.empty()) {  // the oldest make room
      unmap(blocks_.front().at, blocks_.front().bytes);
      kept_ -= blocks_.front().bytes;
      blocks_.erase(blocks_.begin());
    }
    blocks_.push_back({p, bytes});
    kept_ += bytes;
    return true;
#endif
  }

  /// Keeps a freed block (keep), or unmaps it where the cache will not or cannot note it.
  void give_back(std::byte* p, std::size_t bytes) noexcept {
    try {
      if (keep(p, bytes)) return;
    } catch (...) {  // no room to note it: unmapped instead
    }
    unmap(p, bytes);
  }

  /// Unmaps every kept block: what a process does with the memory is its own again.
  void release() noexcept {
    const std::lock_guard lock(mutex_);
    for (const auto& b : blocks_) unmap(b.at, b.bytes);
    blocks_.clear();
    kept_ = 0;
  }

  /// Bytes kept now.
  std::size_t kept() const {
    const std::lock_guard lock(mutex_);
    return kept_;
  }

 private:
  struct block {
    std::byte* at;
    std::size_t bytes;
  };
  static void unmap(std::byte* p, std::size_t bytes) noexcept { huge_page_delete{bytes}(p); }

  std::size_t most_;
  mutable std::mutex mutex_;
  std::vector<block> blocks_;  // oldest first
  std::size_t kept_ = 0;
};

/// Offers a freed I/O buffer to huge_page_cache::io(), and unmaps it where it will not keep it:
/// the deleter of a kept_io_buffer.
struct kept_io_delete {
  std::size_t bytes = 0;  // as mapped: whole huge pages
  void operator()(std::byte* p) const noexcept { huge_page_cache::io().give_back(p, bytes); }
};
/// An O_DIRECT buffer that goes back to huge_page_cache::io() when freed (kept_io_memory).
using kept_io_buffer = std::unique_ptr<std::byte[], kept_io_delete>;

/// huge_page_memory for the buffers a posix reader or writer fills with O_DIRECT at every load
/// or save, taken from (and given back to) the blocks huge_page_cache::io() keeps. Mapped afresh at
/// each use, 16 readers' buffers of 4 MiB cost a load 64 MiB of pages the kernel zeroes inside
/// the first reads, and as many unmapped at its end, each munmap waiting for the other CPUs to
/// drop the mapping (docs/performance.md, "What the investigations found"). Under AddressSanitizer
/// nothing is kept, as for tables.
inline kept_io_buffer kept_io_memory(std::size_t bytes, std::size_t advised) {
  const auto whole = whole_huge_pages(bytes);
  if (auto* p = huge_page_cache::io().take(whole)) return kept_io_buffer(p, kept_io_delete{whole});
  return kept_io_buffer(huge_page_memory(bytes, advised).release(), kept_io_delete{whole});
}

/// A std::allocator whose blocks of `huge_page_bytes` or more are 2 MiB aligned, rounded up to
/// whole 2 MiB and mapped with huge_page_memory; smaller blocks come from operator new, aligned
/// to `Align`. `AdviseTail`: whether the last, partial 2 MiB of a block is advised too (a table's
/// tail is touched as it grows; a buffer's unused tail then costs no huge page). `Kept`: whether
/// freed blocks go to huge_page_cache for the next (tables), or back to the kernel (buffers).
template <class T, std::size_t Align = alignof(T), bool AdviseTail = true, bool Kept = AdviseTail>
struct huge_page_allocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = huge_page_allocator<U, Align, AdviseTail, Kept>;
  };

  huge_page_allocator() = default;
  template <class U>
  huge_page_allocator(const huge_page_allocator<U, Align, AdviseTail, Kept>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > (std::size_t(-1) - huge_page_bytes) / sizeof(T)) throw std::bad_array_new_length();  // whole_huge_pages cannot wrap
    const auto bytes = n * sizeof(T);
    if (bytes < huge_page_bytes) return static_cast<T*>(::operator new(bytes, std::align_val_t{small_align}));
    const auto whole = whole_huge_pages(bytes);
    if constexpr (Kept)
      if (auto* p = huge_page_cache::process().take(whole)) return reinterpret_cast<T*>(p);
    return reinterpret_cast<T*>(huge_page_memory(whole, AdviseTail ? whole : bytes).release());
  }
  void deallocate(T* p, std::size_t n) noexcept {
    const auto bytes = n * sizeof(T);
    if (bytes < huge_page_bytes) {
      ::operator delete(p, std::align_val_t{small_align});
      return;
    }
    auto* block = reinterpret_cast<std::byte*>(p);
    const auto whole = whole_huge_pages(bytes);
    if constexpr (Kept)
      huge_page_cache::process().give_back(block, whole);
    else
      huge_page_delete{whole}(block);
  }

  template <class U>
  bool operator==(const huge_page_allocator<U, Align, AdviseTail, Kept>&) const noexcept {
    return true;  // stateless: any one frees what another allocated
  }

 private:
  static constexpr std::size_t small_align = std::max(Align, alignof(T));
};

/// The allocator of per-tensor tables: whole blocks advised as huge pages.
template <class T>
using table_allocator = huge_page_allocator<T>;

/// A vector whose elements are one per tensor (or per chunk) of a checkpoint.
template <class T>
using table_vector = std::vector<T, table_allocator<T>>;

/// Bytes with a few per tensor, built once per save: the report a rank makes of its shard
/// file's plan (megabytes for a model of 100,000 tensors).
using table_string = std::basic_string<char, std::char_traits<char>, table_allocator<char>>;

}  // namespace ckpt::detail
