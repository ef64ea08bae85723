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
template <unsigned W, class T>
void pack(std::byte* out, const T* values, std::size_t n, std::size_t stride) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t v = values[i * stride];
    std::memcpy(out + i * W, &v, W);
  }
}
template <unsigned W, class T>
void unpack(const std::byte* in, std::size_t n, T* out, std::size_t stride) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t v = 0;
    std::memcpy(&v, in + i * W, W);
    out[i * stride] = static_cast<T>(v);
  }
}
}  // namespace packed_impl

/// Writes `n` values (`values[i * stride]`) as `w`-byte little-endian integers at `out`
/// (n × w bytes). Every value must fit in `w` bytes.
template <class T>
void pack(std::byte* out, const T* values, std::size_t n, std::size_t stride, unsigned w) noexcept {
  switch (w) {
    case 0: return;
    case 1: return packed_impl::pack<1>(out, values, n, stride);
    case 2: return packed_impl::pack<2>(out, values, n, stride);
    case 3: return packed_impl::pack<3>(out, values, n, stride);
    case 4: return packed_impl::pack<4>(out, values, n, stride);
    case 5: return packed_impl::pack<5>(out, values, n, stride);
    case 6: return packed_impl::pack<6>(out, values, n, stride);
    case 7: return packed_impl::pack<7>(out, values, n, stride);
    default: return packed_impl::pack<8>(out, values, n, stride);
  }
}

/// Reads `n` `w`-byte little-endian integers at `in` into `out[i * stride]`. `w` must be at
/// most 8, and at most sizeof(T) (the reader checks widths before it unpacks).
template <class T>
void unpack(const std::byte* in, unsigned w, std::size_t n, T* out, std::size_t stride) noexcept {
  switch (w) {
    case 0:
      for (std::size_t i = 0; i < n; ++i) out[i * stride] = 0;
      return;
    case 1: return packed_impl::unpack<1>(in, n, out, stride);
    case 2: return packed_impl::unpack<2>(in, n, out, stride);
    case 3: return packed_impl::unpack<3>(in, n, out, stride);
    case 4: return packed_impl::unpack<4>(in, n, out, stride);
    case 5: return packed_impl::unpack<5>(in, n, out, stride);
    case 6: return packed_impl::unpack<6>(in, n, out, stride);
    case 7: return packed_impl::unpack<7>(in, n, out, stride);
    default:
      if (stride == 1 && sizeof(T) == 8) {
        if (n) std::memcpy(out, in, n * 8);
        return;
      }
      return packed_impl::unpack<8>(in, n, out, stride);
  }
}

}  // namespace ckpt::detail
