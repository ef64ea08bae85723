#pragma once
// The definitions of detail/commit.hpp: rank 0's merge of the ranks' reports into one tag's metadata.
// Header-only builds include this at the end of detail/commit.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.

#include <algorithm>
#include <atomic>
#include <exception>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace ckpt::detail {

CKPT_DECL std::string encode_report(const std::optional<written_shard>& w, const std::vector<std::string>& held) {
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

CKPT_DECL rank_report decode_report(std::span<const std::byte> b, int rank) {
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

CKPT_DECL metadata merge_reports(const std::string& tag, std::uint64_t iteration, const ckpt::topology& topo,
                              const ckpt::config& cfg, const std::vector<std::vector<std::byte>>& reports,
                              unsigned threads, metadata* recycle) {
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

  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(std::max<std::size_t>(reps.size(), 1))));

  // Pass 1: each worker scans a contiguous range of reports, noting every tensor it meets (in
  // order of first sighting) and where that tensor's chunk table lies in each report.
  struct table_at {
    std::uint32_t report;
    std::size_t position;  // of the table's count in that report's index
  };
  struct scan {
    std::vector<tensor_meta> found;            // name, dtype and shape (chunks left empty)
    std::vector<std::uint32_t> first_report;   // per tensor: the report it was first seen in
    std::vector<std::vector<table_at>> where;  // per tensor, in report order
    std::vector<std::size_t> rows;             // per tensor: its chunks in this range
    std::unordered_map<std::string, std::size_t, name_hash, std::equal_to<>> by_name;
    std::vector<value_meta> values;
    std::exception_ptr failure;
  };
  std::vector<scan> scans(threads);
  auto scan_range = [&](unsigned w) {
    auto& me = scans[w];
    const std::size_t lo = reps.size() * w / threads, hi = reps.size() * (w + 1) / threads;
    try {
      for (std::size_t r = lo; r < hi; ++r) {
        if (!reps[r].path) continue;
        std::size_t next = 0;  // ranks usually list tensors in the same order: try the next one first
        const auto rank = parse_index(
            reps[r].index, "the index of rank " + std::to_string(r),
            [&](std::string_view name, dtype type, layout order, const shape_t& shape, bounded_reader& rd) {
              std::size_t at = next;
              if (at >= me.found.size() || me.found[at].name != name) {
                auto it = me.by_name.find(name);
                if (it == me.by_name.end()) {
                  it = me.by_name.emplace(std::string(name), me.found.size()).first;
                  auto& t = me.found.emplace_back();
                  t.name = std::string(name);
                  t.type = type;
                  t.shape = shape;
                  t.order = order;
                  me.first_report.push_back(static_cast<std::uint32_t>(r));
                  me.where.emplace_back().reserve(hi - r);
                  me.rows.push_back(0);
                }
                at = it->second;
              }
              next = at + 1;
              const auto& t = me.found[at];
              if (t.type != type || t.shape != shape || t.order != order)
                throw error(error_kind::invalid_argument,
                            "tensor " + printable(name) + " is saved as " + std::string(to_string(t.type)) + " " +
                                std::string(ckpt::to_string(t.order)) + " " + to_string(t.shape) + " by one rank and as " +
                                std::string(to_string(type)) + " " + std::string(ckpt::to_string(order)) + " " +
                                to_string(shape) + " by rank " + std::to_string(r));
              me.where[at].push_back({static_cast<std::uint32_t>(r), rd.position()});
              me.rows[at] += rd.skip_table(shape.size());
            },
            [&](value_record&& v) {
              me.values.push_back({std::move(v.name), v.rank, file_of[r], v.file_offset, v.size, v.xxh3});
            });
        md.files[file_of[r]].rank = rank;  // each report has its own file: no two workers write one
      }
    } catch (...) {
      me.failure = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> pool;
    for (unsigned w = 1; w < threads; ++w) pool.emplace_back(scan_range, w);
    scan_range(0);
  }
  for (auto& me : scans)
    if (me.failure) std::rethrow_exception(me.failure);

  // Join the scans in report order: every tensor in order of first sighting, and the parts of
  // the scans that hold its tables.
  struct part {
    unsigned scan;
    std::size_t tensor;  // in that scan
  };
  std::vector<tensor_meta> found;
  std::vector<std::vector<part>> parts;
  std::vector<std::size_t> rows;
  auto& by_name = scans[0].by_name;  // becomes the index of every tensor
  for (unsigned w = 0; w < threads; ++w) {
    auto& me = scans[w];
    for (std::size_t i = 0; i < me.found.size(); ++i) {
      std::size_t g = i;
      if (w != 0) {
        auto it = by_name.find(me.found[i].name);
        if (it == by_name.end()) it = by_name.emplace(me.found[i].name, found.size()).first;
        g = it->second;
      }
      if (g == found.size()) {
        found.push_back(std::move(me.found[i]));
        parts.emplace_back();
        rows.push_back(0);
      } else if (const auto& t = found[g];
                 t.type != me.found[i].type || t.shape != me.found[i].shape || t.order != me.found[i].order) {
        throw error(error_kind::invalid_argument,
                    "tensor " + printable(t.name) + " is saved as " + std::string(to_string(t.type)) + " " +
                        std::string(ckpt::to_string(t.order)) + " " + to_string(t.shape) + " by one rank and as " +
                        std::string(to_string(me.found[i].type)) + " " + std::string(ckpt::to_string(me.found[i].order)) +
                        " " + to_string(me.found[i].shape) + " by rank " + std::to_string(me.first_report[i]));
      }
      parts[g].push_back({w, i});
      rows[g] += me.rows[i];
    }
    for (auto& v : me.values) md.values.push_back(std::move(v));
  }

  // Pass 2: each tensor's columns, built at their final size by whichever worker takes it, and
  // its tiling checked while they are in cache.
  if (recycle)
    for (std::size_t i = 0; i < found.size() && i < recycle->tensors.size(); ++i) {
      found[i].chunks = std::move(recycle->tensors[i].chunks);
      found[i].chunks.clear();
    }
  std::atomic<std::size_t> next_tensor{0};
  std::vector<std::exception_ptr> failed(threads), tiling(found.size());
  auto build = [&](unsigned w) {
    try {
      for (std::size_t i; (i = next_tensor.fetch_add(1, std::memory_order_relaxed)) < found.size();) {
        auto& t = found[i].chunks;
        t.ndim = static_cast<std::uint32_t>(found[i].shape.size());
        t.resize(rows[i]);
        std::size_t row = 0;
        constexpr std::size_t ahead = 8;
        for (const auto& [sw, st] : parts[i]) {
          const auto& from = scans[sw].where[st];
          for (std::size_t k = 0; k < from.size(); ++k) {
            // Each table is in another report: ask for the one a few steps ahead early.
            if (k + ahead < from.size()) {
              const auto* p = reps[from[k + ahead].report].index.data() + from[k + ahead].position;
              __builtin_prefetch(p);
              __builtin_prefetch(p + 64);
            }
            const auto r = from[k].report;
            const auto n = bounded_reader::copy_table_at(reps[r].index, from[k].position, t, row);
            std::fill_n(t.file.begin() + static_cast<std::ptrdiff_t>(row), n, file_of[r]);
            row += n;
          }
        }
        try {
          // Only an empty tensor can have columns narrower than a reader's memory bound allows
          // (bounded_reader::skip_table): refuse it here rather than commit what cannot load.
          if (t.size() > 1 && std::ranges::find(found[i].shape, 0) != found[i].shape.end() &&
              table_widths::per_chunk(table_widths::of(t)) < table_widths::min_charge(t.ndim))
            throw error(error_kind::invalid_argument,
                        "cannot commit " + tag + ": tensor " + printable(found[i].name) + " of shape " +
                            to_string(found[i].shape) + " is empty along several dimensions and split into " +
                            std::to_string(t.size()) + " chunks; ckpt stores such a tensor only from one file");
          check_tiling(found[i].name, found[i].shape, t,
                       [&](std::size_t c) -> const std::string& { return md.files[t.file[c]].path; },
                       error_kind::invalid_argument, "cannot commit " + tag + ": ");
        } catch (...) {
          tiling[i] = std::current_exception();
        }
      }
    } catch (...) {
      failed[w] = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> pool;
    for (unsigned w = 1; w < threads; ++w) pool.emplace_back(build, w);
    build(0);
  }
  for (auto& f : failed)
    if (f) std::rethrow_exception(f);

  // A tensor some rank holds must have been written by the rank the policy chose; if that rank
  // does not hold it (the layout differs from what the policy assumes), it would vanish.
  for (std::size_t r = 0; r < reps.size(); ++r)
    for (const auto& name : reps[r].held)
      if (!by_name.count(name))
        throw error(error_kind::invalid_argument,
                    "cannot commit " + tag + ": tensor " + printable(name) + " is held by rank " + std::to_string(r) +
                        " but no rank wrote it: the rank the shard policy chose as its writer does not declare it "
                        "(megatron: declare it on every rank of its pipeline stage or give it a shard_spec; "
                        "gather_to_root: declare it on rank 0)");

  // Tensors in name order; of the tensors that fail the tiling check, the first in that order
  // is reported, so the error does not depend on timing.
  std::vector<std::size_t> order(found.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return found[a].name < found[b].name; });
  for (const auto i : order)
    if (tiling[i]) std::rethrow_exception(tiling[i]);
  md.tensors.reserve(found.size());
  for (const auto i : order) md.tensors.push_back(std::move(found[i]));
  return md;
}

}  // namespace ckpt::detail
