#pragma once
// Element conversions for `ckpt export --dtype`: floating-point tensors to another
// floating-point dtype, rounding to nearest even (f64 to f16/bf16 rounds through f32). FP8
// tensors are refused: see exported_dtype.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include <ckpt/names.hpp>
#include <ckpt/dtype.hpp>
#include <ckpt/error.hpp>

namespace ckpt_tool {

/// The dtype tensor `name` (dtype `t`) is exported as under `--dtype to`: floating-point tensors
/// take `to`, integer and bool tensors keep their dtype. An FP8 tensor is refused with an error
/// naming it and both dtypes: its values mean something only with the scale tensors the
/// framework keeps beside it (per tensor or per block, as Transformer Engine and DeepSeek-V3
/// do), so a widened copy would be silently wrong weights, and narrowing to FP8 would need
/// those scales too.
inline ckpt::dtype exported_dtype(const std::string& name, ckpt::dtype t, std::optional<ckpt::dtype> to) {
  if (!to || !ckpt::is_floating(t)) return t;
  if (ckpt::is_float8(t) && *to != t)
    throw ckpt::error(ckpt::error_kind::invalid_argument,
                      "--dtype " + std::string(ckpt::to_string(*to)) + ": tensor " + ckpt::detail::printable(name) + " is " +
                          std::string(ckpt::to_string(t)) +
                          ", and FP8 tensors are not converted (their values need the scale tensors stored beside "
                          "them); export without --dtype to keep them as they are");
  return *to;
}

/// Converts `n` elements of floating dtype `from` at `in` to floating dtype `to` at `out`.
inline void convert_elements(const std::byte* in, ckpt::dtype from, std::byte* out, ckpt::dtype to, std::uint64_t n) {
  if (ckpt::is_float8(from))
    throw ckpt::error(ckpt::error_kind::invalid_argument, "--dtype: FP8 (" + std::string(ckpt::to_string(from)) + ") is not converted");
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
      default:  // the integer dtypes, bool and FP8 (exported_dtype refuses FP8 first)
        throw ckpt::error(ckpt::error_kind::invalid_argument, "--dtype must be a floating-point dtype, not " + std::string(ckpt::to_string(to)));
    }
  }
}

}  // namespace ckpt_tool
