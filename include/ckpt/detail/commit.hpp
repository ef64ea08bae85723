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
#include "table_memory.hpp"

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
  table_string schema;
  std::uint64_t schema_hash = 0;
  table_string own;
};

CKPT_DECL rank_summary summarize(const written_shard* w, const std::vector<std::string>& held);
inline rank_summary summarize(const std::optional<written_shard>& w, const std::vector<std::string>& held) {
  return summarize(w ? &*w : nullptr, held);
}

/// The report a rank gathers to rank 0: its own part, and its schema when `with_schema`.
CKPT_DECL table_string encode_report(const rank_summary& s, bool with_schema);

/// Every rank's report with its schema (tests and benchmarks; merge_reports uses the first
/// schema of each hash it receives).
inline table_string encode_report(const std::optional<written_shard>& w, const std::vector<std::string>& held) {
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

/// What only the written file decides, which a rank reports after writing when its report was
/// made from its shard's plan (before the first byte): the file's size and index checksum, and
/// its values with their places. An empty `w`: the rank wrote no file.
CKPT_DECL std::string encode_written(const written_shard* w);

/// Completes metadata merged from reports made before writing (their files' sizes and index
/// checksums 0, no values) with what each rank reported after writing (`encode_written`, in
/// rank order). A rank that now reports a file it did not announce, or none where it did, is
/// a `communication` error.
CKPT_DECL void attach_written(metadata& md, const std::vector<std::vector<std::byte>>& written);

/// How many threads rank 0 finishes the merge with (each tensor's cells sorted and checked).
inline unsigned merge_threads() noexcept { return std::clamp(std::thread::hardware_concurrency(), 1u, 8u); }

/// Merges every rank's report into the tag's metadata (format version 2) and checks it: one
/// dtype, layout and shape per tensor, every held tensor written, and every tensor tiled
/// exactly once, a gap or an overlap named by its region and files. A tensor every rank cut
/// into the same grid cells and pieces gets a grid layout: its cells are checked as numbers
/// (each cell once), so the cost is one small record per rank and tensor. Others get a list,
/// checked chunk by chunk.
CKPT_DECL metadata merge_reports(const std::string& tag, std::uint64_t iteration, const ckpt::topology& topo,
                                 const ckpt::config& cfg, std::span<const std::span<const std::byte>> reports,
                                 unsigned threads = merge_threads());

/// Views of the reports a Communicator's gather returned, for merge_reports.
inline std::vector<std::span<const std::byte>> report_views(const std::vector<std::vector<std::byte>>& reports) {
  return {reports.begin(), reports.end()};
}

/// merge_reports of reports as a Communicator's gather returns them (tests and benchmarks).
inline metadata merge_reports(const std::string& tag, std::uint64_t iteration, const ckpt::topology& topo,
                              const ckpt::config& cfg, const std::vector<std::vector<std::byte>>& reports,
                              unsigned threads = merge_threads()) {
  return merge_reports(tag, iteration, topo, cfg, report_views(reports), threads);
}

/// Rank 0's merge of the reports the ranks made from their shard files' plans, on a thread of
/// its own while the files are written, so that a save of many tensors does not wait for it
/// after the last byte; the same thread then encodes the tensors' records of metadata.json,
/// which the files' sizes and values do not change. `get` joins it and returns both or throws
/// its error; a save that fails first leaves it to the destructor, which joins it and drops its
/// result.
class background_merge {
 public:
  background_merge() = default;
  background_merge(const background_merge&) = delete;
  background_merge& operator=(const background_merge&) = delete;

  /// Starts the merge; the bytes `reports` views must outlive this object or the call to `get`.
  void start(std::string tag, std::uint64_t iteration, ckpt::topology topo, ckpt::config cfg,
             std::vector<std::span<const std::byte>> reports) {
    thread_ = std::jthread([this, tag = std::move(tag), iteration, topo = std::move(topo), cfg = std::move(cfg),
                            reports = std::move(reports)] {
      try {
        merged_.md = merge_reports(tag, iteration, topo, cfg, reports);
        merged_.tensor_records = encode_tensor_records(merged_.md);
      } catch (...) {
        failure_ = std::current_exception();
      }
    });
  }
  merged_metadata get() {
    if (thread_.joinable()) thread_.join();
    if (failure_) std::rethrow_exception(failure_);
    return std::move(merged_);
  }

 private:
  merged_metadata merged_;
  std::exception_ptr failure_;
  std::jthread thread_;  // last: joined before the results it writes are destroyed
};

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/commit.ipp"
#endif
