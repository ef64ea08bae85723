#pragma once
/// @file host_copy.hpp
/// `ckpt::host_copy`: the default DevicePolicy, for tensors in host memory.

#include <cstring>
#include <span>
#include <string>

#include "error.hpp"
#include "tensor.hpp"

namespace ckpt {

/// Tensors in host memory: staging is a memcpy, and ckpt may read and write their bytes in
/// place (`host_view`), which lets a raw-codec save write straight from the user's buffers.
///
/// @code
/// ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::raw, ckpt::host_copy> cp{{}, dir};
/// @endcode
struct host_copy {
  bool accepts(device d) const noexcept { return d.type == device::kind::host; }

  void to_host(const tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst) const {
    check(t, offset, dst.size());
    if (!dst.empty()) std::memcpy(dst.data(), t.data() + offset, dst.size());
  }
  void from_host(std::span<const std::byte> src, const tensor_ref& t, std::uint64_t offset) const {
    check(t, offset, src.size());
    if (!src.empty()) std::memcpy(t.data() + offset, src.data(), src.size());
  }
  /// The tensor's bytes, addressable directly (host memory needs no staging).
  std::byte* host_view(const tensor_ref& t) const noexcept { return t.data(); }

 private:
  static void check(const tensor_ref& t, std::uint64_t offset, std::size_t n) {
    if (offset > t.nbytes() || n > t.nbytes() - offset)
      throw error(error_kind::invalid_argument, "host_copy: bytes [" + std::to_string(offset) + ", +" +
                                                    std::to_string(n) + ") outside a tensor of " +
                                                    std::to_string(t.nbytes()) + " bytes");
  }
};

}  // namespace ckpt
