#pragma once
// Rank 0's part of a commit: what each rank reports after writing its file, and the merge of
// all reports into the tag's metadata, with the checks that make a commit safe (one dtype and
// shape per tensor, every held tensor written, every tensor tiled exactly once).
// Kept apart from the checkpointer so the scale benchmark can feed it thousands of reports.

#include <algorithm>
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
#include "shard_io.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

inline std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

/// What every rank sends rank 0 after writing: its file (if any) and index.
CKPT_DECL std::string encode_report(const std::optional<written_shard>& w, const std::vector<std::string>& held);

/// A rank's report, with its index left as bytes for parse_index to stream through.
struct rank_report {
  std::optional<std::string> path;
  std::uint64_t size = 0;
  std::uint64_t index_xxh3 = 0;
  std::span<const std::byte> index;  // points into the report
  std::vector<std::string> held;     // tensors the rank holds but another rank was to write
};

CKPT_DECL rank_report decode_report(std::span<const std::byte> b, int rank);

/// Hashes std::string and std::string_view alike, so lookups by view allocate nothing.
struct name_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

/// How many threads rank 0 merges with: the copy of millions of chunk records into per-tensor
/// columns is bound by memory latency, which more cores hide.
inline unsigned merge_threads() noexcept { return std::clamp(std::thread::hardware_concurrency(), 1u, 8u); }

/// Merges every rank's report into the tag's metadata and checks it, in two passes.
///
/// A checkpoint of R tensor-parallel ranks has R chunks of every tensor, one in each report.
/// Copying them rank by rank would scatter small writes over every column of every tensor at
/// once (seven columns × thousands of tensors), and at millions of chunks those cache misses
/// were most of the commit. So the first pass, on one thread, walks the reports in order and
/// only notes where each tensor's chunk table lies (and checks dtypes and shapes); the second,
/// on `threads` workers, builds each tensor's columns at their final size, copying from the
/// noted places, so every write streams into one tensor at a time.
///
/// `recycle`, when given, is the previous commit's metadata: its chunk tables are emptied and
/// reused, so a job that commits every N steps allocates (and page-faults in) its chunk
/// columns once, not at every commit.
CKPT_DECL metadata merge_reports(const std::string& tag, std::uint64_t iteration, const ckpt::topology& topo,
                              const ckpt::config& cfg, const std::vector<std::vector<std::byte>>& reports,
                              unsigned threads = merge_threads(), metadata* recycle = nullptr);

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/commit.ipp"
#endif
