#pragma once
// Sorting (name, position) pairs by name: the order in which metadata.json lists the tensors,
// decided by the commit's merge. std::sort compares whole names, and every comparison reads
// again the prefix two names share ("layers.12.experts."); a multikey quicksort (Bentley and
// Sedgewick, "Fast algorithms for sorting and searching strings", 1997) partitions on one byte
// position at a time and reads each name's bytes about once per partition it is in
// (docs/performance.md, "Many tensors on the disk", has what that saves).

#include <algorithm>
#include <cstddef>
#include <span>
#include <string_view>
#include <utility>

namespace ckpt::detail {

using named_position = std::pair<std::string_view, std::size_t>;

namespace name_sort_detail {
/// The byte at `depth` as 0-255, or -1 past the end (a name sorts before its extensions).
inline int byte_at(std::string_view s, std::size_t depth) noexcept {
  return depth < s.size() ? static_cast<unsigned char>(s[depth]) : -1;
}

/// Sorts a[0, n), whose names all share their first `depth` bytes. Recurses only into parts of
/// at most half the items and loops on the largest, so the stack stays shallow whatever the
/// names are.
inline void sort_from(named_position* a, std::size_t n, std::size_t depth) {
  while (n > 1) {
    if (n < 16) {  // few left: compare what follows the shared prefix
      std::sort(a, a + n, [depth](const named_position& x, const named_position& y) {
        const auto xs = x.first.substr(std::min(depth, x.first.size())), ys = y.first.substr(std::min(depth, y.first.size()));
        return xs != ys ? xs < ys : x.second < y.second;
      });
      return;
    }
    // Three parts by the byte at `depth`: below the pivot's, equal to it, above it.
    const int pivot = byte_at(a[n / 2].first, depth);
    std::size_t lt = 0, gt = n;
    for (std::size_t i = 0; i < gt;) {
      const int c = byte_at(a[i].first, depth);
      if (c < pivot)
        std::swap(a[lt++], a[i++]);
      else if (c > pivot)
        std::swap(a[i], a[--gt]);
      else
        ++i;
    }
    struct part {
      named_position* at;
      std::size_t size, depth;
    };
    part parts[3] = {{a, lt, depth}, {a + lt, gt - lt, depth + 1}, {a + gt, n - gt, depth}};
    if (pivot < 0) {  // the equal part's names all end here: the same name, ordered by position
      std::sort(a + lt, a + gt, [](const named_position& x, const named_position& y) { return x.second < y.second; });
      parts[1].size = 0;
    }
    std::sort(std::begin(parts), std::end(parts), [](const part& x, const part& y) { return x.size < y.size; });
    sort_from(parts[0].at, parts[0].size, parts[0].depth);
    sort_from(parts[1].at, parts[1].size, parts[1].depth);
    a = parts[2].at, n = parts[2].size, depth = parts[2].depth;
  }
}
}  // namespace name_sort_detail

/// Sorts `items` by name, then by position: the order std::sort gives the pairs, in less time
/// when names share long prefixes.
///
/// @code
/// std::vector<detail::named_position> order{{"b", 0}, {"a.1", 1}, {"a", 2}};
/// detail::sort_by_name(order);  // "a", "a.1", "b"
/// @endcode
inline void sort_by_name(std::span<named_position> items) { name_sort_detail::sort_from(items.data(), items.size(), 0); }

}  // namespace ckpt::detail
