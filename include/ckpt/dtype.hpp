#pragma once
/// @file dtype.hpp
/// Element types of tensors, and the 16-bit and 8-bit float storage types C++ lacks.

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>

namespace ckpt {

static_assert(std::endian::native == std::endian::little,
              "ckpt stores little-endian bytes and currently supports little-endian hosts only");

/// Element type of a tensor. The numeric values are the ids written to disk (docs/format.md):
/// never renumber them.
enum class dtype : std::uint8_t {
  f64 = 1,
  f32 = 2,
  f16 = 3,
  bf16 = 4,
  i64 = 5,
  i32 = 6,
  i16 = 7,
  i8 = 8,
  u8 = 9,
  boolean = 10,  ///< one byte per element, 0 or 1 (like torch.bool)
  u16 = 11,
  u32 = 12,
  u64 = 13,
  f8_e4m3 = 14,  ///< FP8 E4M3, the "fn" variant (torch.float8_e4m3fn, safetensors F8_E4M3): no infinities
  f8_e5m2 = 15,  ///< FP8 E5M2 (torch.float8_e5m2, safetensors F8_E5M2): binary16's upper byte
};

/// The highest on-disk dtype id this version of ckpt knows; ids 1 to `last_dtype_id` are all
/// assigned. A reader refuses a higher id (a newer file) rather than guess its size.
inline constexpr std::uint8_t last_dtype_id = 15;

/// Bytes per element.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f64: case dtype::i64: case dtype::u64: return 8;
    case dtype::f32: case dtype::i32: case dtype::u32: return 4;
    case dtype::f16: case dtype::bf16: case dtype::i16: case dtype::u16: return 2;
    case dtype::i8: case dtype::u8: case dtype::boolean: case dtype::f8_e4m3: case dtype::f8_e5m2: return 1;
  }
  return 0;
}

/// The short name used in messages, metadata.json and the CLI ("f32", "bf16", "bool",
/// "f8_e4m3", ...).
constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f64: return "f64";
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::i64: return "i64";
    case dtype::i32: return "i32";
    case dtype::i16: return "i16";
    case dtype::i8: return "i8";
    case dtype::u8: return "u8";
    case dtype::boolean: return "bool";
    case dtype::u16: return "u16";
    case dtype::u32: return "u32";
    case dtype::u64: return "u64";
    case dtype::f8_e4m3: return "f8_e4m3";
    case dtype::f8_e5m2: return "f8_e5m2";
  }
  return "unknown";
}

/// The dtype with on-disk id `id`, or nothing when no dtype has that id (corrupt or newer file).
constexpr std::optional<dtype> dtype_from_id(std::uint64_t id) noexcept {
  if (id >= 1 && id <= last_dtype_id) return static_cast<dtype>(id);
  return std::nullopt;
}

/// The dtype named `name` ("f32", "bool", ...), or nothing.
constexpr std::optional<dtype> dtype_from_string(std::string_view name) noexcept {
  for (std::uint8_t id = 1; id <= last_dtype_id; ++id)
    if (to_string(static_cast<dtype>(id)) == name) return static_cast<dtype>(id);
  return std::nullopt;
}

/// True for the FP8 dtypes, f8_e4m3 and f8_e5m2. Their values are floating point (and
/// `element_as_double` reads them exactly), but they are storage formats: the training
/// frameworks scale them per tensor or per block with tensors of their own, so ckpt converts
/// nothing to or from them (`ckpt export --dtype` refuses them).
constexpr bool is_float8(dtype t) noexcept { return t == dtype::f8_e4m3 || t == dtype::f8_e5m2; }

/// True for f64, f32, f16, bf16 and the FP8 dtypes (`is_float8`).
constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f64 || t == dtype::f32 || t == dtype::f16 || t == dtype::bf16 || is_float8(t);
}

/// IEEE 754 binary16, stored as its bit pattern. Converts to and from float.
///
/// @code
/// std::vector<ckpt::float16> h(n);
/// h[0] = ckpt::float16(0.5f);
/// float back = static_cast<float>(h[0]);
/// @endcode
struct float16 {
  std::uint16_t bits = 0;

  constexpr float16() = default;
  explicit float16(float f) noexcept : bits(from_float(f)) {}
  explicit operator float() const noexcept { return to_float(bits); }
  friend constexpr bool operator==(float16, float16) = default;

  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u)  // inf or nan: keep nan-ness
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    if (abs >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow
    if (abs < 0x38800000u) {  // subnormal or zero in half precision
      // Add 0.5 (as a float) so the hardware rounds to nearest-even at the right bit.
      const float r = std::bit_cast<float>(abs) + 0.5f;
      return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(r) - 0x3f000000u));
    }
    const std::uint32_t odd = (abs >> 13) & 1u;
    const std::uint32_t rounded = abs + 0xc8000fffu + odd;  // rebias exponent, round to nearest even
    return static_cast<std::uint16_t>(sign | (rounded >> 13));
  }
  static float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    const std::uint32_t man = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: value = man * 2^-24
      const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
      return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
    }
    if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
    return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
  }
};

/// bfloat16 (the top 16 bits of an IEEE binary32), stored as its bit pattern.
///
/// @code
/// ckpt::bfloat16 b(3.0f);
/// float f = static_cast<float>(b);  // 3.0f
/// @endcode
struct bfloat16 {
  std::uint16_t bits = 0;

