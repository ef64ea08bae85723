// Loads at another layout read little more than they need: a slice of a larger tensor is saved
// in blocks along the dimension it is split on (checkpointer_options::reshard_blocks), blocks of
// columns stored contiguously, so a rank that loads a slice starting and ending anywhere reads
// about a block beyond each end instead of whole chunks.

#include "helpers.hpp"
#include "on_ranks.hpp"

#include <ckpt/detail/metadata.hpp>
#include <ckpt/detail/region.hpp>
#include <ckpt/in_process.hpp>
#include <ckpt/reader.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

using ckpt::shape_t;
using ckpt::detail::chunk_slice;
using ckpt::detail::chunking;
using ckpt::detail::chunks_of;

namespace {

std::uint64_t numel(const shape_t& s) {
  std::uint64_t n = 1;
  for (auto e : s) n *= e;
  return n;
}

/// Checks that `chunks` tile a tensor of `shape` exactly once, that each chunk's byte fields
/// are right, and that a chunk marked contiguous is one byte range.
void check_tiling(const std::vector<chunk_slice>& chunks, const shape_t& shape, std::uint64_t elem) {
  std::vector<int> seen(numel(shape), 0);
  for (const auto& c : chunks) {
    REQUIRE(c.offset.size() == shape.size());
    CHECK(c.bytes == numel(c.shape) * elem);
    CHECK(c.contiguous == ckpt::detail::box_is_contiguous(c.shape, shape));
    // Every element of the chunk, by its row-major index in the tensor.
    std::uint64_t first = 0;
    bool in_order = true;
    shape_t idx(shape.size(), 0);
    for (std::uint64_t k = 0; k < numel(c.shape); ++k) {
      std::uint64_t flat = 0;
      for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + c.offset[d] + idx[d];
      if (k == 0) first = flat;
      in_order = in_order && flat == first + k;
      ++seen[flat];
      for (std::size_t d = shape.size(); d-- > 0;) {
        if (++idx[d] < c.shape[d]) break;
        idx[d] = 0;
      }
    }
    if (c.contiguous) CHECK(in_order);  // one byte range, in the tensor's order
    if (c.bytes) CHECK(c.byte_offset == first * elem);
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));  // each element once
}

/// Megatron's MLP per layer, one rank's slices: fc1 [4h, h] split by rows (column-parallel) and
/// fc2 [h, 4h] split by columns (row-parallel), fp32, each element made from its global position.
struct mlp {
  std::uint64_t h;
  std::uint32_t tp, rank;
  std::vector<float> fc1, fc2;

  mlp(std::uint64_t hidden, std::uint32_t t, std::uint32_t r, bool fill)
      : h(hidden), tp(t), rank(r), fc1(width() * h), fc2(h * width()) {
    if (!fill) return;
    for (std::uint64_t i = 0; i < width(); ++i)
      for (std::uint64_t j = 0; j < h; ++j) fc1[i * h + j] = value(1, lo() + i, j);
    for (std::uint64_t i = 0; i < h; ++i)
      for (std::uint64_t j = 0; j < width(); ++j) fc2[i * width() + j] = value(2, i, lo() + j);
  }
  static float value(int which, std::uint64_t i, std::uint64_t j) { return static_cast<float>(which * 1000003 + i * 7919 + j); }
  std::uint64_t lo() const { return 4 * h * rank / tp; }
  std::uint64_t width() const { return 4 * h * (rank + 1) / tp - lo(); }
  std::uint64_t bytes() const { return (fc1.size() + fc2.size()) * sizeof(float); }

  template <class V>
  void checkpoint(V& v) {
    v.tensor("fc1.weight", ckpt::view(fc1.data(), {width(), h}).sharded({.global_shape = {4 * h, h}, .offset = {lo(), 0}}));
    v.tensor("fc2.weight", ckpt::view(fc2.data(), {h, width()}).sharded({.global_shape = {h, 4 * h}, .offset = {0, lo()}}));
  }
  bool operator==(const mlp& o) const { return fc1 == o.fc1 && fc2 == o.fc2; }
};

using tp_checkpointer = ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix>;

/// Saves the MLP at tp 4 under `dir` with `opts`.
void save_at_tp4(const std::filesystem::path& dir, std::uint64_t hidden, const ckpt::checkpointer_options& opts) {
  const auto errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
    tp_checkpointer cp{{.tp = 4, .comm = comm}, dir, opts};
    cp.save(1, mlp(hidden, 4, r, true));
  });
  for (const auto& e : errors) REQUIRE(e == "");
}

