#pragma once
/// @file shape.hpp
/// `shape_t`: a tensor's extents, one per dimension, with up to two of them held inline.

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <span>
#include <stdexcept>
#include <vector>

namespace ckpt {

/// Shape of a tensor: one extent per dimension, outermost first (row-major). `{}` is a scalar.
///
/// It behaves like the `std::vector<std::uint64_t>` it used to be (the same members, comparisons
/// and conversions both ways), but keeps up to `inline_capacity` extents inside itself: a
/// tensor's shape is copied at every stage of a save and a load, and a model of 100,000 tensors
/// paid an allocation for each copy.
///
/// @code
/// ckpt::shape_t s{4096, 1024};
/// s.push_back(2);                            // {4096, 1024, 2}
/// std::vector<std::uint64_t> v = s;          // converts both ways
/// std::span<const std::uint64_t> dims = s;   // contiguous, like a vector
/// @endcode
class shape_t {
 public:
  using value_type = std::uint64_t;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = value_type&;
  using const_reference = const value_type&;
  using pointer = value_type*;
  using const_pointer = const value_type*;
  using iterator = value_type*;
  using const_iterator = const value_type*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  /// Extents held without an allocation; more go to the heap.
  static constexpr size_type inline_capacity = 2;

  shape_t() noexcept {}
  explicit shape_t(size_type n) { assign(n, 0); }
  shape_t(size_type n, value_type v) { assign(n, v); }
  shape_t(std::initializer_list<value_type> l) { assign(l.begin(), l.end()); }
  template <std::input_iterator It>
  shape_t(It first, It last) {
    assign(first, last);
  }
  shape_t(const std::vector<value_type>& v) { assign(v.begin(), v.end()); }  // NOLINT: implicit, as a vector was
  shape_t(const shape_t& o) { assign(o.begin(), o.end()); }
  shape_t(shape_t&& o) noexcept { steal(o); }
  shape_t& operator=(const shape_t& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  shape_t& operator=(shape_t&& o) noexcept {
    if (this != &o) {
      release();
      steal(o);
    }
    return *this;
  }
  shape_t& operator=(std::initializer_list<value_type> l) {
    assign(l.begin(), l.end());
    return *this;
  }
  ~shape_t() { release(); }

  operator std::vector<value_type>() const { return {begin(), end()}; }  // NOLINT: implicit, as it was one

  value_type* data() noexcept { return heap() ? u_.heap : u_.inline_; }
  const value_type* data() const noexcept { return heap() ? u_.heap : u_.inline_; }
  size_type size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_type capacity() const noexcept { return cap_; }
  static constexpr size_type max_size() noexcept { return std::uint32_t(-1); }

  iterator begin() noexcept { return data(); }
  iterator end() noexcept { return data() + size_; }
  const_iterator begin() const noexcept { return data(); }
  const_iterator end() const noexcept { return data() + size_; }
  const_iterator cbegin() const noexcept { return begin(); }
  const_iterator cend() const noexcept { return end(); }
  reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }

  value_type& operator[](size_type i) noexcept { return data()[i]; }
  const value_type& operator[](size_type i) const noexcept { return data()[i]; }
  value_type& at(size_type i) {
    if (i >= size_) throw std::out_of_range("ckpt::shape_t::at");
    return data()[i];
  }
  const value_type& at(size_type i) const {
    if (i >= size_) throw std::out_of_range("ckpt::shape_t::at");
    return data()[i];
  }
  value_type& front() noexcept { return data()[0]; }
  const value_type& front() const noexcept { return data()[0]; }
  value_type& back() noexcept { return data()[size_ - 1]; }
  const value_type& back() const noexcept { return data()[size_ - 1]; }

