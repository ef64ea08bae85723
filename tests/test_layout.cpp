// Format 2's chunk layouts (detail/chunk_layout.hpp): what rank 0 merges from the ranks'
// reports (grids, lists, and the gaps and overlaps it names), the reports' schemas sent once,
// and the hostile chunk maps a reader refuses before it allocates or loops on what they claim.

#include "helpers.hpp"
#include "on_ranks.hpp"

#include <ckpt/detail/commit.hpp>
#include <ckpt/detail/metadata.hpp>
#include <ckpt/in_process.hpp>
#include <ckpt/megatron.hpp>
#include <ckpt/reader.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace d = ckpt::detail;
using ckpt::shape_t;

namespace {

/// What rank r of `ranks` writes of a [4 ranks, 6] tensor "w" split by rows (and, with
/// `two_pieces`, cut into two chunks of two rows).
d::written_shard layout_shard(std::uint32_t r, std::uint64_t row0, std::uint64_t rows, std::uint64_t total_rows, bool two_pieces = false) {
  d::written_shard w;
  w.path = "mp_rank_0" + std::to_string(r) + "/model_optim_rng.ckpt";
  w.index.rank = r;
  auto& g = w.index.tensors.emplace_back();
  g.name = "w";
  g.global_shape = {total_rows, 6};
  g.chunks.ndim = 2;
  if (two_pieces) {
    g.chunks.push(0, shape_t{row0, 0}, shape_t{rows / 2, 6}, 0, 4096, rows / 2 * 24, 1);
    g.chunks.push(0, shape_t{row0 + rows / 2, 0}, shape_t{rows - rows / 2, 6}, 0, 8192, (rows - rows / 2) * 24, 2);
  } else {
    g.chunks.push(0, shape_t{row0, 0}, shape_t{rows, 6}, 0, 4096, rows * 24, 1);
  }
  w.size = 1 << 20;
  return w;
}

std::vector<std::byte> report_bytes(std::string_view s) {
  const auto* b = reinterpret_cast<const std::byte*>(s.data());
  return {b, b + s.size()};
}

d::metadata merge_shards(const std::vector<d::written_shard>& ws) {
  std::vector<std::vector<std::byte>> reports;
  for (const auto& w : ws) reports.push_back(report_bytes(d::encode_report(w, {})));
  return d::merge_reports("global_step1", 1, {static_cast<std::uint32_t>(ws.size()), 1, 1, static_cast<std::uint32_t>(ws.size())}, {},
                          reports, 2);
}

std::string merge_shards_error(const std::vector<d::written_shard>& ws) {
  return test::catch_error([&] { (void)merge_shards(ws); }).what();
}

/// `md`'s chunk map encoded, then decoded into a copy of `md` (its layouts checked).
void map_round_trip(d::metadata md) {
  const auto map = d::encode_chunk_map(md);
  md.chunk_map.size = map.size();
  md.chunk_map.xxh3 = d::xxh3(map);
  for (auto& t : md.tensors) t.placement.reset();
  d::decode_chunk_map(std::as_bytes(std::span(map.data(), map.size())), md, "chunk_map.bin");
}

}  // namespace

