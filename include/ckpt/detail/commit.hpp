#pragma once
// Rank 0's part of a commit: what each rank reports after writing its file, and the merge of
// all reports into the tag's metadata, with the checks that make a commit safe (one dtype and
// shape per tensor, every held tensor written, every tensor tiled exactly once).
// Kept apart from the checkpointer so the scale benchmark can feed it thousands of reports.

#include <algorithm>
#include <functional>
#include <span>
#include <string_view>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../topology.hpp"
#include "coverage.hpp"
#include "format.hpp"
#include "metadata.hpp"
#include "shard_io.hpp"

namespace ckpt::detail {

inline std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

/// What every rank sends rank 0 after writing: its file (if any) and index.
inline std::string encode_report(const std::optional<written_shard>& w, const std::vector<std::string>& held) {
  std::ostringstream os(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(os);
    ar(w.has_value());
    if (w) {
      write_string(ar, w->path);
      ar(w->size, w->index_xxh3);
      write_string(ar, encode_index(w->index));
    }
    ar(static_cast<std::uint64_t>(held.size()));
    for (const auto& n : held) write_string(ar, n);
  }
  return std::move(os).str();
}

/// A rank's report, with its index left as bytes for parse_index to stream through.
struct rank_report {
  std::optional<std::string> path;
  std::uint64_t size = 0;
  std::uint64_t index_xxh3 = 0;
  std::span<const std::byte> index;  // points into the report
  std::vector<std::string> held;     // tensors the rank holds but another rank was to write
};

inline rank_report decode_report(std::span<const std::byte> b, int rank) {
  bounded_reader rd(b, "the report of rank " + std::to_string(rank), error_kind::communication);
  rank_report r;
  if (rd.u8() != 0) {
    r.path = rd.string();
    r.size = rd.u64();
    r.index_xxh3 = rd.u64();
    r.index = rd.take(rd.count(1, "index byte"));
  }
  r.held.resize(rd.count(8, "tensor name"));
  for (auto& n : r.held) n = rd.string();
  return r;
}

/// Hashes std::string and std::string_view alike, so lookups by view allocate nothing.
struct name_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

inline metadata merge_reports(const std::string& tag, std::uint64_t iteration, const ckpt::topology& topo,
                              const ckpt::config& cfg, const std::vector<std::vector<std::byte>>& reports) {
  metadata md;
  md.tag = tag;
  md.iteration = iteration;
  md.topology = topo;
  md.config = cfg;
  // tensor name -> index in md.tensors
  std::unordered_map<std::string, std::size_t, name_hash, std::equal_to<>> by_name;
  std::vector<std::pair<std::string, std::size_t>> held;  // (name, rank) left to another writer
  std::size_t next = 0;  // ranks usually list tensors in the same order: try the next one first
  for (std::size_t r = 0; r < reports.size(); ++r) {
    auto rep = decode_report(reports[r], static_cast<int>(r));
    next = 0;
    for (auto& n : rep.held) held.emplace_back(std::move(n), r);
    if (!rep.path) continue;
    const auto file = static_cast<std::uint32_t>(md.files.size());
    const auto rank = parse_index(
        rep.index, "the index of rank " + std::to_string(r),
        [&](std::string_view name, dtype type, const shape_t& shape, bounded_reader& rd) {
          std::size_t at = next;
          if (at >= md.tensors.size() || md.tensors[at].name != name) {
            auto it = by_name.find(name);
            if (it == by_name.end()) {
              it = by_name.emplace(std::string(name), md.tensors.size()).first;
              auto& t = md.tensors.emplace_back();
              t.name = std::string(name);
              t.type = type;
              t.shape = shape;
              t.chunks.ndim = static_cast<std::uint32_t>(shape.size());
            }
            at = it->second;
          }
          next = at + 1;
          auto& t = md.tensors[at];
          if (t.type != type || t.shape != shape)
            throw error(error_kind::invalid_argument,
                        "tensor " + printable(name) + " is saved as " + std::string(to_string(t.type)) + " " +
                            to_string(t.shape) + " by one rank and as " + std::string(to_string(type)) + " " +
                            to_string(shape) + " by rank " + std::to_string(r));
          const auto n = rd.table(t.chunks, shape.size());
          std::fill(t.chunks.file.end() - static_cast<std::ptrdiff_t>(n), t.chunks.file.end(), file);
        },
        [&](value_record&& v) { md.values.push_back({std::move(v.name), v.rank, file, v.file_offset, v.size, v.xxh3}); });
    md.files.push_back({*rep.path, rank, rep.size, rep.index_xxh3});
    if (md.files.size() == 1)  // most layouts give every rank as many chunks as the first
      for (auto& t : md.tensors) t.chunks.reserve(t.chunks.size() * reports.size());
  }
  // A tensor some rank holds must have been written by the rank the policy chose; if that rank
  // does not hold it (the layout differs from what the policy assumes), it would vanish.
  for (const auto& [name, r] : held)
    if (!by_name.count(name))
      throw error(error_kind::invalid_argument,
                  "cannot commit " + tag + ": tensor " + printable(name) + " is held by rank " + std::to_string(r) +
                      " but no rank wrote it: the rank the shard policy chose as its writer does not declare it "
                      "(megatron: declare it on every rank of its pipeline stage or give it a shard_spec; "
                      "gather_to_root: declare it on rank 0)");
  std::sort(md.tensors.begin(), md.tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& t : md.tensors)
    check_tiling(t.name, t.shape, t.chunks, [&](std::size_t i) -> const std::string& { return md.files[t.chunks.file[i]].path; },
                         error_kind::invalid_argument, "cannot commit " + tag + ": ");
  return md;
}

}  // namespace ckpt::detail
