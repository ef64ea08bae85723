#pragma once
/// @file interop/host_tensor.hpp
/// `ckpt::interop::host_tensor`: a tensor held by value in host memory, the unit that crosses
/// between ckpt and other formats (PyTorch `.pt` files, safetensors).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../dtype.hpp"
#include "../tensor.hpp"

namespace ckpt::interop {

/// A dense, row-major, little-endian tensor that owns its bytes.
///
/// @code
/// ckpt::interop::host_tensor t{ckpt::dtype::f32, {2, 3}, std::vector<std::byte>(24)};
/// ckpt::tensor_ref r = t.ref();  // a view ckpt can save or load into
/// @endcode
struct host_tensor {
  dtype type = dtype::f32;
  shape_t shape;
  std::vector<std::byte> data;  ///< numel(shape) * size_of(type) bytes

  /// Elements, by the shape (1 for a 0-d tensor).
  std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  /// A view of the bytes, for ckpt's visitor.
  tensor_ref ref() { return tensor_ref(type, shape, data.data()); }
};

}  // namespace ckpt::interop