  constexpr bfloat16() = default;
  explicit bfloat16(float f) noexcept : bits(from_float(f)) {}
  explicit operator float() const noexcept { return to_float(bits); }
  friend constexpr bool operator==(bfloat16, bfloat16) = default;

  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet nan
    const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
    return static_cast<std::uint16_t>((x + rounding) >> 16);
  }
  static float to_float(std::uint16_t b) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
  }
};

/// FP8 E4M3 in its "fn" form (OCP FP8's E4M3; torch.float8_e4m3fn; safetensors F8_E4M3), stored
/// as its bit pattern: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits. It has no
/// infinities: 0x7f and 0xff are NaN, the largest finite value is 448 (0x7e), the smallest
/// subnormal 2^-9. Converts exactly to float; there is no conversion from float, because the
/// frameworks that write FP8 choose their own scaling and rounding.
///
/// @code
/// ckpt::float8_e4m3 x{0x38};
/// float f = static_cast<float>(x);  // 1.0f
/// @endcode
struct float8_e4m3 {
  std::uint8_t bits = 0;

  explicit constexpr operator float() const noexcept { return to_float(bits); }
  friend constexpr bool operator==(float8_e4m3, float8_e4m3) = default;

  static constexpr float to_float(std::uint8_t b) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
    const std::uint32_t exp = (b >> 3) & 0xfu;
    const std::uint32_t man = b & 0x7u;
    if (exp == 0xfu && man == 0x7u) return std::bit_cast<float>(sign | 0x7fc00000u);  // NaN
    if (exp == 0) {  // zero or subnormal: man * 2^-9, exact in float
      const float v = static_cast<float>(man) * 0.001953125f;
      return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
    }
    return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (man << 20));
  }
};

/// FP8 E5M2 (OCP FP8's E5M2; torch.float8_e5m2; safetensors F8_E5M2), stored as its bit pattern:
/// the upper byte of an IEEE binary16, with its infinities and NaNs. Converts exactly to float;
/// as for `float8_e4m3`, there is no conversion from float.
///
/// @code
/// ckpt::float8_e5m2 x{0x3c};
/// float f = static_cast<float>(x);  // 1.0f
/// @endcode
struct float8_e5m2 {
  std::uint8_t bits = 0;

  explicit operator float() const noexcept { return to_float(bits); }
  friend constexpr bool operator==(float8_e5m2, float8_e5m2) = default;

  static float to_float(std::uint8_t b) noexcept { return float16::to_float(static_cast<std::uint16_t>(b << 8)); }
};

/// The dtype of a C++ element type, for the types ckpt maps directly.
template <class T> struct dtype_of;
template <> struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};
template <> struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <> struct dtype_of<float16> : std::integral_constant<dtype, dtype::f16> {};
template <> struct dtype_of<bfloat16> : std::integral_constant<dtype, dtype::bf16> {};
template <> struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <> struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <> struct dtype_of<std::int16_t> : std::integral_constant<dtype, dtype::i16> {};
template <> struct dtype_of<std::int8_t> : std::integral_constant<dtype, dtype::i8> {};
template <> struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};
template <> struct dtype_of<std::uint16_t> : std::integral_constant<dtype, dtype::u16> {};
template <> struct dtype_of<std::uint32_t> : std::integral_constant<dtype, dtype::u32> {};
template <> struct dtype_of<std::uint64_t> : std::integral_constant<dtype, dtype::u64> {};
template <> struct dtype_of<float8_e4m3> : std::integral_constant<dtype, dtype::f8_e4m3> {};
template <> struct dtype_of<float8_e5m2> : std::integral_constant<dtype, dtype::f8_e5m2> {};
template <> struct dtype_of<bool> : std::integral_constant<dtype, dtype::boolean> {};

/// True when `T` is an element type ckpt stores directly.
template <class T>
concept element_type = requires { dtype_of<std::remove_cv_t<T>>::value; };

static_assert(sizeof(bool) == 1, "ckpt stores bool tensors as one byte per element");

/// Reads element `i` of a buffer of dtype `t` as a double (used to compare validation logits
/// and by `ckpt diff`). Exact for every dtype but 64-bit integers beyond 2^53.
inline double element_as_double(const std::byte* p, dtype t, std::size_t i) noexcept {
  auto get = [&]<class T>(T) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  };
  switch (t) {
    case dtype::f64: return get(double{});
    case dtype::f32: return get(float{});
    case dtype::f16: return float16::to_float(get(std::uint16_t{}));
    case dtype::bf16: return bfloat16::to_float(get(std::uint16_t{}));
    case dtype::i64: return static_cast<double>(get(std::int64_t{}));
    case dtype::i32: return get(std::int32_t{});
    case dtype::i16: return get(std::int16_t{});
    case dtype::i8: return get(std::int8_t{});
    case dtype::u8: return get(std::uint8_t{});
    case dtype::boolean: return get(std::uint8_t{}) != 0 ? 1.0 : 0.0;
    case dtype::u16: return get(std::uint16_t{});
    case dtype::u32: return get(std::uint32_t{});
    case dtype::u64: return static_cast<double>(get(std::uint64_t{}));
    case dtype::f8_e4m3: return float8_e4m3::to_float(get(std::uint8_t{}));
    case dtype::f8_e5m2: return float8_e5m2::to_float(get(std::uint8_t{}));
  }
  return std::nan("");
}

}  // namespace ckpt
