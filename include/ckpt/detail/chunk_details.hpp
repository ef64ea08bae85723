#pragma once
// The load stage that, for a format-2 tag, brings the details of the chunks a load reads (where
// each lies in its file, its codec, size and checksum) from the footer indexes of the files it
// reads, instead of from a chunk map that lists every chunk of every rank. Each footer is
// checked against the checksum metadata.json records for it, and its chunks against the
// tensor's layout in chunk_map.bin, before they join the tensor's chunk table; from there on a
// load is the same for both versions.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "chunk_layout.hpp"
#include "format.hpp"
#include "metadata.hpp"
#include "name_index.hpp"
#include "region.hpp"
#include "shard_io.hpp"

namespace ckpt::detail {

/// What a load reads from one tensor: the region `dst` of stored tensor `tensor`.
struct wanted_region {
  std::size_t tensor;
  shape_t offset, shape;
};

/// The files holding chunks that overlap the wanted regions (per file: whether it does).
inline std::vector<bool> files_holding(const metadata& md, const std::vector<wanted_region>& wanted) {
  std::vector<bool> used(md.files.size(), false);
  for (const auto& w : wanted) {
    const auto& t = md.tensors[w.tensor];
    const region dst{w.offset, w.shape};
    if (t.placement) {
      for_each_chunk(*t.placement, t.shape, dst, [&](std::uint32_t f, auto, auto) { used[f] = true; });
      continue;
    }
    const auto& c = t.chunks;
    for (std::size_t i = 0; i < c.size(); ++i)
      if (c.ndim == 0 || overlaps({c.offset(i), c.shape(i)}, dst)) used[c.file[i]] = true;
  }
  return used;
}

/// Whether two tables hold the same regions, in any order.
inline bool same_regions(const chunk_table& a, const chunk_table& b) {
  if (a.size() != b.size() || a.ndim != b.ndim) return false;
  if (a.coords == b.coords) return true;
  const std::size_t w = 2 * a.ndim;
  auto sorted = [&](const chunk_table& t) {
    std::vector<std::span<const std::uint64_t>> rows;
    for (std::size_t i = 0; i < t.size(); ++i) rows.emplace_back(t.coords.data() + i * w, w);
    std::sort(rows.begin(), rows.end(), [](auto x, auto y) { return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end()); });
    return rows;
  };
  const auto x = sorted(a), y = sorted(b);
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!std::equal(x[i].begin(), x[i].end(), y[i].begin())) return false;
  return true;
}

