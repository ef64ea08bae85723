#pragma once
// Memory in transparent huge pages: the tables a save or a load keeps with one entry per tensor,
// and the large I/O buffers a save's writer and a load's readers fill afresh each time.
//
// The tables: a save or a load keeps tables with one entry per tensor. A model of 100,000
// tensors gives each such table tens of MB (metadata::tensors alone: 56 MB), allocated afresh by
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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ckpt::detail {

/// The size of a transparent huge page on x86-64 (and the alignment asked for here elsewhere).
inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

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
/// drains afresh at every save or load: in ordinary pages, the kernel faults each 4 KiB page in
/// (and zeroes it) inside the first read or write that touches it, one fault per page. Past
/// `advised`, pages stay ordinary: a buffer's rarely used parts then cost no huge page. Mapped
/// straight from the kernel, not through malloc, so only the pages used are ever touched (glibc's
/// MALLOC_PERTURB_, which Meson's test runner sets, fills all of a malloc'd block).
inline huge_page_buffer huge_page_memory(std::size_t bytes, std::size_t advised) {
  constexpr auto huge = huge_page_bytes;
#if defined(__linux__)
  const auto whole = (bytes + huge - 1) / huge * huge;
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

/// A std::allocator whose blocks of `huge_page_bytes` or more are 2 MiB aligned, rounded up to
/// whole 2 MiB and mapped with huge_page_memory; smaller blocks come from operator new, aligned
/// to `Align`. `AdviseTail`: whether the last, partial 2 MiB of a block is advised too (a table's
/// tail is touched as it grows; a buffer's unused tail then costs no huge page).
template <class T, std::size_t Align = alignof(T), bool AdviseTail = true>
struct huge_page_allocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = huge_page_allocator<U, Align, AdviseTail>;
  };

  huge_page_allocator() = default;
  template <class U>
  huge_page_allocator(const huge_page_allocator<U, Align, AdviseTail>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > (std::size_t(-1) - huge_page_bytes) / sizeof(T)) throw std::bad_array_new_length();  // round_up cannot wrap
    const auto bytes = n * sizeof(T);
    if (bytes < huge_page_bytes) return static_cast<T*>(::operator new(bytes, std::align_val_t{small_align}));
    const auto whole = round_up(bytes);
    return reinterpret_cast<T*>(huge_page_memory(whole, AdviseTail ? whole : bytes).release());
  }
  void deallocate(T* p, std::size_t n) noexcept {
    const auto bytes = n * sizeof(T);
    if (bytes < huge_page_bytes)
      ::operator delete(p, std::align_val_t{small_align});
    else
      huge_page_delete{round_up(bytes)}(reinterpret_cast<std::byte*>(p));
  }

  template <class U>
  bool operator==(const huge_page_allocator<U, Align, AdviseTail>&) const noexcept {
    return true;  // stateless: any one frees what another allocated
  }

 private:
  static constexpr std::size_t small_align = std::max(Align, alignof(T));
  static std::size_t round_up(std::size_t bytes) noexcept {
    return (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
  }
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
