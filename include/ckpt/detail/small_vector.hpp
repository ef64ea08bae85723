#pragma once
// A vector of plain values that holds its first N inside itself. Made for what a model of many
// small tensors has one of per tensor almost always, such as the file runs of a grid layout (one
// run: the tensor's cells in one file, or one per rank in rank order): with a std::vector, each
// of 100,000 tensors cost an allocation at a save's commit and another at every load.

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <type_traits>

namespace ckpt::detail {

template <class T, std::size_t N>
class small_vector {
  static_assert(std::is_trivially_copyable_v<T>, "small_vector holds plain values only");
  static_assert(N > 0, "small_vector holds at least one value inside itself");

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  small_vector() = default;
  small_vector(std::initializer_list<T> v) { assign(v.begin(), v.end()); }
  small_vector(const small_vector& o) { assign(o.begin(), o.end()); }
  small_vector(small_vector&& o) noexcept { take(o); }
  small_vector& operator=(const small_vector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  small_vector& operator=(small_vector&& o) noexcept {
    if (this != &o) take(o);
    return *this;
  }
  small_vector& operator=(std::initializer_list<T> v) {
    assign(v.begin(), v.end());
    return *this;
  }

  T* data() noexcept { return heap_ ? heap_.get() : local_; }
  const T* data() const noexcept { return heap_ ? heap_.get() : local_; }
  std::size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }
  T* begin() noexcept { return data(); }
  T* end() noexcept { return data() + n_; }
  const T* begin() const noexcept { return data(); }
  const T* end() const noexcept { return data() + n_; }
  T& operator[](std::size_t i) noexcept { return data()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data()[i]; }
  T& back() noexcept { return data()[n_ - 1]; }

  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    std::unique_ptr<T[]> more(new T[n]);
    std::copy_n(data(), n_, more.get());
    heap_ = std::move(more);
    capacity_ = n;
  }
  void push_back(const T& v) {
    if (n_ == capacity_) reserve(2 * capacity_);
    data()[n_++] = v;
  }
  /// `n` values; those added are value-initialised.
  void resize(std::size_t n) {
    reserve(n);
    std::fill(data() + std::min(n, n_), data() + n, T{});
    n_ = n;
  }
  void assign(std::size_t n, const T& v) {
    n_ = 0;
    reserve(n);
    std::fill_n(data(), n, v);
    n_ = n;
  }
  template <class It>
  void assign(It first, It last) {
    n_ = 0;
    reserve(static_cast<std::size_t>(last - first));
    std::copy(first, last, data());
    n_ = static_cast<std::size_t>(last - first);
  }
  void clear() noexcept { n_ = 0; }

  friend bool operator==(const small_vector& a, const small_vector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void take(small_vector& o) noexcept {
    if (o.heap_) {
      heap_ = std::move(o.heap_);
      capacity_ = o.capacity_;
    } else {
      heap_.reset();
      capacity_ = N;
      std::copy_n(o.local_, o.n_, local_);
    }
    n_ = o.n_;
    o.capacity_ = N;
    o.n_ = 0;
  }

  std::unique_ptr<T[]> heap_;  // null while the values fit in local_
  std::size_t n_ = 0, capacity_ = N;
  T local_[N];
};

}  // namespace ckpt::detail
