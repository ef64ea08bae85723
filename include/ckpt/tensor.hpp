#pragma once
/// @file tensor.hpp
/// `tensor_ref`: what ckpt knows about one tensor of the user's state (dtype, shape, where its
/// bytes live, and which slice of a larger global tensor it is).

#include <algorithm>
#include <array>
#include <cstddef>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtype.hpp"
#include "error.hpp"
#include "shape.hpp"

#include "impl/decl.hpp"

namespace ckpt {

/// Where a tensor's bytes live.
struct device {
  /// `external`: bytes only a DevicePolicy written for them can reach, such as the tensors
  /// of a file the DevicePolicy reads piece by piece while they are saved.
  enum class kind : std::uint8_t { host, cuda, external };
  kind type = kind::host;
  int id = 0;  ///< the CUDA device ordinal when `type == kind::cuda`; the DevicePolicy's own number when `external`

  static constexpr device host() noexcept { return {}; }
  static constexpr device cuda(int ordinal) noexcept { return {kind::cuda, ordinal}; }
  static constexpr device external(int id) noexcept { return {kind::external, id}; }
  friend constexpr bool operator==(device, device) = default;
};

/// A shape or an offset in the user's own integer type: `{rows, cols}` with `int`, `int64_t`
/// or `size_t` sizes (mixed, too), a `shape_t`, or any range of integers (`std::vector<int>`,
/// `std::array<std::int64_t, 2>`, LibTorch's `IntArrayRef`), without narrowing warnings. A
/// negative value is kept as it is (a value of 2^63 or above) so that `v.tensor` can refuse the
/// tensor by name: sizes and offsets must lie below 2^63.
///
/// @code
/// int rows = 64, cols = 32;
/// v.tensor("fc.weight", ckpt::view(w.data(), {rows, cols}));
/// @endcode
class extents : public shape_t {
 public:
  extents() = default;
  extents(shape_t dims) noexcept : shape_t(std::move(dims)) {}  // NOLINT: implicit on purpose
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  extents(std::initializer_list<I> dims) {  // NOLINT: {64, 32}
    reserve(dims.size());
    for (const auto d : dims) push_back(static_cast<std::uint64_t>(d));
  }
  template <std::integral... I>
    requires(sizeof...(I) >= 2 && (!std::same_as<I, bool> && ...))
  extents(I... dims) {  // NOLINT: {rows, 0} with rows and 0 of different types
    (push_back(static_cast<std::uint64_t>(dims)), ...);
  }
  template <class R>
    requires(!std::convertible_to<const R&, shape_t> && requires(const R& r) {
      { *std::begin(r) } -> std::convertible_to<std::int64_t>;
      std::end(r);
    } && std::integral<std::remove_cvref_t<decltype(*std::begin(std::declval<const R&>()))>>)
  extents(const R& dims) {  // NOLINT: a range of the user's integers
    for (const auto d : dims) push_back(static_cast<std::uint64_t>(d));
  }
};

namespace detail {
/// Sizes and offsets at or above this were negative in the user's signed type.
inline constexpr std::uint64_t first_negative = std::uint64_t{1} << 63;
/// "dimension 1 is -3", for the first entry of `dims` that was negative, or "".
CKPT_DECL std::string negative_entry(std::span<const std::uint64_t> dims);
}  // namespace detail

/// The order in which a tensor's bytes hold its elements.
///
/// ckpt itself handles every tensor as row-major (C order) of the shape it is given. A
/// column-major (Fortran order) tensor of logical shape [d0, ..., dn] is handed to ckpt with its
/// *memory-order* shape [dn, ..., d0] and marked `column_major`: chunking, checksums and
/// resharding then work on it unchanged, and the mark is stored so that a load into the other
/// order is refused instead of transposing the data silently. Scalars and vectors are always
/// `row_major`. The Eigen adapter (ckpt/adapters/eigen.hpp) sets it for you.
///
/// @code
/// // a 3x4 column-major matrix: its bytes are a row-major 4x3 array
/// v.tensor("w", ckpt::view(m.data(), {4, 3}).laid_out(ckpt::layout::column_major));
/// @endcode
enum class layout : std::uint8_t { row_major, column_major };

/// "row-major" or "column-major", for messages.
constexpr std::string_view to_string(layout l) noexcept { return l == layout::column_major ? "column-major" : "row-major"; }

namespace detail {
/// The shape a user knows a tensor by: `memory_order` itself for a row-major tensor, reversed for
/// a column-major one.
inline shape_t logical_shape(shape_t memory_order, layout l) {
  if (l == layout::column_major) std::reverse(memory_order.begin(), memory_order.end());
  return memory_order;
}
}  // namespace detail

/// Which part of a global tensor a local tensor holds.
///
/// A tensor without a shard spec is the whole global tensor. With one, it is the slice that
/// starts at `offset` (one entry per dimension) inside `global_shape`; any dimension may be
/// split and splits may be uneven. A replicated tensor is a full copy held by several ranks:
/// ckpt stores its bytes once.
///
/// @code
/// // rank r of tp=4 holds rows [r*256, r*256+256) of a 1024x512 weight
/// ckpt::shard_spec s{.global_shape = {1024, 512}, .offset = {r * 256, 0}};
/// @endcode
struct shard_spec {
  extents global_shape;
  extents offset;
  bool replicated = false;

