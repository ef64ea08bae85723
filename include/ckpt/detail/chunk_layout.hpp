#pragma once
// Which file holds which part of a tensor, in a format-2 tag (docs/format.md, section 5.4).
//
// A job of 16,384 tensor-parallel ranks stores 16 million chunks of a 1000-tensor model. Format
// 1 listed each in chunk_map.bin (region, file, place, size, codec, checksum: 327 MB), so rank
// 0 had to merge and write, and every loading rank decode, all of them. Format 2 keeps in
// chunk_map.bin only the layout, and most tensors' layout is a grid: the tensor is cut into
// equal cells (each rank's shard), every cell into the same pieces (the chunks the writer cut
// its shard into), and the cells' files follow a few arithmetic runs. That is a few dozen bytes
// per tensor at any rank count. Where each chunk lies in its file, its codec, size and checksum
// stay in that file's footer index, which metadata.json checksums; a load reads the footers of
// the files it reads anyway (docs/architecture.md). Layouts that are not a grid (uneven splits)
// are listed chunk by chunk, region and file only.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../tensor.hpp"
#include "chunk_table.hpp"
#include "coverage.hpp"
#include "region.hpp"
#include "small_vector.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

/// `cells` consecutive cells (row-major order) whose files are first, first + step, ...
struct file_run {
  std::uint64_t cells = 0;
  std::uint32_t first = 0;
  std::uint32_t step = 0;
  bool operator==(const file_run&) const = default;
};

/// How one tensor's chunks are laid out over the files of a tag.
struct chunk_layout {
  enum class kind : std::uint8_t { grid = 1, list = 2 };
  kind how = kind::list;
  // grid: `block` is each cell's shape (it divides the tensor's shape in every dimension);
  // `pieces()` are each cell's chunks, their offsets relative to the cell's origin; `runs` give
  // the file of every cell, cells in row-major order.
  shape_t block;
  small_vector<file_run, 1> runs;  // one, almost always
  // list: `chunks()` are every chunk's file and region.
  //
  // One table holds a grid's pieces or a list's chunks (`how` says which): a load keeps a
  // layout for every tensor, and a second table, always empty, made each record 104 bytes
  // larger (10 MB of fresh memory to fault in for 100,000 tensors).
  region_table regions;

  /// A grid's pieces (their files unused).
  region_table& pieces() noexcept { return regions; }
  const region_table& pieces() const noexcept { return regions; }
  /// A list's chunks.
  region_table& chunks() noexcept { return regions; }
  const region_table& chunks() const noexcept { return regions; }

  /// Cells of a grid (1 for a list); valid once check_layout passed.
  std::uint64_t cells(std::span<const std::uint64_t> shape) const noexcept {
    if (how != kind::grid) return 1;
    std::uint64_t n = 1;
    for (std::size_t d = 0; d < shape.size(); ++d) n *= shape[d] / block[d];
    return n;
  }
  /// Chunks the layout describes; valid once check_layout passed.
  std::uint64_t chunk_count(std::span<const std::uint64_t> shape) const noexcept {
    return how == kind::grid ? cells(shape) * pieces().size() : chunks().size();
  }
  /// The file of grid cell `k` (row-major), k < cells.
  std::uint32_t file_of_cell(std::uint64_t k) const noexcept {
    for (const auto& r : runs) {
      if (k < r.cells) return r.first + static_cast<std::uint32_t>(k) * r.step;
      k -= r.cells;
    }
    return 0;
  }
};

/// Compresses the file of each cell (in row-major order) into arithmetic runs.
inline small_vector<file_run, 1> runs_of(std::span<const std::uint32_t> file_of_cell) {
  small_vector<file_run, 1> out;
  for (std::size_t k = 0; k < file_of_cell.size();) {
    file_run r{1, file_of_cell[k], 0};
    if (k + 1 < file_of_cell.size() && file_of_cell[k + 1] >= r.first) {
      r.step = file_of_cell[k + 1] - r.first;
      while (k + r.cells < file_of_cell.size() &&
             file_of_cell[k + r.cells] == r.first + static_cast<std::uint32_t>(r.cells) * r.step)
        ++r.cells;
    }
    out.push_back(r);
    k += r.cells;
  }
  return out;
}

