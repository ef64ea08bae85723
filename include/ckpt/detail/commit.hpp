#pragma once
// Rank 0's part of a commit: what each rank reports after writing its file, and the merge of
// all reports into the tag's metadata, with the checks that make a commit safe (one dtype and
// shape per tensor, every held tensor written, every tensor tiled exactly once).
// Kept apart from the checkpointer so the scale benchmark can feed it thousands of reports.

#include <algorithm>
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

/// How many threads rank 0 merges with: the copy of millions of chunk records into per-tensor
/// columns is bound by memory latency, which more cores hide.
inline unsigned merge_threads() noexcept { return std::clamp(std::thread::hardware_concurrency(), 1u, 8u); }

/// Merges every rank's report into the tag's metadata and checks it. The reports are read by
/// `threads` workers at once; each worker owns the tensors whose first sighting falls to it
/// (the i-th distinct name goes to worker i mod threads) and copies only their chunks, stepping
/// over the others, so no two workers write the same table and no locks are needed.
///
/// `recycle`, when given, is the previous commit's metadata: its chunk tables are emptied and
/// reused, so a job that commits every N steps allocates (and page-faults in) its chunk
/// columns once, not at every commit.
inline metadata merge_reports(const std::string& tag, std::uint64_t iteration, const ckpt::topology& topo,
                              const ckpt::config& cfg, const std::vector<std::vector<std::byte>>& reports,
                              unsigned threads = merge_threads(), metadata* recycle = nullptr) {
  metadata md;
  md.tag = tag;
  md.iteration = iteration;
  md.topology = topo;
  md.config = cfg;
  std::vector<rank_report> reps;
  reps.reserve(reports.size());
  std::vector<std::uint32_t> file_of(reports.size(), 0);
  for (std::size_t r = 0; r < reports.size(); ++r) {
    reps.push_back(decode_report(reports[r], static_cast<int>(r)));
    if (reps.back().path) {
      file_of[r] = static_cast<std::uint32_t>(md.files.size());
      md.files.push_back({*reps.back().path, 0, reps.back().size, reps.back().index_xxh3});
    }
  }
  threads = std::max(1u, threads);

  // One worker's view: every distinct tensor in the order first seen (all workers see the same
  // order, as they read the same reports in the same order), with the ones it owns merged.
  struct worker {
    std::vector<std::string> names;             // every tensor, in order of first sighting
    std::vector<std::size_t> slot;              // names[i] -> index into owned, or npos
    std::unordered_map<std::string, std::size_t, name_hash, std::equal_to<>> by_name;
    std::vector<tensor_meta> owned;
    std::exception_ptr failure;
  };
  std::vector<worker> workers(threads);
  std::vector<std::vector<chunk_table>> spare(threads);  // recycled tables, dealt out to the workers
  if (recycle)
    for (std::size_t i = 0; i < recycle->tensors.size(); ++i) spare[i % threads].push_back(std::move(recycle->tensors[i].chunks));
  auto run = [&](unsigned w) {
    auto& me = workers[w];
    try {
      std::size_t next = 0;  // ranks usually list tensors in the same order: try the next one first
      for (std::size_t r = 0; r < reps.size(); ++r) {
        if (!reps[r].path) continue;
        next = 0;
        const auto file = file_of[r];
        const auto rank = parse_index(
            reps[r].index, "the index of rank " + std::to_string(r),
            [&](std::string_view name, dtype type, const shape_t& shape, bounded_reader& rd) {
              std::size_t at = next;
              if (at >= me.names.size() || me.names[at] != name) {
                auto it = me.by_name.find(name);
                if (it == me.by_name.end()) {
                  const auto i = me.names.size();
                  it = me.by_name.emplace(std::string(name), i).first;
                  me.names.emplace_back(name);
                  me.slot.push_back(std::string::npos);
                  if (i % threads == w) {
                    me.slot.back() = me.owned.size();
                    auto& t = me.owned.emplace_back();
                    t.name = std::string(name);
                    t.type = type;
                    t.shape = shape;
                    if (!spare[w].empty()) {
                      t.chunks = std::move(spare[w].back());
                      spare[w].pop_back();
                      t.chunks.clear();
                    }
                    t.chunks.ndim = static_cast<std::uint32_t>(shape.size());
                  }
                }
                at = it->second;
              }
              next = at + 1;
              if (me.slot[at] == std::string::npos) return rd.skip_table(shape.size());
              auto& t = me.owned[me.slot[at]];
              if (t.type != type || t.shape != shape)
                throw error(error_kind::invalid_argument,
                            "tensor " + printable(name) + " is saved as " + std::string(to_string(t.type)) + " " +
                                to_string(t.shape) + " by one rank and as " + std::string(to_string(type)) + " " +
                                to_string(shape) + " by rank " + std::to_string(r));
              const auto n = rd.table(t.chunks, shape.size());
              std::fill(t.chunks.file.end() - static_cast<std::ptrdiff_t>(n), t.chunks.file.end(), file);
            },
            [&](value_record&& v) {
              if (w == 0) md.values.push_back({std::move(v.name), v.rank, file, v.file_offset, v.size, v.xxh3});
            });
        if (w == 0) md.files[file].rank = rank;
        if (file == 0)  // most layouts give every rank as many chunks as the first
          for (auto& t : me.owned) t.chunks.reserve(t.chunks.size() * reps.size());
      }
    } catch (...) {
      me.failure = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> pool;
    for (unsigned w = 1; w < threads; ++w) pool.emplace_back(run, w);
    run(0);
  }
  // Every worker read the same input, so a malformed report fails all of them alike; a dtype
  // or shape disagreement fails only its owner. Report the first in worker order either way.
  for (auto& me : workers)
    if (me.failure) std::rethrow_exception(me.failure);

  // A tensor some rank holds must have been written by the rank the policy chose; if that rank
  // does not hold it (the layout differs from what the policy assumes), it would vanish.
  for (std::size_t r = 0; r < reps.size(); ++r)
    for (const auto& name : reps[r].held)
      if (!workers[0].by_name.count(name))
        throw error(error_kind::invalid_argument,
                    "cannot commit " + tag + ": tensor " + printable(name) + " is held by rank " + std::to_string(r) +
                        " but no rank wrote it: the rank the shard policy chose as its writer does not declare it "
                        "(megatron: declare it on every rank of its pipeline stage or give it a shard_spec; "
                        "gather_to_root: declare it on rank 0)");
  for (auto& me : workers)
    for (auto& t : me.owned) md.tensors.push_back(std::move(t));
  std::sort(md.tensors.begin(), md.tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });

  // The tiling check, tensor by tensor on the same workers; the first failing tensor in name
  // order is reported, so the error does not depend on timing.
  std::vector<std::exception_ptr> bad(threads);
  std::vector<std::size_t> bad_at(threads, md.tensors.size());
  auto check = [&](unsigned w) {
    for (std::size_t i = w; i < md.tensors.size(); i += threads) try {
        const auto& t = md.tensors[i];
        check_tiling(t.name, t.shape, t.chunks,
                     [&](std::size_t c) -> const std::string& { return md.files[t.chunks.file[c]].path; },
                     error_kind::invalid_argument, "cannot commit " + tag + ": ");
      } catch (...) {
        bad[w] = std::current_exception();
        bad_at[w] = i;
        return;
      }
  };
  {
    std::vector<std::jthread> pool;
    for (unsigned w = 1; w < threads; ++w) pool.emplace_back(check, w);
    check(0);
  }
  const auto first = std::min_element(bad_at.begin(), bad_at.end()) - bad_at.begin();
  if (bad[static_cast<std::size_t>(first)]) std::rethrow_exception(bad[static_cast<std::size_t>(first)]);
  return md;
}

}  // namespace ckpt::detail
