#pragma once
// Element conversions for `ckpt export --dtype`: floating-point tensors to another
// floating-point dtype, rounding to nearest even (f64 to f16/bf16 rounds through f32).

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include <ckpt/dtype.hpp>
#include <ckpt/error.hpp>

namespace ckpt_tool {

/// Converts `n` elements of floating dtype `from` at `in` to floating dtype `to` at `out`.
inline void convert_elements(const std::byte* in, ckpt::dtype from, std::byte* out, ckpt::dtype to, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    const double v = ckpt::element_as_double(in, from, i);
    switch (to) {
      case ckpt::dtype::f64: std::memcpy(out + i * 8, &v, 8); break;
      case ckpt::dtype::f32: {
        const auto f = static_cast<float>(v);
        std::memcpy(out + i * 4, &f, 4);
        break;
      }
      case ckpt::dtype::f16: {
        const auto h = ckpt::float16(static_cast<float>(v));
        std::memcpy(out + i * 2, &h, 2);
        break;
      }
      case ckpt::dtype::bf16: {
        const auto b = ckpt::bfloat16(static_cast<float>(v));
        std::memcpy(out + i * 2, &b, 2);
        break;
      }
      default:
        throw ckpt::error(ckpt::error_kind::invalid_argument, "--dtype must be a floating-point dtype, not " + std::string(ckpt::to_string(to)));
    }
  }
}

}  // namespace ckpt_tool
