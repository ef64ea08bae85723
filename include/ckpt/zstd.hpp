#pragma once
/// @file zstd.hpp
/// Compressing codecs on libzstd: `ckpt::zstd` and `ckpt::zstd_bytegroup`. Every stored chunk
/// is one or more standard zstd frames, readable by any zstd implementation.

#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtype.hpp"
#include "error.hpp"

namespace ckpt {

namespace detail {
/// Decompresses `in` (one or more zstd frames) into exactly `out.size()` bytes. The output size
/// comes from the chunk's shape, checked against metadata before this runs, so a frame that
/// claims or produces more (a decompression bomb) fails without allocating anything.
inline void zstd_decompress_exact(std::span<const std::byte> in, std::span<std::byte> out) {
  // What the frame headers claim, summed over the frames, before anything is decompressed.
  std::uint64_t claimed = 0;
  bool known = true;
  for (std::size_t pos = 0; pos < in.size();) {
    const auto frame = ZSTD_findFrameCompressedSize(in.data() + pos, in.size() - pos);
    if (ZSTD_isError(frame)) throw error(error_kind::corrupt, std::string("zstd: ") + ZSTD_getErrorName(frame));
    const auto content = ZSTD_getFrameContentSize(in.data() + pos, in.size() - pos);
    if (content == ZSTD_CONTENTSIZE_ERROR) throw error(error_kind::corrupt, "not a valid zstd frame");
    if (content == ZSTD_CONTENTSIZE_UNKNOWN) known = false;
    else if (content > out.size() - std::min<std::uint64_t>(claimed, out.size()) || claimed > out.size())
      throw error(error_kind::corrupt, "zstd frames claim " + std::to_string(claimed + content) + " bytes, the chunk holds " +
                                           std::to_string(out.size()));
    else claimed += content;
    pos += frame;
  }
  if (known && claimed != out.size())
    throw error(error_kind::corrupt, "zstd frames claim " + std::to_string(claimed) + " bytes, the chunk holds " +
                                         std::to_string(out.size()));
  const auto n = ZSTD_decompress(out.data(), out.size(), in.data(), in.size());
  if (ZSTD_isError(n)) throw error(error_kind::corrupt, std::string("zstd: ") + ZSTD_getErrorName(n));
  if (n != out.size())
    throw error(error_kind::corrupt, "zstd frames hold " + std::to_string(n) + " bytes, the chunk holds " + std::to_string(out.size()));
}

inline std::size_t zstd_compress_into(std::span<const std::byte> in, std::span<std::byte> out, int level) {
  const auto n = ZSTD_compress(out.data(), out.size(), in.data(), in.size(), level);
  if (ZSTD_isError(n)) throw error(error_kind::invalid_argument, std::string("zstd: ") + ZSTD_getErrorName(n));
  return n;
}
}  // namespace detail

/// Plain zstd (codec id 1): one frame per chunk.
///
/// @code
/// ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::zstd> cp{{}, dir, {}, ckpt::zstd{.level = 3}};
/// @endcode
struct zstd {
  static constexpr std::uint8_t id = 1;
  int level = 1;

  std::size_t max_encoded_size(std::size_t n) const noexcept { return ZSTD_compressBound(n); }
  std::size_t encode(std::span<const std::byte> in, dtype, std::span<std::byte> out) const {
    return detail::zstd_compress_into(in, out, level);
  }
  void decode(std::span<const std::byte> in, dtype, std::span<std::byte> out) const { detail::zstd_decompress_exact(in, out); }
};

/// zstd over byte planes (codec id 2), after ZipNN: the bytes of each element are regrouped so
/// that byte k of every element sits together, and each plane is its own zstd frame. For
/// floats the planes holding sign and exponent are highly compressible and the low mantissa
/// planes are not; regrouping lets zstd find the former and store the latter almost raw.
/// One-byte dtypes are compressed as they are.
///
/// @code
/// ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::zstd_bytegroup> cp{{}, dir};
/// @endcode
struct zstd_bytegroup {
  static constexpr std::uint8_t id = 2;
  int level = 1;

  std::size_t max_encoded_size(std::size_t n) const noexcept {
    return 8 * ZSTD_compressBound(n / 8 + 1) + ZSTD_compressBound(n);  // up to 8 frames
  }

  std::size_t encode(std::span<const std::byte> in, dtype t, std::span<std::byte> out) const {
    const std::size_t e = size_of(t);
    if (e == 1 || in.size() % e != 0) return detail::zstd_compress_into(in, out, level);
    const std::size_t count = in.size() / e;
    std::vector<std::byte> planes(in.size());
    for (std::size_t i = 0; i < count; ++i)
      for (std::size_t k = 0; k < e; ++k) planes[k * count + i] = in[i * e + k];
    std::size_t used = 0;
    for (std::size_t k = 0; k < e; ++k)
      used += detail::zstd_compress_into(std::span(planes).subspan(k * count, count), out.subspan(used), level);
    return used;
  }

  void decode(std::span<const std::byte> in, dtype t, std::span<std::byte> out) const {
    const std::size_t e = size_of(t);
    if (e == 1 || out.size() % e != 0) return detail::zstd_decompress_exact(in, out);
    std::vector<std::byte> planes(out.size());
    detail::zstd_decompress_exact(in, planes);
    const std::size_t count = out.size() / e;
    for (std::size_t i = 0; i < count; ++i)
      for (std::size_t k = 0; k < e; ++k) out[i * e + k] = planes[k * count + i];
  }
};

}  // namespace ckpt