  void reserve(size_type n) {
    if (n <= cap_) return;
    if (n > max_size()) throw std::length_error("ckpt::shape_t: too many dimensions");
    auto* p = new value_type[n];
    if (size_) std::memcpy(p, data(), size_ * sizeof(value_type));
    release();
    u_.heap = p;
    cap_ = static_cast<std::uint32_t>(n);
  }
  void resize(size_type n) { resize(n, 0); }
  void resize(size_type n, value_type v) {
    if (n > size_) {
      if (n > cap_) reserve(grown(n));
      std::fill(data() + size_, data() + n, v);
    }
    size_ = static_cast<std::uint32_t>(n);
  }
  void clear() noexcept { size_ = 0; }
  void push_back(value_type v) {
    if (size_ == cap_) reserve(grown(size_ + 1));
    data()[size_++] = v;
  }
  value_type& emplace_back(value_type v) {
    push_back(v);
    return back();
  }
  void pop_back() noexcept { --size_; }
  void assign(size_type n, value_type v) {
    if (n > cap_) reserve(n);  // throws before anything changes
    std::fill(data(), data() + n, v);
    size_ = static_cast<std::uint32_t>(n);
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    if constexpr (std::forward_iterator<It>) {
      const auto n = static_cast<size_type>(std::distance(first, last));
      if (n > cap_) reserve(n);  // throws before anything changes
      std::copy(first, last, data());  // also right when [first, last) is this shape itself
      size_ = static_cast<std::uint32_t>(n);
    } else {
      size_ = 0;
      for (; first != last; ++first) push_back(static_cast<value_type>(*first));
    }
  }
  void assign(std::initializer_list<value_type> l) { assign(l.begin(), l.end()); }

  iterator insert(const_iterator pos, value_type v) { return insert(pos, size_type{1}, v); }
  iterator insert(const_iterator pos, size_type n, value_type v) {
    const auto at = static_cast<size_type>(pos - begin());
    make_room(at, n);
    std::fill(data() + at, data() + at + n, v);
    return data() + at;
  }
  template <std::input_iterator It>
  iterator insert(const_iterator pos, It first, It last) {
    const auto at = static_cast<size_type>(pos - begin());
    const shape_t copy(first, last);  // the range may lie in this shape
    make_room(at, copy.size());
    std::copy(copy.begin(), copy.end(), data() + at);
    return data() + at;
  }
  iterator insert(const_iterator pos, std::initializer_list<value_type> l) { return insert(pos, l.begin(), l.end()); }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const auto at = static_cast<size_type>(first - begin());
    const auto n = static_cast<size_type>(last - first);
    std::copy(data() + at + n, end(), data() + at);
    size_ -= static_cast<std::uint32_t>(n);
    return data() + at;
  }

  void swap(shape_t& o) noexcept {
    shape_t t(std::move(o));
    o = std::move(*this);
    *this = std::move(t);
  }
  friend void swap(shape_t& a, shape_t& b) noexcept { a.swap(b); }

  friend bool operator==(const shape_t& a, const shape_t& b) noexcept {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend std::strong_ordering operator<=>(const shape_t& a, const shape_t& b) noexcept {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool heap() const noexcept { return cap_ > inline_capacity; }
  size_type grown(size_type n) const noexcept { return std::max<size_type>(n, 2 * size_type{cap_}); }
  void release() noexcept {
    if (heap()) delete[] u_.heap;
    cap_ = inline_capacity;
  }
  void steal(shape_t& o) noexcept {
    size_ = o.size_;
    cap_ = o.cap_;
    if (o.heap())
      u_.heap = o.u_.heap;
    else
      std::memcpy(u_.inline_, o.u_.inline_, o.size_ * sizeof(value_type));
    o.size_ = 0;
    o.cap_ = inline_capacity;
  }
  void make_room(size_type at, size_type n) {
    if (size_ + n > cap_) reserve(grown(size_ + n));
    std::copy_backward(data() + at, data() + size_, data() + size_ + n);
    size_ += static_cast<std::uint32_t>(n);
  }

  std::uint32_t size_ = 0;
  std::uint32_t cap_ = inline_capacity;
  union storage {
    value_type inline_[inline_capacity];
    value_type* heap;
  } u_{};
};

}  // namespace ckpt