  /// A full copy of the tensor that other ranks hold too.
  static shard_spec replica() { return {.global_shape = {}, .offset = {}, .replicated = true}; }
};

namespace detail {
/// a*b, or an invalid_argument error naming `what` when the product does not fit in 64 bits.
CKPT_DECL std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const std::string& what);
/// Number of elements of `shape`, checked for overflow.
CKPT_DECL std::uint64_t element_count(std::span<const std::uint64_t> shape, const std::string& what);
/// The elements of `shape` times `element_size` (in that order, as element_count then
/// checked_mul), or nothing when that does not fit in 64 bits. For checks made once per tensor,
/// which build their message only when it fails: a state of 100,000 tensors would otherwise
/// build several strings per tensor that no one reads.
inline std::optional<std::uint64_t> checked_size(std::span<const std::uint64_t> shape, std::uint64_t element_size = 1) noexcept {
  std::uint64_t n = 1;
  for (const auto e : shape) {
    if (n != 0 && e > std::numeric_limits<std::uint64_t>::max() / n) return std::nullopt;
    n *= e;
  }
  if (n != 0 && element_size > std::numeric_limits<std::uint64_t>::max() / n) return std::nullopt;
  return n * element_size;
}
/// "[3, 4]" for messages and metadata.
CKPT_DECL std::string to_string(std::span<const std::uint64_t> shape);
}  // namespace detail

/// A reference to one tensor of the user's state: ckpt reads from it on save and writes into
/// it on load. It does not own the bytes; they must stay valid for the call.
///
/// Usually made for you by the adapters (`v.tensor("w", my_vector)`); make one yourself for
/// memory ckpt cannot see the shape of:
/// @code
/// float* w = engine.weights();
/// v.tensor("layers.0.w", ckpt::view(w, {4096, 1024}));
/// @endcode
class tensor_ref {
 public:
  tensor_ref(dtype type, shape_t shape, void* data, device where = device::host());  // impl/tensor.ipp
  /// A read-only tensor: saving works, loading into it is an error.
  tensor_ref(dtype type, shape_t shape, const void* data, device where = device::host())
      : tensor_ref(type, std::move(shape), const_cast<void*>(data), where) {
    writable_ = false;
  }

  /// As the constructor, but a shape with a negative size or more than 2^64 elements is kept
  /// with `problem()` saying what is wrong (and no bytes) instead of throwing, so that
  /// `v.tensor` can refuse it naming the tensor. What `view` makes.
  static tensor_ref checked_later(dtype type, shape_t shape, std::byte* data, bool writable,
                                  device where = device::host());


  /// A tensor `v.tensor` refuses, with an invalid_argument error naming it and saying `why`:
  /// how an adapter's `tensor_traits::ref`, which does not know the name, rejects its input.
  ///
  /// @code
  /// if (!t.is_contiguous()) return ckpt::tensor_ref::refused("it is not contiguous");
  /// @endcode
  static tensor_ref refused(std::string why) {
    tensor_ref t(dtype::u8, shape_t{0}, static_cast<void*>(nullptr));
    t.problem_ = std::move(why);
    return t;
  }

