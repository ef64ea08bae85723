#pragma once
/// @file raw.hpp
/// `ckpt::raw`: the default Codec. Bytes are stored as they are.

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "dtype.hpp"
#include "error.hpp"

namespace ckpt {

/// Stores bytes unchanged (codec id 0). The fastest choice, and the only one whose chunks can
/// be read straight into the user's buffers.
struct raw {
  static constexpr std::uint8_t id = 0;
  std::size_t max_encoded_size(std::size_t n) const noexcept { return n; }
  std::size_t encode(std::span<const std::byte> in, dtype, std::span<std::byte> out) const {
    if (out.size() < in.size()) throw error(error_kind::invalid_argument, "raw codec: output buffer too small");
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
    return in.size();
  }
  void decode(std::span<const std::byte> in, dtype, std::span<std::byte> out) const {
    if (in.size() != out.size())
      throw error(error_kind::corrupt, "raw chunk of " + std::to_string(in.size()) + " bytes where " +
                                           std::to_string(out.size()) + " were expected");
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
  }
};

}  // namespace ckpt