TEST_CASE("layouts: an even split merges into a grid, cell by cell, whatever order the ranks report in") {
  auto md = merge_shards({layout_shard(0, 0, 2, 8), layout_shard(1, 2, 2, 8), layout_shard(2, 4, 2, 8), layout_shard(3, 6, 2, 8)});
  REQUIRE(md.format_version == 2);
  const auto& l = *md.tensors.at(0).placement;
  CHECK(l.how == d::chunk_layout::kind::grid);
  CHECK(l.block == shape_t{2, 6});
  CHECK(l.runs == decltype(d::chunk_layout::runs){{4, 0, 1}});
  CHECK(md.tensors[0].chunk_count == 4);
  map_round_trip(md);
  // Files in another order than cells: still a grid, its runs say which file holds which cell.
  md = merge_shards({layout_shard(0, 6, 2, 8), layout_shard(1, 4, 2, 8), layout_shard(2, 2, 2, 8), layout_shard(3, 0, 2, 8)});
  const auto& back = *md.tensors.at(0).placement;
  CHECK(back.how == d::chunk_layout::kind::grid);
  for (std::uint64_t k = 0; k < 4; ++k) CHECK(back.file_of_cell(k) == 3 - k);
  d::chunk_table in2;
  d::chunks_in_file(back, md.tensors[0].shape, 2, in2);  // file 2 holds rows 2 and 3
  REQUIRE(in2.size() == 1);
  CHECK(in2.offset(0)[0] == 2);
  map_round_trip(md);
  // Each rank's shard in two chunks: a grid of cells of two pieces.
  md = merge_shards({layout_shard(0, 0, 4, 8, true), layout_shard(1, 4, 4, 8, true)});
  CHECK(md.tensors[0].placement->pieces().size() == 2);
  CHECK(md.tensors[0].chunk_count == 4);
}

TEST_CASE("layouts: an uneven split, or ranks that cut a tensor differently, merge into a list") {
  auto md = merge_shards({layout_shard(0, 0, 3, 8), layout_shard(1, 3, 3, 8), layout_shard(2, 6, 2, 8)});
  CHECK(md.tensors.at(0).placement->how == d::chunk_layout::kind::list);
  CHECK(md.tensors[0].chunk_count == 3);
  map_round_trip(md);
  // Same cells, but rank 1 cut its cell into two chunks: its pieces differ, so a list.
  md = merge_shards({layout_shard(0, 0, 4, 8), layout_shard(1, 4, 4, 8, true)});
  CHECK(md.tensors.at(0).placement->how == d::chunk_layout::kind::list);
  CHECK(md.tensors[0].chunk_count == 3);
  map_round_trip(md);
}

TEST_CASE("layouts: a merge names the region stored twice and the region no rank stored, with their files") {
  auto e = merge_shards_error({layout_shard(0, 0, 2, 8), layout_shard(1, 2, 2, 8), layout_shard(2, 2, 2, 8), layout_shard(3, 6, 2, 8)});
  CHECK(test::mentions(e, "cannot commit global_step1: tensor 'w': region [2:4, 0:6] is stored twice"));
  CHECK(test::mentions(e, "mp_rank_01/model_optim_rng.ckpt and mp_rank_02/model_optim_rng.ckpt"));
  e = merge_shards_error({layout_shard(0, 0, 2, 8), layout_shard(1, 2, 2, 8), layout_shard(3, 6, 2, 8)});
  CHECK(test::mentions(e, "region [4:6, 0:6] of global shape [8, 6] is not stored by any shard"));
  // As a list (uneven), the same checks.
  e = merge_shards_error({layout_shard(0, 0, 3, 8), layout_shard(1, 3, 3, 8)});
  CHECK(test::mentions(e, "is not stored by any shard"));
  e = merge_shards_error({layout_shard(0, 0, 3, 8), layout_shard(1, 2, 3, 8), layout_shard(2, 5, 3, 8)});
  CHECK(test::mentions(e, "is stored twice"));
}

