#pragma once
// The host buffers of the save and load pipelines (and of async snapshots): lent by the
// DevicePolicy when it lends (pinned memory, so device copies need no bounce buffer), else
// ordinary vectors.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <vector>

#include "../concepts.hpp"
#include "../lent_buffer.hpp"
#include "../tensor.hpp"
#include "table_memory.hpp"

namespace ckpt::detail {

/// std::allocator, aligned to `Align` bytes.
template <class T, std::size_t Align>
struct aligned_allocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = aligned_allocator<U, Align>;
  };
  aligned_allocator() noexcept = default;
  template <class U>
  aligned_allocator(const aligned_allocator<U, Align>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{Align})); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{Align}); }
  friend bool operator==(const aligned_allocator&, const aligned_allocator&) noexcept { return true; }
};

/// A resizable host buffer that borrows from `D` when it can. Contents are not kept across a
/// resize. Only `resize` borrows, so callers size buffers on the thread that calls the policy.
/// `Align`: the alignment of the buffer when it is not lent (a load's buffers are page-aligned,
/// so that posix's O_DIRECT reads can fill them without a copy: posix::reader::reads_in_place).
/// `HugePages`: whether a buffer of 2 MiB or more that is not lent lies in transparent huge pages
/// (huge_page_allocator), for buffers kept from one use to the next: copied into after seconds
/// untouched, as an async save's snapshot is, ordinary pages cost a page-table walk per 4 KiB.
template <class D, std::size_t Align = __STDCPP_DEFAULT_NEW_ALIGNMENT__, bool HugePages = false>
class staging_buffer {
 public:
  void resize(std::size_t n, D& device) {
    if constexpr (lends_buffers<D>) {
      if (lent_.capacity() >= n && lent_.capacity() != 0) {
        size_ = n;
        lent_used_ = true;
        return;
      }
      lent_ = lent_buffer{};  // give the smaller one back before asking for a bigger one
      if (n != 0) lent_ = device.lend(n);
      if (lent_.capacity() >= n && lent_.capacity() != 0) {
        size_ = n;
        lent_used_ = true;
        vec_ = {};
        return;
      }
    }
    (void)device;
    lent_used_ = false;
    vec_.resize(n);
    size_ = n;
  }
  /// Resizes without borrowing (safe on any thread): within the lent memory when it fits,
  /// else in a vector.
  void resize_without_borrowing(std::size_t n) {
    if (lent_used_ && n <= lent_.capacity()) {
      size_ = n;
      return;
    }
    lent_used_ = false;
    vec_.resize(n);
    size_ = n;
  }
  std::byte* data() noexcept { return lent_used_ ? lent_.data() : vec_.data(); }
  const std::byte* data() const noexcept { return lent_used_ ? lent_.data() : vec_.data(); }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::span<std::byte> span() noexcept { return {data(), size_}; }
  std::span<const std::byte> span() const noexcept { return {data(), size_}; }
  /// Whether the bytes are in memory the policy lent.
  bool lent() const noexcept { return lent_used_; }

 private:
  using allocator = std::conditional_t<HugePages, huge_page_allocator<std::byte, Align, false>,
                                       std::conditional_t<(Align > __STDCPP_DEFAULT_NEW_ALIGNMENT__),
                                                          aligned_allocator<std::byte, Align>, std::allocator<std::byte>>>;
  lent_buffer lent_;
  std::vector<std::byte, allocator> vec_;
  std::size_t size_ = 0;
  bool lent_used_ = false;
};

/// The copies into staging buffers that a DevicePolicy left in flight (`starts_copies`), for
/// one pipeline slot or one snapshot: `start` enqueues a copy, and `wait` returns once all have
/// landed. Destroying it waits too, so it is declared after the buffers it fills. A policy that
/// cannot leave a copy in flight makes each at once, with `to_host`.
template <class D>
class copies_in_flight {
 public:
  void start(D& device, const tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst) { device.to_host(t, offset, dst); }
  void wait() noexcept {}
};

template <starts_copies D>
class copies_in_flight<D> {
 public:
  /// At most this many copies are left in flight: past it, `start` waits for the oldest first.
  /// Seven queued behind it keep the copy engine busy, and an item of many small chunks (or a
  /// snapshot of many tensors) holds 8 handles, and their events, instead of one per chunk.
  static constexpr std::size_t most_in_flight = 8;

  void start(D& device, const tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst) {
    if (started_.size() == most_in_flight) {
      started_.front().wait();
      started_.pop_front();
    }
    started_.push_back(device.start_to_host(t, offset, dst));
  }
  /// Waits for every copy started, in order; the first failure is thrown (the copies after it
  /// are waited for when this is destroyed or waited on again).
  void wait() {
    for (auto& c : started_) c.wait();
    started_.clear();
  }

 private:
  std::deque<started_copy<D>> started_;
};

}  // namespace ckpt::detail
