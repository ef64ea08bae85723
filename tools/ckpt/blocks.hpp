#pragma once
// Splitting a tensor into row-major blocks of bounded size, so that tools can stream tensors
// larger than memory: each block is a box of the global tensor that ckpt can read as a slice.

#include <algorithm>
#include <cstdint>

#include <ckpt/tensor.hpp>

namespace ckpt_tool {

/// Calls `fn(offset, shape)` for boxes that tile `shape` in row-major order, each at most
/// `budget` bytes unless a single element row of the innermost dimension is larger. Boxes span
/// whole trailing dimensions: the first dimension k whose trailing slab fits the budget is cut
/// into runs of rows, and the dimensions before k are stepped one index at a time. So a box is
/// always one contiguous byte range of the row-major tensor. Nothing is called for an empty
/// tensor; a 0-d tensor is one box.
template <class F>
void for_each_block(const ckpt::shape_t& shape, std::uint64_t elem, std::uint64_t budget, F&& fn) {
  const std::size_t n = shape.size();
  for (auto d : shape)
    if (d == 0) return;
  if (n == 0) {
    fn(ckpt::shape_t{}, ckpt::shape_t{});
    return;
  }
  // inner[k]: bytes of one index of dimension k (the product of the dimensions after it).
  std::vector<std::uint64_t> inner(n, elem);
  for (std::size_t k = n - 1; k > 0; --k) inner[k - 1] = inner[k] * shape[k];
  std::size_t k = 0;
  while (k + 1 < n && inner[k] > budget) ++k;
  const std::uint64_t rows = std::max<std::uint64_t>(1, std::min<std::uint64_t>(shape[k], budget / inner[k]));
  ckpt::shape_t offset(n, 0), box(shape);
  for (std::size_t d = 0; d < k; ++d) box[d] = 1;
  while (true) {
    for (std::uint64_t r = 0; r < shape[k]; r += rows) {
      offset[k] = r;
      box[k] = std::min(rows, shape[k] - r);
      fn(offset, box);
    }
    offset[k] = 0;
    // Step the outer dimensions like an odometer.
    std::size_t d = k;
    while (d > 0) {
      --d;
      if (++offset[d] < shape[d]) break;
      offset[d] = 0;
      if (d == 0) return;
    }
    if (k == 0) return;
  }
}

}  // namespace ckpt_tool