TEST_CASE("layouts: only the lowest rank of each schema sends it, and rank 0 merges from those") {
  // Ranks 0 to 3 write the same tensors (one schema); rank 4 writes another.
  std::vector<bool> sends(5);
  std::vector<std::vector<std::byte>> reports(5);
  const auto errors = test::on_ranks(5, [&](ckpt::in_process comm, std::uint32_t r) {
    auto w = r < 4 ? layout_shard(r, 2 * r, 2, 8) : layout_shard(r, 0, 4, 4);
    if (r == 4) w.index.tensors[0].name = "v";
    const auto s = d::summarize(w, {});
    sends[r] = d::sends_schema(comm, s);
    reports[r] = report_bytes(d::encode_report(s, sends[r]));
  });
  for (const auto& e : errors) REQUIRE(e == "");
  CHECK(sends == std::vector<bool>{true, false, false, false, true});
  CHECK(reports[1].size() < reports[0].size());
  const auto md = d::merge_reports("global_step1", 1, {5, 1, 1, 5}, {}, reports, 1);
  REQUIRE(md.tensors.size() == 2);
  CHECK(md.tensors[1].placement->runs == decltype(d::chunk_layout::runs){{4, 0, 1}});
  CHECK(md.tensors[0].placement->runs == decltype(d::chunk_layout::runs){{1, 4, 0}});
  // A report that names a schema nobody sent is a communication error, not a guess.
  reports.erase(reports.begin());
  const auto e = test::catch_error([&] { (void)d::merge_reports("global_step1", 1, {4, 1, 1, 4}, {}, reports, 1); });
  CHECK(e.kind() == ckpt::error_kind::communication);
  CHECK(test::mentions(e.what(), "refers to a schema no rank sent"));
}

TEST_CASE("layouts: merged from the files' plans and completed after writing, a commit is the one merged after writing") {
  // A save reports its shard file's plan before writing (every chunk's place in its tensor, but
  // not in the file) and rank 0 merges it while the bytes are written; then each rank reports
  // its file's size and index checksum and its values. Ranks 0-2 write, rank 3 writes no file.
  std::vector<std::optional<d::written_shard>> written;
  for (std::uint32_t r = 0; r < 3; ++r) {
    auto w = layout_shard(r, 2 * r, 2, 6);
    w.size = (1u << 20) + r;
    w.index_xxh3 = 0x1234 + r;
    w.index.values.push_back({"rng", r, 8192 + r, 16, 0x99 + r});
    if (r == 1) w.index.values.push_back({"step", r, 9000, 8, 0x77});
    written.push_back(std::move(w));
  }
  written.emplace_back();
  std::vector<std::vector<std::byte>> after, planned, facts;
  for (const auto& w : written) {
    after.push_back(report_bytes(d::encode_report(w, {})));
    facts.push_back(report_bytes(d::encode_written(w ? &*w : nullptr)));
    auto plan = w;  // what the plan knew: no place in the file, no values, no size
    if (plan) {
      plan->size = plan->index_xxh3 = 0;
      plan->index.values.clear();
      for (auto& g : plan->index.tensors)
        for (std::size_t c = 0; c < g.chunks.size(); ++c) g.chunks.file_offset[c] = g.chunks.stored_size[c] = g.chunks.xxh3[c] = 0;
    }
    planned.push_back(report_bytes(d::encode_report(plan, {})));
  }
  const ckpt::topology topo{4, 1, 1, 4};
  const auto whole = d::merge_reports("global_step1", 1, topo, {}, after, 2);
  auto early = d::merge_reports("global_step1", 1, topo, {}, planned, 2);
  CHECK(early.values.empty());
  CHECK(early.files.at(0).size == 0);
  auto completed = early;
  d::attach_written(completed, facts);
  CHECK(d::encode_metadata(completed) == d::encode_metadata(whole));
  CHECK(d::encode_chunk_map(completed) == d::encode_chunk_map(whole));
  REQUIRE(completed.values.size() == 4);
  CHECK(completed.values[2].name == "step");
  CHECK(completed.values[2].file == 1);
  // A rank that writes a file it did not plan, or none where it planned one, is refused.
  auto extra = facts;
  extra[3] = facts[2];
  auto md = early;
  auto e = test::catch_error([&] { d::attach_written(md, extra); });
  CHECK(e.kind() == ckpt::error_kind::communication);
  CHECK(test::mentions(e.what(), "what rank 3 reported after writing: it wrote a file it did not plan"));
  auto missing = facts;
  missing[1] = report_bytes(d::encode_written(nullptr));
  md = early;
  e = test::catch_error([&] { d::attach_written(md, missing); });
  CHECK(test::mentions(e.what(), "what rank 1 reported after writing: it planned a file but wrote none"));
  // Truncated: refused, not read past its end.
  auto cut = facts;
  cut[1].resize(cut[1].size() - 3);
  md = early;
  e = test::catch_error([&] { d::attach_written(md, cut); });
  CHECK(e.kind() == ckpt::error_kind::communication);
  CHECK(test::mentions(e.what(), "rank 1"));
}