  /// What makes this tensor unusable (a negative size given to `view`), or empty.
  const std::string& problem() const noexcept { return problem_; }

  dtype type() const noexcept { return type_; }
  const shape_t& shape() const noexcept { return shape_; }
  std::byte* data() const noexcept { return data_; }
  device where() const noexcept { return where_; }
  std::uint64_t numel() const noexcept { return size_of(type_) ? bytes_ / size_of(type_) : 0; }
  std::uint64_t nbytes() const noexcept { return bytes_; }
  bool writable() const noexcept { return writable_; }

  /// Declares which slice of a global tensor this is (see `shard_spec`). Returns *this.
  tensor_ref& sharded(shard_spec s) & {
    shard_ = std::move(s);
    return *this;
  }
  tensor_ref&& sharded(shard_spec s) && {
    shard_ = std::move(s);
    return std::move(*this);
  }
  const std::optional<shard_spec>& shard() const noexcept { return shard_; }

  /// Declares the order of the tensor's bytes (see `layout`); the shape given to the
  /// constructor is then the memory-order shape. Returns *this.
  ///
  /// @code
  /// // a column-major rows x cols matrix is registered with shape {cols, rows}
  /// auto t = ckpt::view(m.data(), {cols, rows}).laid_out(ckpt::layout::column_major);
  /// @endcode
  tensor_ref& laid_out(layout l) & {
    order_ = l;
    return *this;
  }
  tensor_ref&& laid_out(layout l) && {
    order_ = l;
    return std::move(*this);
  }
  /// The order of the tensor's bytes: `row_major` unless `laid_out` said otherwise.
  ///
  /// @code
  /// if (t.order() == ckpt::layout::column_major) { /* t.shape() is reversed */ }
  /// @endcode
  layout order() const noexcept { return order_; }

  /// Global shape: the shard spec's, or the local shape when the tensor is whole or replicated.
  const shape_t& global_shape() const noexcept {
    return shard_ && !shard_->replicated ? shard_->global_shape : shape_;
  }
  /// Offset of this slice in the global tensor (all zeros when whole or replicated).
  shape_t global_offset() const {
    if (shard_ && !shard_->replicated) return shard_->offset;
    return shape_t(shape_.size(), 0);
  }

 private:
  dtype type_;
  shape_t shape_;
  std::byte* data_;
  device where_;
  std::uint64_t bytes_ = 0;
  bool writable_ = true;
  layout order_ = layout::row_major;
  std::optional<shard_spec> shard_;
  std::string problem_;
};

/// A tensor over `data` with the given shape. `T` must be an element type (see `dtype_of`).
///
/// @code
/// std::vector<float> w(64 * 32);
/// v.tensor("fc.weight", ckpt::view(w.data(), {64, 32}));
/// @endcode
template <element_type T>
tensor_ref view(T* data, extents shape, device where = device::host()) {
  using E = std::remove_cv_t<T>;
  return tensor_ref::checked_later(dtype_of<E>::value, std::move(shape), reinterpret_cast<std::byte*>(const_cast<E*>(data)),
                                   !std::is_const_v<T>, where);
}

/// A tensor over a vector's elements with the given shape, which must hold exactly `v.size()`
/// elements.
template <element_type T, class A>
tensor_ref view(std::vector<T, A>& v, extents shape) {
  static_assert(!std::is_same_v<T, bool>, "ckpt: std::vector<bool> is not contiguous: use std::vector<std::uint8_t>");
  if (!detail::negative_entry(shape).empty()) return view(v.data(), std::move(shape));  // refused by v.tensor, by name
  const auto count = detail::checked_size(shape);
  if (!count) throw error(error_kind::invalid_argument, "view of shape " + detail::to_string(shape) + ": element count overflows 64 bits");
  const auto n = *count;
  if (n != v.size())
    throw error(error_kind::invalid_argument, "view of shape " + detail::to_string(shape) + " needs " +
                                                  std::to_string(n) + " elements, the vector holds " +
                                                  std::to_string(v.size()));
  return view(v.data(), std::move(shape));
}

}  // namespace ckpt

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "impl/tensor.ipp"
#endif
