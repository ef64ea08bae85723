#pragma once
// Packed integer columns. On disk, each chunk column (docs/format.md, section 5.3) stores its
// values as little-endian integers of the fewest whole bytes that hold the column's largest
// value: 0 bytes when every value is zero, at most 8. A job of 4096 ranks describes millions
// of chunks whose offsets, shapes and sizes need 1 to 4 bytes, not 8; packing shrinks
// chunk_map.bin about threefold, and writing it durably is most of what a commit at that scale
// costs rank 0. Fixed widths (not varints) keep every column a flat array that is packed and
// unpacked in tight loops.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ckpt::detail {

static_assert(std::endian::native == std::endian::little, "ckpt's binary records assume a little-endian host");

/// The width, in bytes, a packed column needs when `bits` is the OR of all its values.
constexpr unsigned packed_width(std::uint64_t bits) noexcept {
  return static_cast<unsigned>((64 - std::countl_zero(bits) + 7) / 8);
}

/// The OR of `n` values spaced `stride` apart, whose packed_width is the column's width.
template <class T>
std::uint64_t column_bits(const T* values, std::size_t n, std::size_t stride) noexcept {
  std::uint64_t bits = 0;
  for (std::size_t i = 0; i < n; ++i) bits |= values[i * stride];
  return bits;
}

namespace packed_impl {
/// Calls `f(std::integral_constant<unsigned, W>{})` for the width `w` (1 to 8), so the loops
/// below are compiled once per width with a constant-size memcpy.
template <class F>
void with_width(unsigned w, F&& f) {
  switch (w) {
    case 1: return f(std::integral_constant<unsigned, 1>{});
    case 2: return f(std::integral_constant<unsigned, 2>{});
    case 3: return f(std::integral_constant<unsigned, 3>{});
    case 4: return f(std::integral_constant<unsigned, 4>{});
    case 5: return f(std::integral_constant<unsigned, 5>{});
    case 6: return f(std::integral_constant<unsigned, 6>{});
    case 7: return f(std::integral_constant<unsigned, 7>{});
    default: return f(std::integral_constant<unsigned, 8>{});
  }
}
}  // namespace packed_impl

/// Writes `n` values (`values[i * stride]`) as `w`-byte little-endian integers at `out`
/// (n × w bytes). Every value must fit in `w` bytes.
template <class T>
void pack(std::byte* out, const T* values, std::size_t n, std::size_t stride, unsigned w) noexcept {
  if (w == 0) return;
  packed_impl::with_width(w, [&](auto width) {
    constexpr unsigned W = decltype(width)::value;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t v = values[i * stride];
      std::memcpy(out + i * W, &v, W);
    }
  });
}

/// Reads `n` `w`-byte little-endian integers at `in` into `out[i * stride]`. `w` must be at
/// most 8, and at most sizeof(T) (the reader checks widths before it unpacks).
template <class T>
void unpack(const std::byte* in, unsigned w, std::size_t n, T* out, std::size_t stride) noexcept {
  if (w == 0) {
    for (std::size_t i = 0; i < n; ++i) out[i * stride] = 0;
    return;
  }
  if (w == 8 && stride == 1 && sizeof(T) == 8) {  // already in memory's layout
    if (n) std::memcpy(out, in, n * 8);
    return;
  }
  packed_impl::with_width(w, [&](auto width) {
    constexpr unsigned W = decltype(width)::value;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint64_t v = 0;
      std::memcpy(&v, in + i * W, W);
      out[i * stride] = static_cast<T>(v);
    }
  });
}

}  // namespace ckpt::detail