/// The files of a tag, as check_layout sees them: how many, and each one's name and recorded size.
struct layout_files {
  std::uint32_t count = 0;
  std::function<std::string(std::uint32_t)> name;
  std::function<std::uint64_t(std::uint32_t)> size;
};

/// Checks a layout read from chunk_map.bin against its tensor's shape and the tag's files
/// before anything trusts it: grid cells that divide the shape, counts that cannot overflow,
/// files that exist, non-empty pieces that tile a cell exactly once, no run of cells in one
/// file longer than its recorded size could list in its footer (8 bytes of checksum a chunk),
/// and, for a list, chunks that tile the tensor exactly once. Throws an error of `kind`
/// starting with `context`, naming the tensor. (What bounds the memory a hostile map can make a
/// reader spend on one file's chunks is read_chunk_details: it compares chunks_in_file_count
/// with what the file's footer, checked and read, actually holds before building the list.)
CKPT_DECL void check_layout(const std::string& tensor, std::span<const std::uint64_t> shape, const chunk_layout& l,
                            const layout_files& files, error_kind kind, const std::string& context);

/// Calls `f(file, offset, shape)` for every chunk of the layout that overlaps `dst` (a region
/// of the tensor, of shape `shape`); for a grid, only the cells that overlap are visited.
template <class F>
void for_each_chunk(const chunk_layout& l, std::span<const std::uint64_t> shape, region dst, F&& f) {
  const std::size_t n = shape.size();
  if (l.how == chunk_layout::kind::list) {
    for (std::size_t i = 0; i < l.chunks().size(); ++i)
      if (n == 0 || overlaps({l.chunks().offset(i), l.chunks().shape(i)}, dst))
        f(l.chunks().file[i], l.chunks().offset(i), l.chunks().shape(i));
    return;
  }
  if (n == 0) {  // a scalar: one cell
    for (std::size_t p = 0; p < l.pieces().size(); ++p) f(l.file_of_cell(0), l.pieces().offset(p), l.pieces().shape(p));
    return;
  }
  if (n > max_dims) throw error(error_kind::invalid_argument, "a tensor of " + std::to_string(n) + " dimensions");
  dims_array lo, hi, grid, idx, at;
  for (std::size_t d = 0; d < n; ++d) {
    if (dst.shape[d] == 0) return;
    grid[d] = shape[d] / l.block[d];
    lo[d] = dst.offset[d] / l.block[d];
    hi[d] = std::min(grid[d], (dst.offset[d] + dst.shape[d] + l.block[d] - 1) / l.block[d]);
    if (lo[d] >= hi[d]) return;
  }
  std::copy_n(lo.begin(), n, idx.begin());
  const std::span<const std::uint64_t> chunk_at(at.data(), n);
  for (;;) {
    std::uint64_t cell = 0;
    for (std::size_t d = 0; d < n; ++d) cell = cell * grid[d] + idx[d];
    const auto file = l.file_of_cell(cell);
    for (std::size_t p = 0; p < l.pieces().size(); ++p) {
      const auto off = l.pieces().offset(p), shp = l.pieces().shape(p);
      for (std::size_t d = 0; d < n; ++d) at[d] = idx[d] * l.block[d] + off[d];
      if (overlaps({chunk_at, shp}, dst)) f(file, chunk_at, shp);
    }
    std::size_t d = n;
    while (d > 0) {
      --d;
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      if (d == 0) return;
    }
  }
}

/// How many chunks the layout places in file `file` (without building them).
CKPT_DECL std::uint64_t chunks_in_file_count(const chunk_layout& l, std::uint32_t file);

/// The chunks the layout places in file `file` (cells in row-major order, each cell's pieces in
/// order), appended to `out` (coordinates and file).
CKPT_DECL void chunks_in_file(const chunk_layout& l, std::span<const std::uint64_t> shape, std::uint32_t file,
                              chunk_table& out);

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/chunk_layout.ipp"
#endif