/// Loads at tp x dp; checks every element and returns each rank's bytes read / bytes needed.
std::vector<double> load_at(const std::filesystem::path& dir, std::uint64_t hidden, std::uint32_t tp, std::uint32_t dp) {
  std::vector<double> ratio(tp * dp);
  const auto errors = test::on_ranks(tp * dp, [&](ckpt::in_process comm, std::uint32_t r) {
    tp_checkpointer cp{{.tp = tp, .dp = dp, .comm = comm}, dir};
    const auto t = cp.policy().coordinates().tp;
    mlp m(hidden, tp, t, false);
    const auto res = cp.load(m);
    if (!(m == mlp(hidden, tp, t, true))) throw std::runtime_error("loaded wrong values");
    ratio[r] = static_cast<double>(res.bytes_read) / static_cast<double>(m.bytes());
  });
  for (const auto& e : errors) REQUIRE(e == "");
  return ratio;
}

}  // namespace

TEST_CASE("chunks_of: blocks along the split dimension tile the slice, of at least 64 KiB") {
  struct example {
    shape_t shape, global;
    std::uint64_t elem, chunk_bytes = 1 << 20;
  };
  const std::vector<example> examples = {
      {{1024, 1024}, {4096, 1024}, 4},        // split by rows
      {{1024, 1024}, {1024, 4096}, 4},        // split by columns
      {{1024, 1024}, {2048, 2048}, 4},        // split both ways
      {{1, 512, 300}, {1, 2048, 300}, 2},     // a leading dimension of one
      {{7, 64, 333}, {7, 256, 333}, 4},       // split along a middle dimension
      {{300, 7}, {900, 7}, 4},                // too small for blocks (8 KiB)
      {{1000, 100}, {1000, 100}, 4},          // not split: only chunk_bytes applies
      {{512, 512}, {512, 2048}, 4, 16 << 10},  // blocks larger than chunk_bytes: cut again by rows
      {{0, 64}, {64, 64}, 4},                 // empty
  };
  for (const auto& ex : examples) {
    for (const bool boxes : {false, true}) {
      for (const std::uint32_t blocks : {1u, 4u, 16u}) {
        CAPTURE(ckpt::detail::to_string(ex.shape));
        CAPTURE(ckpt::detail::to_string(ex.global));
        CAPTURE(boxes);
        CAPTURE(blocks);
        const chunking how{.chunk_bytes = ex.chunk_bytes, .reshard_blocks = blocks, .boxes = boxes};
        const auto chunks = chunks_of(ex.shape, ex.global, ex.elem, how);
        check_tiling(chunks, ex.shape, ex.elem);
        for (const auto& c : chunks) {
          if (!boxes) CHECK(c.contiguous);
          CHECK(c.bytes <= std::max<std::uint64_t>(how.chunk_bytes, ex.elem * ex.shape.back()));
        }
        if (blocks == 1 || ex.shape == ex.global) {
          // As before blocks existed: split_into_chunks' chunks.
          const auto plain = ckpt::detail::split_into_chunks(ex.shape, ex.elem, how.chunk_bytes);
          REQUIRE(chunks.size() == plain.size());
          for (std::size_t i = 0; i < chunks.size(); ++i) CHECK(chunks[i].offset == plain[i].offset);
        }
      }
    }
  }
  // The two Megatron splits, at the default 16 blocks: 16 chunks of 64 rows or 64 columns.
  const chunking dflt{.chunk_bytes = 4 << 20, .reshard_blocks = 16, .boxes = true};
  const auto rows = chunks_of({1024, 1024}, {4096, 1024}, 4, dflt);
  REQUIRE(rows.size() == 16);
  CHECK(rows[1].offset == shape_t{64, 0});
  CHECK(rows[1].shape == shape_t{64, 1024});
  CHECK(rows[1].contiguous);
  const auto cols = chunks_of({1024, 1024}, {1024, 4096}, 4, dflt);
  REQUIRE(cols.size() == 16);
  CHECK(cols[1].offset == shape_t{0, 64});
  CHECK(cols[1].shape == shape_t{1024, 64});
  CHECK(!cols[1].contiguous);
  // Without boxes (a DevicePolicy with no host view), columns cannot be blocks: chunk_bytes only.
  CHECK(chunks_of({1024, 1024}, {1024, 4096}, 4, {.chunk_bytes = 4 << 20, .reshard_blocks = 16}).size() == 1);
  // Small slices get fewer blocks, none under 64 KiB: 256 KiB of rows makes 4.
  CHECK(chunks_of({256, 256}, {1024, 256}, 4, dflt).size() == 4);
}

