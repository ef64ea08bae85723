#pragma once
// The definitions of detail/chunk_layout.hpp: checking a layout, and the chunks it places in
// one file. Header-only builds include this at the end of detail/chunk_layout.hpp;
// CKPT_SEPARATE_COMPILATION builds compile it once, in the translation unit that includes
// ckpt/impl/src.hpp.

namespace ckpt::detail {

CKPT_DECL void check_layout(const std::string& tensor, std::span<const std::uint64_t> shape, const chunk_layout& l,
                            const layout_files& files_of_tag, error_kind kind, const std::string& context) {
  const auto files = files_of_tag.count;
  const auto& file_name = files_of_tag.name;
  const std::size_t n = shape.size();
  auto fail = [&](const std::string& what) { throw error(kind, context + "tensor " + printable(tensor) + ": " + what); };
  if (l.how == chunk_layout::kind::list) {
    if (l.chunks().ndim != n) fail("its chunks have " + std::to_string(l.chunks().ndim) + " dimensions, the tensor has " + std::to_string(n));
    for (std::size_t i = 0; i < l.chunks().size(); ++i)
      if (l.chunks().file[i] >= files)
        fail("has a chunk in file #" + std::to_string(l.chunks().file[i]) + " of " + std::to_string(files));
    check_tiling(tensor, shape, l.chunks(), [&](std::size_t i) { return file_name(l.chunks().file[i]); }, kind, context);
    return;
  }
  if (l.how != chunk_layout::kind::grid) fail("unknown layout kind " + std::to_string(static_cast<unsigned>(l.how)));
  if (l.block.size() != n || l.pieces().ndim != n)
    fail("its grid has " + std::to_string(l.block.size()) + " dimensions, the tensor has " + std::to_string(n));
  std::uint64_t cells = 1;
  for (std::size_t d = 0; d < n; ++d) {
    if (l.block[d] == 0 || shape[d] == 0 || shape[d] % l.block[d] != 0)
      fail("grid cells of shape " + to_string(l.block) + " do not divide its shape " + to_string(shape));
    const auto k = shape[d] / l.block[d];
    if (cells > std::numeric_limits<std::uint64_t>::max() / k) fail("its grid of cells " + to_string(l.block) + " overflows");
    cells *= k;
  }
  if (l.pieces().size() == 0) fail("its grid cells have no chunks");
  if (l.pieces().size() > std::numeric_limits<std::uint64_t>::max() / cells)
    fail("its " + std::to_string(cells) + " grid cells of " + std::to_string(l.pieces().size()) + " chunks each overflow a count");
  for (std::size_t p = 0; p < l.pieces().size(); ++p)
    if (l.pieces().elements(p) == 0) fail("a piece of its grid cells is empty");
  std::uint64_t listed = 0;
  for (const auto& r : l.runs) {
    if (r.cells == 0) fail("a run of files covers no cells");
    if (r.cells > cells - listed)
      fail("its runs of files cover more than its " + std::to_string(cells) + " grid cells");
    listed += r.cells;
    // The run's last file, first + (cells - 1) * step, must exist; computed without overflow.
    if (r.first >= files || (r.step != 0 && (r.cells - 1) > (files - 1 - r.first) / r.step))
      fail("its grid cells name files beyond the " + std::to_string(files) + " the tag has (a run from file #" +
           std::to_string(r.first) + " in steps of " + std::to_string(r.step) + " over " + std::to_string(r.cells) + " cells)");
  }
  // Several cells in one file (a run of step 0) are listed in that file's footer, 8 bytes of
  // checksum a chunk at least.
  for (const auto& r : l.runs)
    if (r.step == 0 && r.cells > 1 &&
        (r.cells > files_of_tag.size(r.first) / 8 || r.cells * l.pieces().size() > files_of_tag.size(r.first) / 8))
      fail("its grid places " + std::to_string(r.cells) + " cells of " + std::to_string(l.pieces().size()) + " chunks in " +
           file_name(r.first) + ", more than its " + std::to_string(files_of_tag.size(r.first)) + " bytes could list");
  if (listed != cells)
    fail("its runs of files cover " + std::to_string(listed) + " of its " + std::to_string(cells) + " grid cells");
  // Every cell is cut the same way: the pieces must tile one cell exactly once.
  check_tiling(tensor, l.block, l.pieces(), [](std::size_t) { return std::string("a grid cell"); }, kind, context, "(grid cell) ");
}

CKPT_DECL std::uint64_t chunks_in_file_count(const chunk_layout& l, std::uint32_t file) {
  if (l.how == chunk_layout::kind::list) return static_cast<std::uint64_t>(std::count(l.chunks().file.begin(), l.chunks().file.end(), file));
  std::uint64_t cells = 0;
  for (const auto& r : l.runs) {
    if (r.step == 0) {
      if (r.first == file) cells += r.cells;
    } else if (file >= r.first && (file - r.first) % r.step == 0 && (file - r.first) / r.step < r.cells) {
      ++cells;
    }
  }
  return cells * l.pieces().size();  // no overflow once check_layout passed: at most cells × pieces
}

CKPT_DECL void chunks_in_file(const chunk_layout& l, std::span<const std::uint64_t> shape, std::uint32_t file,
                              chunk_table& out) {
  const std::size_t n = shape.size();
  out.ndim = static_cast<std::uint32_t>(n);
  if (l.how == chunk_layout::kind::list) {
    for (std::size_t i = 0; i < l.chunks().size(); ++i)
      if (l.chunks().file[i] == file) out.push(file, l.chunks().offset(i), l.chunks().shape(i), 0, 0, 0, 0);
    return;
  }
  if (n > max_dims) throw error(error_kind::invalid_argument, "a tensor of " + std::to_string(n) + " dimensions");
  dims_array grid, at, o;
  for (std::size_t d = 0; d < n; ++d) grid[d] = shape[d] / l.block[d];
  auto add_cell = [&](std::uint64_t cell) {
    std::uint64_t rest = cell;
    for (std::size_t d = n; d > 0; --d) {
      at[d - 1] = rest % grid[d - 1] * l.block[d - 1];
      rest /= grid[d - 1];
    }
    for (std::size_t p = 0; p < l.pieces().size(); ++p) {
      const auto off = l.pieces().offset(p);
      for (std::size_t d = 0; d < n; ++d) o[d] = at[d] + off[d];
      out.push(file, std::span<const std::uint64_t>(o.data(), n), l.pieces().shape(p), 0, 0, 0, 0);
    }
  };
  std::uint64_t start = 0;
  for (const auto& r : l.runs) {
    if (r.step == 0) {
      if (r.first == file)
        for (std::uint64_t k = 0; k < r.cells; ++k) add_cell(start + k);
    } else if (file >= r.first && (file - r.first) % r.step == 0 && (file - r.first) / r.step < r.cells) {
      add_cell(start + (file - r.first) / r.step);
    }
    start += r.cells;
  }
}

}  // namespace ckpt::detail