TEST_CASE("layouts: a hostile version-2 chunk map is refused as corrupt, naming the tensor, before any allocation") {
  const auto md0 = merge_shards({layout_shard(0, 0, 2, 8), layout_shard(1, 2, 2, 8), layout_shard(2, 4, 2, 8), layout_shard(3, 6, 2, 8)});
  auto refused = [&](auto&& change) {
    auto md = md0;
    change(*md.tensors[0].placement, md);
    const auto e = test::catch_error([&] { map_round_trip(md); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(test::mentions(e.what(), "tensor 'w'"));
    return std::string(e.what());
  };
  CHECK(test::mentions(refused([](auto& l, auto&) { l.block = {3, 6}; }), "do not divide its shape [8, 6]"));
  CHECK(test::mentions(refused([](auto& l, auto&) { l.block = {0, 6}; }), "do not divide"));
  CHECK(test::mentions(refused([](auto& l, auto&) { l.runs = {{5, 0, 1}}; }), "cover more than its 4 grid cells"));
  CHECK(test::mentions(refused([](auto& l, auto&) { l.runs = {{3, 0, 1}}; }), "cover 3 of its 4 grid cells"));
  CHECK(test::mentions(refused([](auto& l, auto&) { l.runs = {{4, 1, 1}}; }), "beyond the 4 the tag has"));
  CHECK(test::mentions(refused([](auto& l, auto&) { l.runs = {{4, 0, 0x80000000u}}; }), "beyond the 4 the tag has"));
  CHECK(test::mentions(refused([](auto& l, auto&) { l.runs = {{2, 0, 1}, {0, 2, 1}, {2, 2, 1}}; }), "covers no cells"));
  CHECK(test::mentions(refused([](auto& l, auto&) { l.pieces().append(l.pieces(), 0); }), "stored twice"));
  CHECK(test::mentions(refused([](auto& l, auto&) { l.pieces().coords[3] = 5; }), "not stored by any shard"));
  CHECK(test::mentions(refused([](auto& l, auto&) { l.pieces().clear(); }), "have no chunks"));
  // Huge counts: a grid of 2^62 cells of one element, all in file 0 (a step-0 run), whose
  // footer would have to list them; and cells times pieces that overflow.
  CHECK(test::mentions(refused([](auto& l, auto& md) {
                         md.tensors[0].shape = {std::uint64_t{1} << 40, 6};
                         md.tensors[0].chunk_count = 0;
                         l.block = {1, 6};
                         test::set_coords(l.pieces(), {0, 0, 1, 6});
                         l.runs = {{std::uint64_t{1} << 40, 0, 0}};
                       }),
                       "more than its 1048576 bytes could list"));
  // A list whose chunks do not tile the tensor, or name a file it does not have.
  auto list = md0;
  list.tensors[0].placement = d::chunk_layout{};
  auto& c = list.tensors[0].placement->chunks();
  c.ndim = 2;
  c.push(0, shape_t{0, 0}, shape_t{8, 6});
  map_round_trip(list);
  c.file[0] = 9;
  auto e = test::catch_error([&] { map_round_trip(list); });
  CHECK(test::mentions(e.what(), "has a chunk in file #9 of 4"));
  c.file[0] = 0;
  c.coords[2] = 7;
  e = test::catch_error([&] { map_round_trip(list); });
  CHECK(test::mentions(e.what(), "is not stored by any shard"));
  // A shape whose size overflows is damage, named as such, before its grid is looked at.
  CHECK(test::mentions(refused([](auto&, auto& md) { md.tensors[0].shape = {std::uint64_t{1} << 62, 6}; }), "overflows"));
  // An unknown layout kind byte.
  auto md = md0;
  auto map = d::encode_chunk_map(md);
  map[16 + 1 + 8] = 7;  // the first tensor's kind
  md.chunk_map.size = map.size();
  md.chunk_map.xxh3 = d::xxh3(map);
  e = test::catch_error([&] { d::decode_chunk_map(std::as_bytes(std::span(map.data(), map.size())), md, "chunk_map.bin"); });
  CHECK(test::mentions(e.what(), "tensor 'w': unknown layout kind 7"));
}

TEST_CASE("layouts: a load checks a file's footer against the layout, and counts before it lists") {
  struct one {
    std::vector<float> w = std::vector<float>(48, 1.5f);
    void checkpoint(ckpt::visitor& v) { v.tensor("w", ckpt::view(w.data(), {8, 6})); }
  } s;
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  cp.save(1, s);
  const auto original = test::read_metadata(mem, "global_step1");
  // Rewrites the tag's version-2 chunk map and metadata.json with `change` made to w's layout.
  auto load_with = [&](auto&& change) {
    auto md = original;
    for (auto& t : md.tensors) t.chunks.clear();
    change(*md.tensors.at(0).placement, md.tensors[0]);
    const auto map = d::encode_chunk_map(md);
    md.chunk_map.size = map.size();
    md.chunk_map.xxh3 = d::xxh3(map);
    const auto text = d::encode_metadata(md);
    mem.bytes("global_step1/chunk_map.bin") = report_bytes(map);
    mem.bytes("global_step1/metadata.json") = report_bytes(text);
    one back;
    return test::catch_error([&] { (void)cp.load(back); });
  };
  // Eight one-cell runs, all in file 0: each run is short, so only the count against the
  // footer (one chunk) can refuse it, before eight are listed.
  auto e = load_with([](d::chunk_layout& l, d::tensor_meta& t) {
    l.block = {1, 6};
    test::set_coords(l.pieces(), {0, 0, 1, 6});
    l.runs.assign(8, d::file_run{1, 0, 0});
    t.chunk_count = 8;
  });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(test::mentions(e.what(), "tensor 'w': the footer index holds 1 chunks, chunk_map.bin places 8 in this file"));
  // The cell cut in two pieces the footer does not have.
  e = load_with([](d::chunk_layout& l, d::tensor_meta& t) {
    l.block = {8, 6};
    test::set_coords(l.pieces(), {0, 0, 8, 3, 0, 3, 8, 3});
    l.runs = {{1, 0, 0}};
    t.chunk_count = 2;
  });
  CHECK(test::mentions(e.what(), "the footer index holds 1 chunks, chunk_map.bin places 2"));
  // Unchanged, it loads.
  auto md = original;
  for (auto& t : md.tensors) t.chunks.clear();
  const auto map = d::encode_chunk_map(md);
  md.chunk_map.size = map.size();
  md.chunk_map.xxh3 = d::xxh3(map);
  mem.bytes("global_step1/chunk_map.bin") = report_bytes(map);
  mem.bytes("global_step1/metadata.json") = report_bytes(d::encode_metadata(md));
  one back;
  back.w.assign(48, 0.0f);
  (void)cp.load(back);
  CHECK(back.w == s.w);
}

#if defined(CKPT_TEST_DATA)
namespace {
/// The state tests/data/format_v1 holds (tests/data/README.md): a tp-split qkv and proj, a
/// replicated norm, and per-rank values.
struct v1_state {
  std::uint32_t tp, rank;
  std::vector<float> qkv, proj, norm;
  std::uint64_t step = 0;
  std::mt19937_64 rng;
  v1_state(std::uint32_t t, std::uint32_t r) : tp(t), rank(r), qkv(16 * 8 / t), proj(8 * 16 / t), norm(8) {}
  void checkpoint(ckpt::visitor& v) {
    v.tensor("layers.0.qkv.weight", ckpt::view(qkv.data(), {16 / tp, 8}).sharded({.global_shape = {16, 8}, .offset = {16 / tp * rank, 0}}));
    v.tensor("layers.0.proj.weight", ckpt::view(proj.data(), {8, 16 / tp}).sharded({.global_shape = {8, 16}, .offset = {0, 16 / tp * rank}}));
    v.tensor("layers.0.norm.weight", norm);
    v.value("step", step);
    v.value("rng", rng);
  }
};
/// Element i of the global qkv [16, 8] and proj [8, 16] as the fixture's ranks saved them.
float saved_qkv(std::uint64_t row, std::uint64_t col) {
  const auto r = row / 8;
  return static_cast<float>(1000 * r + (row % 8) * 8 + col) * 0.5f;
}
float saved_proj(std::uint64_t row, std::uint64_t col) {
  const auto r = col / 8;
  return -static_cast<float>(1000 * r + row * 8 + col % 8) * 0.25f;
}
}  // namespace

TEST_CASE("format 1: a checkpoint ckpt wrote before format 2 loads at its layout and at another, every byte checked") {
  test::temp_dir dir;
  std::filesystem::copy(CKPT_TEST_DATA "/format_v1", dir.path(), std::filesystem::copy_options::recursive);
  using tp_cp = ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix>;
  for (const std::uint32_t tp : {2u, 1u}) {
    const auto errors = test::on_ranks(tp, [&](ckpt::in_process comm, std::uint32_t r) {
      tp_cp cp{{.tp = tp, .comm = comm}, dir.path()};
      v1_state s(tp, r);
      const auto res = cp.load(s, {.on_topology_change = ckpt::topology_change::from_rank_0});
      if (res.iteration != 77 || res.tag != "global_step77") throw std::runtime_error("wrong tag");
      const auto rows = 16 / tp, cols = 16 / tp;
      for (std::uint64_t i = 0; i < rows; ++i)
        for (std::uint64_t j = 0; j < 8; ++j)
          if (s.qkv[i * 8 + j] != saved_qkv(rows * r + i, j)) throw std::runtime_error("qkv differs");
      for (std::uint64_t i = 0; i < 8; ++i)
        for (std::uint64_t j = 0; j < cols; ++j)
          if (s.proj[i * cols + j] != saved_proj(i, cols * r + j)) throw std::runtime_error("proj differs");
      for (std::size_t i = 0; i < 8; ++i)
        if (s.norm[i] != 1.0f + static_cast<float>(i)) throw std::runtime_error("norm differs");
      std::mt19937_64 want(42 + (tp == 2 ? r : 0));
      want.discard(5);
      if (s.step != 77 || s.rng != want) throw std::runtime_error("values differ");
    });
    for (const auto& e : errors) CHECK(e == "");
  }
  // The reader (what ckpt verify, export and diff use) reads it too, and checks every chunk.
  ckpt::reader r{ckpt::posix(dir.path())};
  CHECK(r.info().format_version == 1);
  const auto rep = r.verify();
  CHECK(rep.ok());
  CHECK(rep.chunks_checked == 5);  // qkv and proj from each rank, norm once
  // A save into the same root writes format 2 beside it; both tags load.
  const auto errors = test::on_ranks(2, [&](ckpt::in_process comm, std::uint32_t rank) {
    tp_cp cp{{.tp = 2, .comm = comm}, dir.path()};
    v1_state s(2, rank);
    (void)cp.load(s);
    cp.save(78, s);
    v1_state again(2, rank);
    (void)cp.load(again, {.tag = "global_step77"});
    (void)cp.load(again);
    if (again.qkv != s.qkv || again.step != 77) throw std::runtime_error("round trip differs");
  });
  for (const auto& e : errors) CHECK(e == "");
  CHECK(ckpt::reader{ckpt::posix(dir.path())}.info().format_version == 2);
}
#endif