/// Version 2: reads the footer index of every file with `files[f]` and adds to each tensor with
/// `tensors[t]` the chunks that file holds of it, checked first: the footer against
/// metadata.json's checksum (so the file's header, size and trailer too), and its chunks
/// against the tensor's layout (the same regions, in any order: first their number, so a
/// hostile layout cannot make this build more chunks than the footer holds), each inside the
/// file's chunk area and a raw one exactly its shape's size. A version-1 tag has every chunk
/// already: nothing is read. A file that fails throws, or with `problems` is skipped (none of
/// its chunks added) and its error kept in (*problems)[f]. Returns the bytes read.
template <class Store>
std::uint64_t read_chunk_details(const Store& storage, metadata& md, const std::vector<bool>& tensors,
                                 const std::vector<bool>& files, std::vector<std::string>* problems = nullptr) {
  if (md.format_version == 1) return 0;
  const auto name_of = [](const tensor_meta& t) -> std::string_view { return t.name; };
  const name_index by_name(md.tensors, name_of);
  std::uint64_t bytes = 0;
  // Per tensor, the chunks this file's footer lists (a gathering writer lists a tensor once
  // per rank it gathered from).
  table_vector<chunk_table> found(md.tensors.size());
  chunk_table expected;
  for (std::uint32_t f = 0; f < files.size(); ++f) {
    if (!files[f]) continue;
    const auto key = file_key(md, f);
    const auto name = storage.describe(key);
    const auto& fm = md.files[f];
    auto fail = [&](const std::string& tensor, const std::string& what) {
      throw error(error_kind::corrupt, name + ", tensor " + printable(tensor) + ": " + what);
    };
    try {
      const auto foot = verify_shard_file(storage, key, fm.size, fm.index_xxh3);
      bytes += header_used + trailer_bytes + foot.index.size();
      parse_index(
          foot.index, name,
          [&](std::string_view tname, dtype type, layout order, const shape_t& shape, bounded_reader& rd) {
            const auto k = by_name.find(tname, md.tensors, name_of);
            if (k == name_index::npos) fail(std::string(tname), "in the footer index, not in metadata.json");
            const auto& t = md.tensors[k];
            if (!tensors[k]) {
              rd.skip_table(shape.size());
              return;
            }
            if (type != t.type || shape != t.shape || order != t.order)
              fail(t.name, "the footer index says " + std::string(to_string(type)) + " " + std::string(ckpt::to_string(order)) +
                               " " + to_string(shape) + ", metadata.json " + std::string(to_string(t.type)) + " " +
                               std::string(ckpt::to_string(t.order)) + " " + to_string(t.shape));
            rd.table(found[k], shape.size());
          },
          [](value_record&&) {});
      // Each tensor's chunks here must be those the layout places in this file (in any order),
      // all checked before any joins its tensor's table.
      for (std::size_t k = 0; k < md.tensors.size(); ++k) {
        if (!tensors[k]) continue;
        const auto& t = md.tensors[k];
        const auto& got = found[k];
        const auto placed = chunks_in_file_count(*t.placement, f);
        if (got.size() == 0 && placed == 0) continue;
        if (placed != got.size())
          fail(t.name, "the footer index holds " + std::to_string(got.size()) + " chunks, chunk_map.bin places " +
                           std::to_string(placed) + " in this file");
        expected.clear();
        chunks_in_file(*t.placement, t.shape, f, expected);
        if (!same_regions(got, expected))
          fail(t.name, "the footer index holds " + std::to_string(got.size()) + " chunks that differ from the " +
                           std::to_string(expected.size()) + " chunk_map.bin places in this file");
        const auto elem = size_of(t.type);
        for (std::size_t i = 0; i < got.size(); ++i) {
          if (got.file_offset[i] < header_bytes || got.file_offset[i] > foot.index_offset ||
              got.stored_size[i] > foot.index_offset - got.file_offset[i])
            fail(t.name, "chunk [" + std::to_string(got.file_offset[i]) + ", +" + std::to_string(got.stored_size[i]) +
                             ") lies outside the file's chunk area [4096, " + std::to_string(foot.index_offset) + ")");
          if (got.codec[i] == 0 && got.stored_size[i] != got.elements(i) * elem)
            fail(t.name, "raw chunk of " + std::to_string(got.stored_size[i]) + " bytes, its shape " + to_string(got.shape(i)) +
                             " holds " + std::to_string(got.elements(i) * elem));
        }
      }
    } catch (const error& e) {
      for (auto& got : found) got.clear();
      if (!problems) throw;
      problems->resize(files.size());
      (*problems)[f] = e.what();
      continue;
    }
    for (std::size_t k = 0; k < md.tensors.size(); ++k) {
      if (found[k].size() == 0) continue;
      auto& t = md.tensors[k];
      t.chunks.ndim = static_cast<std::uint32_t>(t.shape.size());
      if (t.chunks.size() == 0) {  // the tensor's first file (most often its only one): take the table whole
        std::swap(t.chunks, found[k]);
        std::fill(t.chunks.file.begin(), t.chunks.file.end(), f);
      } else {
        t.chunks.append(found[k], f);
      }
      found[k].clear();
    }
  }
  return bytes;
}

/// Every chunk of every tensor (tools that may read anything). With `problems`, a file whose
/// footer fails its checks is skipped, its error kept in (*problems)[file], so a tool can
/// report every damaged file (the vector is empty, or one entry per file, "" for a sound one).
/// Returns the bytes read.
template <class Store>
std::uint64_t read_all_chunk_details(const Store& storage, metadata& md, std::vector<std::string>* problems = nullptr) {
  return read_chunk_details(storage, md, std::vector<bool>(md.tensors.size(), true), std::vector<bool>(md.files.size(), true),
                            problems);
}

}  // namespace ckpt::detail