TEST_CASE("gather_box copies a box of a tensor densely, in row-major order") {
  const shape_t shape{5, 6, 7};
  std::vector<std::int32_t> t(numel(shape));
  for (std::size_t k = 0; k < t.size(); ++k) t[k] = static_cast<std::int32_t>(k);
  chunk_slice box{.offset = {1, 2, 3}, .shape = {3, 2, 4}};
  std::vector<std::int32_t> out(numel(box.shape), -1);
  ckpt::detail::gather_box(reinterpret_cast<const std::byte*>(t.data()), shape, box, 4, reinterpret_cast<std::byte*>(out.data()));
  std::size_t k = 0;
  for (std::uint64_t i = 0; i < 3; ++i)
    for (std::uint64_t j = 0; j < 2; ++j)
      for (std::uint64_t l = 0; l < 4; ++l) CHECK(out[k++] == static_cast<std::int32_t>(((1 + i) * 6 + 2 + j) * 7 + 3 + l));
}

TEST_CASE("reshard: a load at tp 3 or tp 2 x dp 2 of a tp 4 save reads at most 1.1 times what it needs") {
  // fc1 and fc2 of hidden 512: 4 MiB each, slices of 1 MiB: 16 blocks of 64 KiB per slice.
  constexpr std::uint64_t hidden = 512;
  test::temp_dir dir;
  save_at_tp4(dir.path(), hidden, {});
  {
    ckpt::reader r{ckpt::posix(dir.path())};
    CHECK(r.chunks("fc1.weight").size() == 4 * 16);
    const auto fc2 = r.chunks("fc2.weight");
    REQUIRE(fc2.size() == 4 * 16);
    std::set<shape_t> shapes;
    for (const auto& c : fc2) shapes.insert(c.shape);
    CHECK(shapes == std::set<shape_t>{{hidden, 32}});  // blocks of 32 columns, stored contiguously
  }
  for (const auto r : load_at(dir.path(), hidden, 3, 1)) {
    CHECK(r >= 1.0);
    CHECK(r <= 1.1);
  }
  for (const auto r : load_at(dir.path(), hidden, 2, 2)) CHECK(r <= 1.01);
  for (const auto r : load_at(dir.path(), hidden, 4, 1)) CHECK(r <= 1.01);  // the saved layout: blocks of columns scattered back

  // Cut by chunk_bytes alone (blocks off), the same tp 3 load reads whole saved slices: 1.5 times.
  test::temp_dir plain;
  save_at_tp4(plain.path(), hidden, {.reshard_blocks = 1});
  CHECK(ckpt::reader{ckpt::posix(plain.path())}.chunks("fc2.weight").size() == 4);
  double worst = 0;
  for (const auto r : load_at(plain.path(), hidden, 3, 1)) worst = std::max(worst, r);
  CHECK(worst > 1.4);
}

TEST_CASE("reshard: blocks of a gather_to_root save stream to rank 0 as the chunks it writes") {
  // Streamed over the in_process Transport: rank 0 writes through a receiving device (no host
  // view), so its blocks are byte ranges (rows), and the ranks send exactly those.
  constexpr std::uint64_t hidden = 512;
  test::temp_dir dir;
  using gather_checkpointer = ckpt::checkpointer<ckpt::gather_to_root<ckpt::in_process>, ckpt::posix>;
  auto errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
    gather_checkpointer cp{{.comm = comm}, dir.path()};
    cp.save(1, mlp(hidden, 4, r, true));
  });
  for (const auto& e : errors) REQUIRE(e == "");
  ckpt::reader rd{ckpt::posix(dir.path())};
  CHECK(rd.chunks("fc1.weight").size() == 4 * 16);  // rows: blocks
  CHECK(rd.chunks("fc2.weight").size() == 4);       // columns: one chunk per slice, as before
  errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
    gather_checkpointer cp{{.comm = comm}, dir.path()};
    mlp m(hidden, 4, r, false);
    cp.load(m);
    if (!(m == mlp(hidden, 4, r, true))) throw std::runtime_error("loaded wrong values");
  });
  for (const auto& e : errors) CHECK(e == "");
  for (const auto r : load_at(dir.path(), hidden, 3, 1)) CHECK(r <= 1.6);  // loads at another layout as megatron
}

