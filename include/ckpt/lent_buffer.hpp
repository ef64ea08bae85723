#pragma once
/// @file lent_buffer.hpp
/// Host memory a DevicePolicy lends ckpt's save and load pipelines for their own buffers. A GPU
/// policy lends pinned memory: a chunk staged into such a buffer crosses PCIe in one copy,
/// straight into the buffer the pipeline hashes and writes, instead of through a bounce buffer.

#include <cstddef>
#include <functional>
#include <span>
#include <utility>

namespace ckpt {

/// An owning, move-only host buffer that goes back to whoever lent it when destroyed. An empty
/// one (capacity 0) is a refusal: the borrower uses ordinary memory instead.
///
/// @code
/// // a DevicePolicy that lends buffers
/// ckpt::lent_buffer lend(std::size_t n) {
///   void* p = pool.take(n);
///   if (!p) return {};  // over budget: refuse
///   return ckpt::lent_buffer(static_cast<std::byte*>(p), n, [this](std::byte* q, std::size_t) { pool.give_back(q); });
/// }
/// @endcode
class lent_buffer {
 public:
  using give_back_fn = std::function<void(std::byte*, std::size_t)>;

  lent_buffer() = default;
  lent_buffer(std::byte* data, std::size_t capacity, give_back_fn give_back)
      : data_(data), capacity_(capacity), give_back_(std::move(give_back)) {}
  lent_buffer(lent_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)), give_back_(std::move(o.give_back_)) {}
  lent_buffer& operator=(lent_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
      give_back_ = std::move(o.give_back_);
    }
    return *this;
  }
  lent_buffer(const lent_buffer&) = delete;
  lent_buffer& operator=(const lent_buffer&) = delete;
  ~lent_buffer() { release(); }

  std::byte* data() const noexcept { return data_; }
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  void release() noexcept {
    if (data_ && give_back_) give_back_(data_, capacity_);
    data_ = nullptr;
    capacity_ = 0;
  }
  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
  give_back_fn give_back_;
};

}  // namespace ckpt
