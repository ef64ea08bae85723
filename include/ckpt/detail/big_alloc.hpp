#pragma once
// An allocator for the large flat arrays of a commit at scale (the chunk columns of millions
// of chunks): resize() leaves new elements uninitialised instead of zeroing them. Every
// element is overwritten right after (a column is filled from an index), and zeroing hundreds
// of MB first costs about as much as the copy itself.
//
// (Asking for transparent huge pages with madvise on these blocks was measured too: on
// Debian 12's defaults it made the first commit at 4096 ranks 2-3x slower, as the kernel
// zeroes and compacts 2 MiB at a time inside the fault.)

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace ckpt::detail {

template <class T>
struct big_alloc : std::allocator<T> {
  static_assert(std::is_trivially_copyable_v<T>, "big_alloc holds plain data only");
  using value_type = T;
  template <class U>
  struct rebind {
    using other = big_alloc<U>;
  };

  big_alloc() noexcept = default;
  template <class U>
  big_alloc(const big_alloc<U>&) noexcept {}

  /// Value-initialisation (`v.resize(n)`, `v.emplace_back()`) leaves the element as it is.
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};

/// A vector of plain data whose resize() does not zero what it adds.
template <class T>
using big_vector = std::vector<T, big_alloc<T>>;

}  // namespace ckpt::detail
