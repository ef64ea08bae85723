#pragma once
// Rank 0's part of a commit: what each rank reports after writing its file, and the merge of
// all reports into the tag's metadata, with the checks that make a commit safe (one dtype and
// shape per tensor, every held tensor written, every tensor tiled exactly once).
// Kept apart from the checkpointer so the scale benchmark can feed it thousands of reports.

#include <algorithm>
#include <array>
#include <cstring>
#include <atomic>
#include <exception>
#include <functional>
#include <span>
#include <string_view>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
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
#include "collective.hpp"
#include "name_index.hpp"
#include "name_sort.hpp"
#include "shard_io.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

/// What a rank tells rank 0 after writing, in two parts, so that at thousands of ranks rank 0
/// receives what the ranks have in common once, not once per rank (docs/format.md, section 9.2):
/// - `schema`: the tensors its file holds (name, dtype, layout, global shape, and how its
///   chunks cut the tensor: a grid cell and the pieces within it, or a list) and the names it
///   holds but another rank writes. The ranks of one tensor-parallel group, pipeline stage and
///   role have the same schema; only the lowest rank with each sends it.
/// - `own`: its file (path, size, footer checksum), its values, which grid cell of each tensor
///   it wrote (as arithmetic runs: usually one), and the chunks of tensors that are not a grid.
struct rank_summary {
  std::string schema;
  std::uint64_t schema_hash = 0;
  std::string own;
};

CKPT_DECL rank_summary summarize(const std::optional<written_shard>& w, const std::vector<std::string>& held);

/// The report a rank gathers to rank 0: its own part, and its schema when `with_schema`.
CKPT_DECL std::string encode_report(const rank_summary& s, bool with_schema);

/// Every rank's report with its schema (tests and benchmarks; merge_reports uses the first
/// schema of each hash it receives).
inline std::string encode_report(const std::optional<written_shard>& w, const std::vector<std::string>& held) {
  return encode_report(summarize(w, held), true);
}

/// Whether this rank sends its schema: no lower rank has the same one (collective: an
/// all_gather of 16 bytes per rank).
template <class Comm>
bool sends_schema(Comm& comm, const rank_summary& s) {
  if (comm.size() == 1) return true;
  const std::array<std::uint64_t, 2> mine = {s.schema_hash, s.schema.size()};
  const auto all = comm.all_gather(std::as_bytes(std::span(mine)));
  for (int r = 0; r < comm.rank(); ++r)
    if (all[static_cast<std::size_t>(r)].size() == sizeof mine &&
        std::memcmp(all[static_cast<std::size_t>(r)].data(), mine.data(), sizeof mine) == 0)
      return false;
  return true;
}

/// How many threads rank 0 finishes the merge with (each tensor's cells sorted and checked).
inline unsigned merge_threads() noexcept { return std::clamp(std::thread::hardware_concurrency(), 1u, 8u); }

/// Merges every rank's report into the tag's metadata (format version 2) and checks it: one
/// dtype, layout and shape per tensor, every held tensor written, and every tensor tiled
/// exactly once, a gap or an overlap named by its region and files. A tensor every rank cut
/// into the same grid cells and pieces gets a grid layout: its cells are checked as numbers
/// (each cell once), so the cost is one small record per rank and tensor. Others get a list,
/// checked chunk by chunk.
CKPT_DECL metadata merge_reports(const std::string& tag, std::uint64_t iteration, const ckpt::topology& topo,
                                 const ckpt::config& cfg, const std::vector<std::vector<std::byte>>& reports,
                                 unsigned threads = merge_threads());

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/commit.ipp"
#endif
