#pragma once
// The commit-time check that the chunks of a global tensor tile it exactly once: no element
// missing, none stored twice. Runs on rank 0 over every chunk of every rank, so it must stay
// close to linear in the number of chunks.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../names.hpp"
#include "../tensor.hpp"

namespace ckpt::detail {

struct placed_chunk {
  const shape_t* offset;
  const shape_t* shape;
  std::string_view where;  // which file or rank, for messages
};

inline std::string region_string(const shape_t& lo, const shape_t& hi) {
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
inline void check_tiling(const std::string& tensor, const shape_t& global, const std::vector<placed_chunk>& chunks,
                         error_kind kind, const std::string& context) {
  const std::size_t n = global.size();
  auto fail = [&](const std::string& what) {
    throw error(kind, context + "tensor " + printable(tensor) + ": " + what);
  };
  std::uint64_t total = element_count(global, "tensor " + tensor);
  for (const auto& c : chunks) {
    if (c.offset->size() != n || c.shape->size() != n)
      fail("a chunk in " + std::string(c.where) + " has " + std::to_string(c.shape->size()) +
           " dimensions, the tensor has " + std::to_string(n));
    for (std::size_t d = 0; d < n; ++d)
      if ((*c.offset)[d] > global[d] || (*c.shape)[d] > global[d] - (*c.offset)[d]) {
        shape_t hi(n);
        for (std::size_t e = 0; e < n; ++e) hi[e] = (*c.offset)[e] + (*c.shape)[e];
        fail("chunk " + region_string(*c.offset, hi) + " in " + std::string(c.where) + " lies outside the global shape " +
             to_string(global));
      }
  }
  if (total == 0) return;  // nothing to cover
  if (n == 0) {
    if (chunks.size() != 1) fail("scalar stored " + std::to_string(chunks.size()) + " times");
    return;
  }
  // Coordinate-compressed grid: every chunk edge cuts every dimension; each cell of the grid
  // must be owned by exactly one chunk.
  std::vector<std::vector<std::uint64_t>> cuts(n);
  for (std::size_t d = 0; d < n; ++d) {
    cuts[d] = {0, global[d]};
    for (const auto& c : chunks) {
      if ((*c.shape)[d] == 0) continue;
      cuts[d].push_back((*c.offset)[d]);
      cuts[d].push_back((*c.offset)[d] + (*c.shape)[d]);
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
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const auto& c = chunks[i];
      bool empty = false;
      shape_t lo(n), hi(n);
      for (std::size_t d = 0; d < n; ++d) {
        if ((*c.shape)[d] == 0) empty = true;
        lo[d] = static_cast<std::uint64_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), (*c.offset)[d]) - cuts[d].begin());
        hi[d] = static_cast<std::uint64_t>(
            std::lower_bound(cuts[d].begin(), cuts[d].end(), (*c.offset)[d] + (*c.shape)[d]) - cuts[d].begin());
      }
      if (empty) continue;
      shape_t idx = lo;
      for (;;) {
        std::uint64_t cell = 0;
        for (std::size_t d = 0; d < n; ++d) cell += idx[d] * stride[d];
        if (owner[cell] >= 0) {
          const auto& o = chunks[static_cast<std::size_t>(owner[cell])];
          shape_t a(n), b(n);
          for (std::size_t d = 0; d < n; ++d) {
            a[d] = std::max((*c.offset)[d], (*o.offset)[d]);
            b[d] = std::min((*c.offset)[d] + (*c.shape)[d], (*o.offset)[d] + (*o.shape)[d]);
          }
          fail("region " + region_string(a, b) + " is stored twice (in " + std::string(o.where) + " and " +
               std::string(c.where) + ")");
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
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return (*chunks[a].offset)[0] < (*chunks[b].offset)[0]; });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& c = chunks[order[i]];
    covered += element_count(*c.shape, "chunk");
    for (std::size_t j = i + 1; j < order.size(); ++j) {
      const auto& o = chunks[order[j]];
      if ((*o.offset)[0] >= (*c.offset)[0] + (*c.shape)[0]) break;
      bool overlap = true;
      for (std::size_t d = 0; d < n && overlap; ++d)
        overlap = std::max((*c.offset)[d], (*o.offset)[d]) <
                  std::min((*c.offset)[d] + (*c.shape)[d], (*o.offset)[d] + (*o.shape)[d]);
      if (overlap) fail("chunks in " + std::string(c.where) + " and " + std::string(o.where) + " overlap");
    }
  }
  if (covered != total)
    fail("the shards store " + std::to_string(covered) + " of its " + std::to_string(total) + " elements");
}

}  // namespace ckpt::detail
