#pragma once
// The load stage that, for a format-2 tag, brings the details of the chunks a load reads (where
// each lies in its file, its codec, size and checksum) from the footer indexes of the files it
// reads, instead of from a chunk map that lists every chunk of every rank. Each footer is
// checked against the checksum metadata.json records for it, and its chunks against the
// tensor's layout in chunk_map.bin, before they join the tensor's chunk table; from there on a
// load is the same for both versions.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../error.hpp"
#include "chunk_layout.hpp"
#include "format.hpp"
#include "metadata.hpp"
#include "name_index.hpp"
#include "region.hpp"
#include "shard_io.hpp"

namespace ckpt::detail {

/// What a load reads from one tensor: the region `dst` of stored tensor `tensor`. The region
/// is a view: of the live tensor's shape and offset, or of `no_offset`.
struct wanted_region {
  std::size_t tensor;
  region dst;
};

/// The offset of a tensor that is not a slice of a larger one: as many zeros as a tensor may
/// have dimensions.
inline constexpr dims_array no_offset{};

/// Where live tensor `ref` lies in its stored tensor, as a view: its shard's offset, or
/// `no_offset` when it is whole or replicated (what tensor_ref::global_offset copies).
inline std::span<const std::uint64_t> offset_in_stored(const tensor_ref& ref) {
  const auto& shard = ref.shard();
  if (shard && !shard->replicated) return shard->offset;
  const auto n = ref.shape().size();
  if (n > no_offset.size())  // a guard: a load matched it to a stored shape, which cannot be longer
    throw error(error_kind::invalid_argument, "a tensor of " + std::to_string(n) + " dimensions");
  return std::span(no_offset).first(n);
}

/// The files holding chunks that overlap the wanted regions (per file: whether it does).
inline std::vector<bool> files_holding(const metadata& md, std::span<const wanted_region> wanted) {
  std::vector<bool> used(md.files.size(), false);
  for (const auto& w : wanted) {
    const auto& t = md.tensors[w.tensor];
    const auto& dst = w.dst;
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

/// Reads file `f`'s footer index and puts into `found[k]` the chunks it holds of each tensor k
/// with `tensors[k]`, checked first: the footer against metadata.json's checksum (so the file's
/// header, size and trailer too), and its chunks against the tensor's layout (the same regions,
/// in any order: first their number, so a hostile layout cannot make this build more chunks
/// than the footer holds), each inside the file's chunk area and a raw one exactly its shape's
/// size. `found` holds md.tensors.size() empty tables on entry; on a throw, some may be filled.
/// Returns the bytes read. `md` is only read: a load runs this on a thread of its own
/// (details_prefetch) while it visits the state.
template <class Store>
std::uint64_t read_file_details(const Store& storage, const metadata& md, const name_index& by_name, std::uint32_t f,
                                const std::vector<bool>& tensors, table_vector<chunk_table>& found) {
  const auto name_of = [](const tensor_meta& t) -> std::string_view { return t.name; };
  const auto key = file_key(md, f);
  const auto name = storage.describe(key);
  const auto& fm = md.files[f];
  auto fail = [&](const std::string& tensor, const std::string& what) {
    throw error(error_kind::corrupt, name + ", tensor " + printable(tensor) + ": " + what);
  };
  const auto foot = verify_shard_file(storage, key, fm.size, fm.index_xxh3);
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
  chunk_table expected;
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
  return header_used + trailer_bytes + foot.index.size();
}

/// Reads one shard file's chunk details on a thread of its own, while the load visits the
/// state and plans its restore (both need metadata.json alone): for a model of 100,000
/// tensors each of those takes about as long as reading and checking a footer, so the two
/// now overlap. It reads the details of every tensor in the file, the plan not being known yet;
/// read_chunk_details takes those of the tensors it wants if the plan reads that file, and
/// reads the file again itself if the read here failed (so errors, and what is checked for the
/// tensors it wants, stay as without it).
template <class Store>
class details_prefetch {
 public:
  details_prefetch() = default;
  details_prefetch(const details_prefetch&) = delete;
  details_prefetch& operator=(const details_prefetch&) = delete;

  /// Starts reading file `f`'s details. `storage`, `md` and `by_name` (md.tensors by name)
  /// must outlive this object, and `md` must not change until `take` (or destruction).
  void start(const Store& storage, const metadata& md, const name_index& by_name, std::uint32_t f) {
    file_ = f;
    thread_ = std::jthread([this, &storage, &md, &by_name, f] {
      try {
        found_.resize(md.tensors.size());
        bytes_ = read_file_details(storage, md, by_name, f, std::vector<bool>(md.tensors.size(), true), found_);
        ok_ = true;
      } catch (...) {  // read_chunk_details reads the file itself, and reports what it finds
      }
    });
  }

  /// Waits for file `f`'s details; true when they were read and checked: then `found` holds them
  /// (what it held is dropped) and `bytes` the bytes read.
  bool take(std::uint32_t f, table_vector<chunk_table>& found, std::uint64_t& bytes) {
    if (f != file_ || !thread_.joinable()) return false;
    thread_.join();
    if (!ok_) return false;
    found.swap(found_);
    found_ = {};
    bytes = bytes_;
    ok_ = false;
    return true;
  }

 private:
  std::uint32_t file_ = UINT32_MAX;
  table_vector<chunk_table> found_;
  std::uint64_t bytes_ = 0;
  bool ok_ = false;
  std::jthread thread_;  // last: joined before the members it writes go
};

/// Version 2: reads the footer index of every file with `files[f]` (read_file_details) and adds
/// to each tensor with `tensors[t]` the chunks that file holds of it. A version-1 tag has every
/// chunk already: nothing is read. A file that fails throws, or with `problems` is skipped (none
/// of its chunks added) and its error kept in (*problems)[f]. With `prefetch`, a file it read
/// is not read again. `index` is md.tensors by name, where the caller has one already (a load's
/// stored_index); without it one is built if a file is read here. Returns the bytes read.
template <class Store>
std::uint64_t read_chunk_details(const Store& storage, metadata& md, const std::vector<bool>& tensors,
                                 const std::vector<bool>& files, std::vector<std::string>* problems = nullptr,
                                 details_prefetch<Store>* prefetch = nullptr, const name_index* index = nullptr) {
  if (md.format_version == 1) return 0;
  const auto name_of = [](const tensor_meta& t) -> std::string_view { return t.name; };
  std::optional<name_index> built;  // for the first file not prefetched, where no index was given
  std::uint64_t bytes = 0;
  // Per tensor, the chunks this file's footer lists (a gathering writer lists a tensor once
  // per rank it gathered from). Made only for a file the prefetch did not read, whose tables it
  // hands over instead: at 100,000 tensors they are 19 MB of memory to touch, on a load's
  // critical path.
  table_vector<chunk_table> found;
  for (std::uint32_t f = 0; f < files.size(); ++f) {
    if (!files[f]) continue;
    if (std::uint64_t got = 0; prefetch && prefetch->take(f, found, got)) {
      bytes += got;
      for (std::size_t k = 0; k < md.tensors.size(); ++k)
        if (!tensors[k]) found[k].clear();  // read for the plan not known yet; not wanted
    } else {
      try {
        found.resize(md.tensors.size());  // empty tables (the last file's were cleared)
        if (!index) index = &built.emplace(md.tensors, name_of);
        bytes += read_file_details(storage, md, *index, f, tensors, found);
      } catch (const error& e) {
        for (auto& got : found) got.clear();
        if (!problems) throw;
        problems->resize(files.size());
        (*problems)[f] = e.what();
        continue;
      }
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
