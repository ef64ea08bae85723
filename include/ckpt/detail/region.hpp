#pragma once
// Hyperrectangle arithmetic: where two slices of a global tensor overlap, and the contiguous
// byte runs that copy one into the other. Resharding and chunked loads both rest on this.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../tensor.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

/// The most dimensions a saved tensor may have: a save refuses more (save_plan), and so does
/// every reader of metadata.json, chunk_map.bin and footer indexes.
inline constexpr std::size_t max_dims = 64;

/// Scratch coordinates of one tensor (at most max_dims), on the stack: work done once per
/// tensor allocates nothing for them, which matters at 100,000 tensors.
using dims_array = std::array<std::uint64_t, max_dims>;

/// A slice of a global tensor: `offset` and `shape` have one entry per dimension.
struct region {
  std::span<const std::uint64_t> offset;
  std::span<const std::uint64_t> shape;
};

/// True when the two slices share at least one element.
inline bool overlaps(region a, region b) {
  for (std::size_t d = 0; d < a.shape.size(); ++d) {
    const auto lo = std::max(a.offset[d], b.offset[d]);
    const auto hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (lo >= hi) return false;
  }
  return true;
}

/// Calls `run(dst_byte, src_byte, bytes)` for each maximal contiguous run of the overlap of
/// `src` and `dst` (both row-major, `elem` bytes per element). Returns the bytes covered.
template <class F>
std::uint64_t for_each_overlap_run(region src, region dst, std::uint64_t elem, F&& run) {
  const std::size_t n = src.shape.size();
  if (n == 0) {  // scalars
    run(0, 0, elem);
    return elem;
  }
  if (n > max_dims) throw error(error_kind::invalid_argument, "a region of " + std::to_string(n) + " dimensions");
  dims_array lo, hi;  // called once per chunk read: no allocations
  for (std::size_t d = 0; d < n; ++d) {
    lo[d] = std::max(src.offset[d], dst.offset[d]);
    hi[d] = std::min(src.offset[d] + src.shape[d], dst.offset[d] + dst.shape[d]);
    if (lo[d] >= hi[d]) return 0;
  }
  dims_array sstride, dstride;
  sstride[n - 1] = dstride[n - 1] = elem;
  for (std::size_t d = n - 1; d > 0; --d) {
    sstride[d - 1] = sstride[d] * src.shape[d];
    dstride[d - 1] = dstride[d] * dst.shape[d];
  }
  // Innermost dimensions the overlap spans completely in both slices merge into one run.
  std::size_t k = n - 1;
  while (k > 0 && lo[k] == src.offset[k] && hi[k] == src.offset[k] + src.shape[k] && lo[k] == dst.offset[k] &&
         hi[k] == dst.offset[k] + dst.shape[k])
    --k;
  const std::uint64_t run_bytes = (hi[k] - lo[k]) * sstride[k];
  dims_array idx;  // only its first k entries are used
  std::copy_n(lo.begin(), k, idx.begin());
  std::uint64_t total = 0;
  for (;;) {
    std::uint64_t s = (lo[k] - src.offset[k]) * sstride[k], t = (lo[k] - dst.offset[k]) * dstride[k];
    for (std::size_t d = 0; d < k; ++d) {
      s += (idx[d] - src.offset[d]) * sstride[d];
      t += (idx[d] - dst.offset[d]) * dstride[d];
    }
    run(t, s, run_bytes);
    total += run_bytes;
    std::size_t d = k;
    while (d > 0) {
      --d;
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      if (d == 0) return total;
    }
    if (k == 0) return total;
  }
}

/// One chunk of a local tensor: a slice (offset, shape in local coordinates) of `bytes` bytes.
/// When `contiguous`, its bytes are the range [byte_offset, byte_offset + bytes) of the local
/// tensor; otherwise it is a box (a block of columns, say) whose bytes are gathered from the
/// tensor row by row (gather_box), and `byte_offset` is where its first element lies.
struct chunk_slice {
  shape_t offset;
  shape_t shape;
  std::uint64_t byte_offset = 0;
  std::uint64_t bytes = 0;
  bool contiguous = true;
};

/// Splits a tensor into contiguous chunks of about `target` bytes: along the outermost
/// dimension whose one-index step fits the target, with all outer dimensions fixed.
CKPT_DECL std::vector<chunk_slice> split_into_chunks(const shape_t& shape, std::uint64_t elem, std::uint64_t target);
/// split_into_chunks, appending to `out`.
CKPT_DECL void split_into_chunks(const shape_t& shape, std::uint64_t elem, std::uint64_t target, std::vector<chunk_slice>& out);

/// How a save cuts a tensor into chunks (checkpointer_options::chunk_bytes and
/// reshard_blocks).
struct chunking {
  std::uint64_t chunk_bytes = std::uint64_t{4} << 20;
  /// A slice of a larger tensor is also cut into about this many blocks along each dimension
  /// it is split on (1: not at all), so that a load at another layout, whose slices start and
  /// end anywhere, reads at most about a block beyond each end of what it needs.
  std::uint32_t reshard_blocks = 16;
  /// Whether chunks may be boxes that are not one byte range of the tensor (blocks of columns):
  /// only where the writer gathers them from host memory itself.
  bool boxes = false;
};

/// Blocks are not made smaller than this: below it, a block's per-chunk costs (an entry in the
/// chunk map, a checksum, a read of its own) outweigh the bytes it saves a resharded load.
inline constexpr std::uint64_t min_reshard_block_bytes = std::uint64_t{64} << 10;

/// The chunks of a local slice of shape `shape` (memory order) of a tensor of `global_shape`:
/// split_into_chunks' where the slice is the whole tensor, or where blocks cannot be made;
/// otherwise the slice is first cut into blocks along the dimensions it is split on (only the
/// outermost one of more than one index unless `how.boxes`), and each block then into chunks of
/// at most about `how.chunk_bytes`. The chunks tile the slice, in row-major order of blocks.
CKPT_DECL std::vector<chunk_slice> chunks_of(const shape_t& shape, const shape_t& global_shape, std::uint64_t elem,
                                             const chunking& how);
/// chunks_of, appending to `out`: a save of many tensors reuses one vector for all of them.
CKPT_DECL void chunks_of(const shape_t& shape, const shape_t& global_shape, std::uint64_t elem, const chunking& how,
                         std::vector<chunk_slice>& out);

/// True when a box of shape `box` in a row-major tensor of shape `shape` is one byte range: no
/// dimension cuts it short after one it spans more than one index of.
inline bool box_is_contiguous(const shape_t& box, const shape_t& shape) {
  bool spans = false;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (spans && box[d] != shape[d]) return false;
    spans = spans || box[d] > 1;
  }
  return true;
}

/// Copies the elements of `chunk` (a box of the row-major tensor `shape` at `tensor`) into `out`,
/// densely, in row-major order of the box.
inline void gather_box(const std::byte* tensor, const shape_t& shape, const chunk_slice& chunk, std::uint64_t elem,
                       std::byte* out) {
  const shape_t origin(shape.size(), 0);
  for_each_overlap_run(region{origin, shape}, region{chunk.offset, chunk.shape}, elem,
                       [&](std::uint64_t to, std::uint64_t from, std::uint64_t n) { std::memcpy(out + to, tensor + from, n); });
}

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/region.ipp"
#endif
