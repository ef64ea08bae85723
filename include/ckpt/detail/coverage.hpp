#pragma once
// The commit-time check that the chunks of a global tensor tile it exactly once: no element
// missing, none stored twice. Runs on rank 0 over every chunk of every rank, so it must stay
// close to linear in the number of chunks.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "../names.hpp"
#include "../tensor.hpp"
#include "chunk_table.hpp"

namespace ckpt::detail {

inline std::string region_string(std::span<const std::uint64_t> lo, std::span<const std::uint64_t> hi) {
  std::string s = "[";
  for (std::size_t d = 0; d < lo.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(lo[d]) + ":" + std::to_string(hi[d]);
  }
  return s + "]";
}

/// Throws an error of `kind` naming the tensor and the region when `chunks` do not tile
/// `global` exactly once. At save a bad tiling is the caller's mistake (invalid_argument); at
/// load it means a damaged or hostile metadata.json (corrupt).
/// `where(i)` names the file of chunk i for messages; a message starts with `context` and then
/// `context_more` (two parts, so that a caller checking every tensor builds no string for the
/// ones that pass).
template <class Table, class Where>
void check_tiling(const std::string& tensor, std::span<const std::uint64_t> global, const Table& chunks,
                  Where&& where, error_kind kind, std::string_view context, std::string_view context_more = {}) {
  const std::size_t n = global.size();
  auto fail = [&](const std::string& what) {
    throw error(kind, std::string(context).append(context_more) + "tensor " + printable(tensor) + ": " + what);
  };
  const auto size = checked_size(global);
  if (!size) throw error(error_kind::invalid_argument, "tensor " + tensor + ": element count overflows 64 bits");
  const std::uint64_t total = *size;
  if (chunks.ndim != n)
    fail("its chunks have " + std::to_string(chunks.ndim) + " dimensions, the tensor has " + std::to_string(n));
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const auto off = chunks.offset(i), shp = chunks.shape(i);
    for (std::size_t d = 0; d < n; ++d)
      if (off[d] > global[d] || shp[d] > global[d] - off[d]) {
        shape_t hi(n);
        for (std::size_t e = 0; e < n; ++e) hi[e] = off[e] + shp[e];
        fail("chunk " + region_string(off, hi) + " in " + std::string(where(i)) + " lies outside the global shape " +
             to_string(global));
      }
  }
  if (total == 0) return;  // nothing to cover
  if (n == 0) {
    if (chunks.size() != 1) fail("scalar stored " + std::to_string(chunks.size()) + " times");
    return;
  }
  // One chunk that is the whole tensor (most tensors of a single-process save): nothing to sort.
  if (chunks.size() == 1 && std::ranges::all_of(chunks.offset(0), [](std::uint64_t o) { return o == 0; }) &&
      std::ranges::equal(chunks.shape(0), global))
    return;
  // The common case: every chunk spans the whole tensor in all dimensions but one (a split
  // along one dimension, chunked along the same one). Sorting the chunks along it and checking
  // that each starts where the previous ended proves the tiling in O(n log n).
  for (std::size_t d = 0; d < n; ++d) {
    bool slabs = true;
    for (std::size_t i = 0; i < chunks.size() && slabs; ++i) {
      const auto off = chunks.offset(i), shp = chunks.shape(i);
      for (std::size_t e = 0; e < n && slabs; ++e)
        if (e != d && (off[e] != 0 || shp[e] != global[e])) slabs = false;
    }
    if (!slabs) continue;
    std::vector<std::pair<std::uint64_t, std::size_t>> starts;  // (offset along d, chunk)
    starts.reserve(chunks.size());
    for (std::size_t i = 0; i < chunks.size(); ++i)
      if (chunks.shape(i)[d] != 0) starts.emplace_back(chunks.offset(i)[d], i);
    if (!std::is_sorted(starts.begin(), starts.end())) std::sort(starts.begin(), starts.end());
    std::uint64_t end = 0;
    auto slab = [&](std::uint64_t lo, std::uint64_t hi) {
      shape_t a(n, 0), b(global.begin(), global.end());
      a[d] = lo;
      b[d] = hi;
      return region_string(a, b);
    };
    for (std::size_t k = 0; k < starts.size(); ++k) {
      const auto [at, i] = starts[k];
      if (at > end) fail("region " + slab(end, at) + " of global shape " + to_string(global) + " is not stored by any shard");
      if (at < end) {
        const auto j = starts[k - 1].second;
        fail("region " + slab(at, std::min(end, at + chunks.shape(i)[d])) + " is stored twice (in " + std::string(where(j)) +
             " and " + std::string(where(i)) + ")");
      }
      end = at + chunks.shape(i)[d];
    }
    if (end != global[d])
      fail("region " + slab(end, global[d]) + " of global shape " + to_string(global) + " is not stored by any shard");
    return;
  }
  // Coordinate-compressed grid: every chunk edge cuts every dimension; each cell of the grid
  // must be owned by exactly one chunk.
  std::vector<std::vector<std::uint64_t>> cuts(n);
  for (std::size_t d = 0; d < n; ++d) {
    cuts[d] = {0, global[d]};
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const auto off = chunks.offset(i), shp = chunks.shape(i);
      if (shp[d] == 0) continue;
      cuts[d].push_back(off[d]);
      cuts[d].push_back(off[d] + shp[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  constexpr std::uint64_t max_cells = std::uint64_t{1} << 24;
  std::uint64_t cells = 1;
  for (const auto& c : cuts) {
    cells *= c.size() - 1;
    if (cells > max_cells) break;
  }
  if (cells <= max_cells) {
    std::vector<std::int64_t> owner(cells, -1);
    std::vector<std::uint64_t> stride(n, 1);
    for (std::size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * (cuts[d].size() - 1);
    shape_t lo(n), hi(n), idx(n);  // reused for every chunk
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const auto off = chunks.offset(i), shp = chunks.shape(i);
      bool empty = false;
      for (std::size_t d = 0; d < n; ++d) {
        if (shp[d] == 0) empty = true;
        lo[d] = static_cast<std::uint64_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), off[d]) - cuts[d].begin());
        hi[d] = static_cast<std::uint64_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), off[d] + shp[d]) - cuts[d].begin());
      }
      if (empty) continue;
      idx = lo;
      for (;;) {
        std::uint64_t cell = 0;
        for (std::size_t d = 0; d < n; ++d) cell += idx[d] * stride[d];
        if (owner[cell] >= 0) {
          const auto j = static_cast<std::size_t>(owner[cell]);
          const auto ooff = chunks.offset(j), oshp = chunks.shape(j);
          shape_t a(n), b(n);
          for (std::size_t d = 0; d < n; ++d) {
            a[d] = std::max(off[d], ooff[d]);
            b[d] = std::min(off[d] + shp[d], ooff[d] + oshp[d]);
          }
          fail("region " + region_string(a, b) + " is stored twice (in " + std::string(where(j)) + " and " +
               std::string(where(i)) + ")");
        }
        owner[cell] = static_cast<std::int64_t>(i);
        std::size_t d = n;
        bool done = true;
        while (d > 0) {
          --d;
          if (++idx[d] < hi[d]) {
            done = false;
            break;
          }
          idx[d] = lo[d];
        }
        if (done) break;
      }
    }
    for (std::uint64_t cell = 0; cell < cells; ++cell)
      if (owner[cell] < 0) {
        shape_t a(n), b(n);
        std::uint64_t rest = cell;
        for (std::size_t d = 0; d < n; ++d) {
          const auto k = rest / stride[d];
          rest %= stride[d];
          a[d] = cuts[d][k];
          b[d] = cuts[d][k + 1];
        }
        fail("region " + region_string(a, b) + " of global shape " + to_string(global) + " is not stored by any shard");
      }
    return;
  }
  // Too many cells for a grid (pathological layouts): sweep along dimension 0 for overlaps,
  // then count elements; without overlaps, full count means full coverage.
  std::vector<std::size_t> order(chunks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return chunks.offset(a)[0] < chunks.offset(b)[0]; });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto off = chunks.offset(order[i]), shp = chunks.shape(order[i]);
    covered += element_count(shp, "chunk");
    for (std::size_t j = i + 1; j < order.size(); ++j) {
      const auto ooff = chunks.offset(order[j]), oshp = chunks.shape(order[j]);
      if (ooff[0] >= off[0] + shp[0]) break;
      bool overlap = true;
      for (std::size_t d = 0; d < n && overlap; ++d)
        overlap = std::max(off[d], ooff[d]) < std::min(off[d] + shp[d], ooff[d] + oshp[d]);
      if (overlap) fail("chunks in " + std::string(where(order[i])) + " and " + std::string(where(order[j])) + " overlap");
    }
  }
  if (covered != total)
    fail("the shards store " + std::to_string(covered) + " of its " + std::to_string(total) + " elements");
}

}  // namespace ckpt::detail