TEST_CASE("layouts: an even split is stored as a grid, an uneven one as a list, and both load at any tp") {
  constexpr std::uint64_t hidden = 64;
  auto save_at = [&](const std::filesystem::path& dir, std::uint32_t tp) {
    const auto errors = test::on_ranks(tp, [&](ckpt::in_process comm, std::uint32_t r) {
      tp_checkpointer cp{{.tp = tp, .comm = comm}, dir};
      cp.save(1, mlp(hidden, tp, r, true));
    });
    for (const auto& e : errors) REQUIRE(e == "");
  };
  auto placements = [](const std::filesystem::path& dir) {
    std::ifstream in(dir / "global_step1" / "metadata.json", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    auto md = ckpt::detail::decode_metadata(text, "metadata.json");
    std::ifstream m(dir / "global_step1" / "chunk_map.bin", std::ios::binary);
    const std::string map((std::istreambuf_iterator<char>(m)), {});
    ckpt::detail::decode_chunk_map(std::as_bytes(std::span(map.data(), map.size())), md, "chunk_map.bin");
    std::map<std::string, ckpt::detail::chunk_layout> out;
    for (const auto& t : md.tensors) out[t.name] = *t.placement;
    return out;
  };
  test::temp_dir even, uneven;
  save_at(even.path(), 4);  // 256 rows over 4: cells of 64
  save_at(uneven.path(), 3);  // 256 rows over 3: 85, 85, 86
  {
    const auto p = placements(even.path());
    const auto& fc1 = p.at("fc1.weight");
    CHECK(fc1.how == ckpt::detail::chunk_layout::kind::grid);
    CHECK(fc1.block == shape_t{64, hidden});
    CHECK(fc1.runs == decltype(fc1.runs){{4, 0, 1}});  // cells 0..3 in files 0..3
    CHECK(p.at("fc2.weight").block == shape_t{hidden, 64});
  }
  CHECK(placements(uneven.path()).at("fc1.weight").how == ckpt::detail::chunk_layout::kind::list);
  for (const auto tp : {2u, 3u, 4u}) {
    for (const auto r : load_at(even.path(), hidden, tp, 1)) CHECK(r >= 1.0);
    for (const auto r : load_at(uneven.path(), hidden, tp, 1)) CHECK(r >= 1.0);
  }
}

TEST_CASE("layouts: each rank reads the footers of its own files only, and a footer that disagrees is corrupt") {
  constexpr std::uint64_t hidden = 64;
  test::temp_dir dir;
  save_at_tp4(dir.path(), hidden, {});
  // Rank 3's file with a footer that no longer matches metadata.json: a load at tp 2 reads
  // files 0 and 1 (rank 0) and 2 and 3 (rank 1), so the error is rank 1's, naming file 3.
  const auto shard3 = dir.path() / "global_step1" / "mp_rank_03" / "model_optim_rng.ckpt";
  {
    std::fstream f(shard3, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-ckpt::detail::trailer_bytes - 3, std::ios::end);
    char c;
    f.read(&c, 1);
    f.seekp(-ckpt::detail::trailer_bytes - 3, std::ios::end);
    c = static_cast<char>(c ^ 0x20);
    f.write(&c, 1);
  }
  std::vector<std::string> errors = test::on_ranks(2, [&](ckpt::in_process comm, std::uint32_t r) {
    tp_checkpointer cp{{.tp = 2, .comm = comm}, dir.path()};
    mlp m(hidden, 2, r, false);
    (void)cp.load(m);
  });
  for (const auto& e : errors) {
    CHECK(test::mentions(e, "rank 1"));
    CHECK(test::mentions(e, "mp_rank_03/model_optim_rng.ckpt"));
    CHECK(test::mentions(e, "footer index checksum"));
  }
  // At tp 4, ranks 0 to 2 never open file 3: only rank 3 fails.
  errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
    tp_checkpointer cp{{.tp = 4, .comm = comm}, dir.path()};
    mlp m(hidden, 4, r, false);
    (void)cp.load(m);
  });
  for (const auto& e : errors) CHECK(test::mentions(e, "rank 3"));
}
