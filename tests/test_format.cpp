// The pieces of the format on their own: chunk geometry, overlap copies, the tiling check, the
// bounded index parser, and where a shard file puts its chunks.

#include "helpers.hpp"

#include <ckpt/detail/chunk_layout.hpp>
#include <ckpt/detail/commit.hpp>
#include <ckpt/detail/coverage.hpp>
#include <ckpt/detail/format.hpp>
#include <ckpt/detail/metadata.hpp>
#include <ckpt/detail/region.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

using namespace ckpt::detail;

namespace {
/// Row-major index of `idx` in `shape`.
std::uint64_t flat(const ckpt::shape_t& idx, const ckpt::shape_t& shape) {
  std::uint64_t f = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}
}  // namespace

TEST_CASE("chunks are contiguous, cover the tensor once, and respect the target size") {
  const std::vector<ckpt::shape_t> shapes = {{1000}, {7, 13}, {3, 4, 5}, {2, 1, 9}, {1}, {}, {0, 4}, {5, 0}, {64, 64}};
  for (const auto& shape : shapes) {
    for (std::uint64_t target : {1u, 4u, 17u, 64u, 100u, 4096u}) {
      CAPTURE(to_string(shape));
      CAPTURE(target);
      const auto chunks = split_into_chunks(shape, 4, target);
      std::uint64_t total = 4;
      for (auto e : shape) total *= e;
      std::uint64_t next = 0;
      for (const auto& c : chunks) {
        CHECK(c.byte_offset == next);  // in order, contiguous, no gaps
        std::uint64_t n = 4;
        for (auto e : c.shape) n *= e;
        CHECK(c.bytes == n);
        if (!shape.empty() && total) CHECK(c.byte_offset == flat(c.offset, shape) * 4);
        next += c.bytes;
      }
      CHECK(next == total);
      if (total > target && !shape.empty()) {
        std::uint64_t row = 4;  // a chunk never holds less than one element
        for (const auto& c : chunks) CHECK((c.bytes <= target || c.bytes == row || c.shape.back() == shape.back()));
      }
    }
  }
}

TEST_CASE("overlap runs copy exactly the intersection of two slices") {
  // A 6x7x5 global tensor; copy between assorted slices and compare with element-wise truth.
  const ckpt::shape_t global = {6, 7, 5};
  struct slice {
    ckpt::shape_t off, shape;
  };
  const std::vector<slice> slices = {{{0, 0, 0}, {6, 7, 5}}, {{1, 2, 0}, {3, 4, 5}}, {{0, 3, 1}, {6, 2, 3}},
                                     {{5, 6, 4}, {1, 1, 1}}, {{2, 0, 0}, {2, 7, 5}}, {{0, 0, 2}, {6, 7, 3}}};
  for (const auto& src : slices)
    for (const auto& dst : slices) {
      std::vector<std::int32_t> s(flat(src.shape, src.shape) ? 0 : 0);
      std::uint64_t ns = 1, nd = 1;
      for (auto e : src.shape) ns *= e;
      for (auto e : dst.shape) nd *= e;
      s.resize(ns);
      // value = global flat index of the element
      for (std::uint64_t i = 0; i < ns; ++i) {
        ckpt::shape_t idx(3);
        auto r = i;
        for (std::size_t d = 3; d > 0; --d) {
          idx[d - 1] = src.off[d - 1] + r % src.shape[d - 1];
          r /= src.shape[d - 1];
        }
        s[i] = static_cast<std::int32_t>(flat(idx, global));
      }
      std::vector<std::int32_t> t(nd, -1);
      const auto copied = for_each_overlap_run(region{src.off, src.shape}, region{dst.off, dst.shape}, 4,
                                               [&](std::uint64_t to, std::uint64_t from, std::uint64_t n) {
                                                 std::memcpy(reinterpret_cast<std::byte*>(t.data()) + to,
                                                             reinterpret_cast<const std::byte*>(s.data()) + from, n);
                                               });
      std::uint64_t expect = 0;
      for (std::uint64_t i = 0; i < nd; ++i) {
        ckpt::shape_t idx(3);
        auto r = i;
        bool inside = true;
        for (std::size_t d = 3; d > 0; --d) {
          idx[d - 1] = dst.off[d - 1] + r % dst.shape[d - 1];
          r /= dst.shape[d - 1];
          inside = inside && idx[d - 1] >= src.off[d - 1] && idx[d - 1] < src.off[d - 1] + src.shape[d - 1];
        }
        if (inside) {
          ++expect;
          REQUIRE(t[i] == static_cast<std::int32_t>(flat(idx, global)));
        } else {
          REQUIRE(t[i] == -1);
        }
      }
      CHECK(copied == expect * 4);
    }
}

TEST_CASE("the tiling check finds gaps and overlaps and names the region") {
  const ckpt::shape_t global = {8, 6};
  auto check = [&](std::vector<std::pair<ckpt::shape_t, ckpt::shape_t>> parts) {
    chunk_table chunks;
    chunks.ndim = 2;
    for (const auto& [o, s] : parts) chunks.push(0, o, s, 0, 0, 0, 0);
    const std::string file = "f";
    check_tiling("w", global, chunks, [&](std::size_t) -> const std::string& { return file; },
                 ckpt::error_kind::invalid_argument, "");
  };
  CHECK_NOTHROW(check({{{0, 0}, {4, 6}}, {{4, 0}, {4, 6}}}));
  CHECK_NOTHROW(check({{{0, 0}, {8, 2}}, {{0, 2}, {3, 4}}, {{3, 2}, {5, 4}}}));
  try {
    check({{{0, 0}, {4, 6}}, {{5, 0}, {3, 6}}});
    FAIL("gap not found");
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()) == "tensor 'w': region [4:5, 0:6] of global shape [8, 6] is not stored by any shard");
  }
  try {
    check({{{0, 0}, {5, 6}}, {{4, 0}, {4, 6}}});
    FAIL("overlap not found");
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()).find("region [4:5, 0:6] is stored twice") != std::string::npos);
  }
  try {
    check({{{0, 0}, {4, 6}}, {{4, 0}, {3, 6}}});
    FAIL("gap at the end not found");
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()) == "tensor 'w': region [7:8, 0:6] of global shape [8, 6] is not stored by any shard");
  }
  try {  // a two-dimensional layout goes through the grid
    check({{{0, 0}, {8, 2}}, {{0, 2}, {3, 4}}});
    FAIL("grid gap not found");
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()) == "tensor 'w': region [3:8, 2:6] of global shape [8, 6] is not stored by any shard");
  }
  try {
    check({{{0, 0}, {8, 2}}, {{0, 2}, {5, 4}}, {{4, 2}, {4, 4}}});
    FAIL("grid overlap not found");
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()).find("region [4:5, 2:6] is stored twice") != std::string::npos);
  }
  try {
    check({{{0, 0}, {8, 7}}});
    FAIL("out of bounds not found");
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()).find("outside the global shape") != std::string::npos);
  }
}

TEST_CASE("the footer index round-trips and rejects hostile counts without allocating them") {
  shard_index idx;
  idx.rank = 3;
  auto& g = idx.tensors.emplace_back();
  g.name = "a.b";
  g.type = ckpt::dtype::bf16;
  g.global_shape = {4, 4};
  g.chunks.ndim = 2;
  g.chunks.push(0, ckpt::shape_t{0, 0}, ckpt::shape_t{2, 4}, 0, 4096, 16, 0x1234);
  g.chunks.push(0, ckpt::shape_t{2, 0}, ckpt::shape_t{2, 4}, 0, 8192, 16, 0x5678);
  idx.values.push_back({"rng", 2, 12288, 10, 0x99});
  const auto bytes = encode_index(idx);
  const auto back = decode_index(std::as_bytes(std::span(bytes.data(), bytes.size())), "f");
  CHECK(back.rank == 3);
  REQUIRE(back.tensors.size() == 1);
  CHECK(back.tensors[0].name == "a.b");
  CHECK(back.tensors[0].type == ckpt::dtype::bf16);
  REQUIRE(back.tensors[0].chunks.size() == 2);
  CHECK(std::ranges::equal(back.tensors[0].chunks.offset(1), ckpt::shape_t{2, 0}));
  CHECK(std::ranges::equal(back.tensors[0].chunks.shape(1), ckpt::shape_t{2, 4}));
  CHECK(back.tensors[0].chunks.xxh3[1] == 0x5678);
  CHECK(back.values[0].file_offset == 12288);
  CHECK(back.values[0].rank == 2);

  // Layout: 1 endianness byte, u32 version, u32 rank, u64 tensor count, then the first name's
  // u64 length; after name, dtype and shape, the u64 chunk count.
  auto hostile = bytes;
  const std::uint64_t huge = std::uint64_t{1} << 60;
  std::memcpy(hostile.data() + 9, &huge, 8);
  auto e = test::catch_error([&] { decode_index(std::as_bytes(std::span(hostile.data(), hostile.size())), "f"); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find("tensor count") != std::string::npos);
  hostile = bytes;
  std::memcpy(hostile.data() + 17, &huge, 8);  // the first name's length
  e = test::catch_error([&] { decode_index(std::as_bytes(std::span(hostile.data(), hostile.size())), "f"); });
  CHECK(std::string(e.what()).find("string length") != std::string::npos);
  hostile = bytes;
  std::memcpy(hostile.data() + 17 + 8 + 3 + 1 + 8 + 16, &huge, 8);  // the chunk count
  e = test::catch_error([&] { decode_index(std::as_bytes(std::span(hostile.data(), hostile.size())), "f"); });
  CHECK(std::string(e.what()).find("chunk count") != std::string::npos);
  hostile = bytes;
  hostile[0] = 0;  // big-endian flag
  CHECK_THROWS_AS(decode_index(std::as_bytes(std::span(hostile.data(), hostile.size())), "f"), ckpt::error);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    CAPTURE(cut);
    CHECK_THROWS_AS(decode_index(std::as_bytes(std::span(bytes.data(), cut)), "f"), ckpt::error);
  }
  auto longer = bytes + "x";
  CHECK_THROWS_AS(decode_index(std::as_bytes(std::span(longer.data(), longer.size())), "f"), ckpt::error);
}

TEST_CASE("a chunk table keeps its columns through growth, copies and moves, inside itself or on the heap") {
  // A model of the table: one vector per column. Random pushes, appends (of itself too),
  // shrinks, copies and moves must leave the table holding exactly what the model holds, from
  // one chunk of a small tensor (inside the table) to thousands (on the heap).
  struct model {
    std::vector<std::uint32_t> file;
    std::vector<std::uint64_t> coords, file_offset, stored_size, xxh3;
    std::vector<std::uint8_t> codec;
  };
  const auto same = [](const chunk_table& t, const model& m) {
    REQUIRE(t.size() == m.codec.size());
    REQUIRE(t.coords.size() == m.coords.size());
    CHECK(std::equal(t.file.begin(), t.file.end(), m.file.begin()));
    CHECK(std::equal(t.coords.begin(), t.coords.end(), m.coords.begin()));
    CHECK(std::equal(t.codec.begin(), t.codec.end(), m.codec.begin()));
    CHECK(std::equal(t.file_offset.begin(), t.file_offset.end(), m.file_offset.begin()));
    CHECK(std::equal(t.stored_size.begin(), t.stored_size.end(), m.stored_size.begin()));
    CHECK(std::equal(t.xxh3.begin(), t.xxh3.end(), m.xxh3.begin()));
  };
  std::mt19937_64 rng(7);
  for (std::uint32_t nd = 0; nd <= 4; ++nd) {
    chunk_table t;
    t.ndim = nd;
    model m;
    for (int step = 0; step < 400; ++step) {
      const auto op = rng() % 10;
      if (op < 6) {  // push one chunk
        std::vector<std::uint64_t> off(nd), shp(nd);
        for (auto& x : off) x = rng();
        for (auto& x : shp) x = rng();
        const auto f = static_cast<std::uint32_t>(rng());
        const std::uint64_t at = rng(), size = rng(), hash = rng();
        const auto c = static_cast<std::uint8_t>(rng());
        t.push(f, off, shp, c, at, size, hash);
        m.file.push_back(f);
        m.coords.insert(m.coords.end(), off.begin(), off.end());
        m.coords.insert(m.coords.end(), shp.begin(), shp.end());
        m.codec.push_back(c);
        m.file_offset.push_back(at);
        m.stored_size.push_back(size);
        m.xxh3.push_back(hash);
      } else if (op == 6 && t.size() < 2000) {  // append itself, in file 3
        t.append(t, 3);
        const auto n = m.codec.size();
        m.file.insert(m.file.end(), n, 3);
        for (auto* v : {&m.coords, &m.file_offset, &m.stored_size, &m.xxh3}) v->insert(v->end(), v->begin(), v->end());
        m.codec.insert(m.codec.end(), m.codec.begin(), m.codec.end());
      } else if (op == 7) {  // shrink
        const auto n = t.size() ? rng() % t.size() : 0;
        t.resize(n);
        m.file.resize(n), m.coords.resize(n * 2 * nd), m.codec.resize(n), m.file_offset.resize(n), m.stored_size.resize(n),
            m.xxh3.resize(n);
      } else if (op == 8) {  // a copy, then a move back and forth, each holding the same
        chunk_table copy = t;
        same(copy, m);
        CHECK(copy.coords == t.coords);
        chunk_table moved = std::move(copy);
        same(moved, m);
        CHECK(copy.size() == 0);
        t = std::move(moved);
        t = static_cast<const chunk_table&>(t);  // self-assignment keeps it
      } else {
        t.clear();
        m = {};
      }
      same(t, m);
    }
  }
  // A region table the same way: its pieces inside it while they fit, its copies equal.
  region_table r;
  r.ndim = 2;
  const std::uint64_t a[2] = {1, 2}, b[2] = {3, 4};
  r.push(5, a, b);
  region_table s = r;
  CHECK(s.coords == r.coords);
  r.append(r, 6);
  CHECK(r.size() == 2);
  CHECK(r.file[1] == 6);
  CHECK(std::vector<std::uint64_t>(r.coords.begin(), r.coords.end()) == std::vector<std::uint64_t>{1, 2, 3, 4, 1, 2, 3, 4});
  CHECK(s.coords != r.coords);
  s = std::move(r);
  CHECK(s.size() == 2);
  CHECK(r.size() == 0);
}

TEST_CASE("a small vector holds its first values inside itself and the rest on the heap, through copies and moves") {
  std::mt19937_64 rng(11);
  small_vector<file_run, 1> v;
  std::vector<file_run> m;
  const auto same = [&](const small_vector<file_run, 1>& a) {
    REQUIRE(a.size() == m.size());
    CHECK(std::equal(a.begin(), a.end(), m.begin()));
  };
  for (int step = 0; step < 2000; ++step) {
    switch (rng() % 6) {
      case 0:
      case 1: {
        const file_run r{rng(), static_cast<std::uint32_t>(rng()), static_cast<std::uint32_t>(rng())};
        v.push_back(r), m.push_back(r);
        break;
      }
      case 2: {
        const auto n = rng() % 4;
        v.resize(n), m.resize(n);
        break;
      }
      case 3: {
        auto copy = v;
        same(copy);
        CHECK(copy == v);
        auto moved = std::move(copy);
        same(moved);
        CHECK(copy.empty());
        v = std::move(moved);
        break;
      }
      case 4: {
        const auto n = rng() % 3;
        v.assign(n, file_run{n, 1, 2}), m.assign(n, file_run{n, 1, 2});
        break;
      }
      default:
        v = {{1, 2, 3}}, m = {{1, 2, 3}};
    }
    same(v);
  }
}

TEST_CASE("chunk columns are packed to the bytes their largest value needs, and read back exactly") {
  shard_index idx;
  auto& g = idx.tensors.emplace_back();
  g.name = "w";
  g.type = ckpt::dtype::f32;
  g.global_shape = {std::uint64_t{1} << 40, 300, 1};
  g.chunks.ndim = 3;
  // Offsets needing 0, 2 and 5 bytes; extents needing 1, 2 and 1; file offsets beyond 4 GiB;
  // every 8-byte xxh3 kept whole.
  for (std::uint64_t i = 0; i < 5; ++i)
    g.chunks.push(0, ckpt::shape_t{i << 35, 299 - i, 0}, ckpt::shape_t{1, 1, 1}, 0,
                  (std::uint64_t{5} << 32) + 4096 * i, 4, 0xfedcba9876543210u + i);
  const auto widths = table_widths::of(g.chunks);
  CHECK(std::ranges::equal(std::span<const std::uint8_t>(widths), std::vector<std::uint8_t>{0, 5, 2, 0, 1, 1, 1, 0, 5, 1}));
  CHECK(table_bytes(g.chunks) == 8 + 10 + 5 * (16 + 8));
  const auto bytes = encode_index(idx);
  const auto back = decode_index(std::as_bytes(std::span(bytes.data(), bytes.size())), "f");
  const auto& c = back.tensors.at(0).chunks;
  REQUIRE(c.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(std::ranges::equal(c.offset(i), g.chunks.offset(i)));
    CHECK(std::ranges::equal(c.shape(i), g.chunks.shape(i)));
    CHECK(c.file_offset[i] == g.chunks.file_offset[i]);
    CHECK(c.stored_size[i] == 4);
    CHECK(c.xxh3[i] == g.chunks.xxh3[i]);
    CHECK(c.file[i] == 0);
    CHECK(c.codec[i] == 0);
  }

  // A width the in-memory column cannot hold, or wider than 8 bytes, is corrupt and named.
  // Layout: flag, version, rank, tensor count, name "w" (8 + 1), dtype, shape (8 + 3 × 8), then
  // the chunk count and the widths (file first, codec at 2 × 3 + 1).
  const std::size_t widths_at = 1 + 4 + 4 + 8 + 9 + 1 + 32 + 8;
  auto expect = [&](std::size_t column, char width, const char* words) {
    auto bad = bytes;
    bad[widths_at + column] = width;
    const auto e = test::catch_error([&] { decode_index(std::as_bytes(std::span(bad.data(), bad.size())), "f"); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find(words) != std::string::npos);
  };
  expect(0, 5, "column file is 5 bytes wide, at most 4");
  expect(7, 2, "column codec is 2 bytes wide, at most 1");
  expect(1, 9, "column offset is 9 bytes wide, at most 8");
  expect(8, 100, "column file_offset is 100 bytes wide");

  // Columns of zeros take no bytes, but every chunk still costs memory: a table of 1000 chunks
  // in 8000 bytes (only checksums) is refused before 1000 rows are allocated.
  shard_index zeros;
  auto& z = zeros.tensors.emplace_back();
  z.name = "z";
  z.global_shape = {4, 4};
  z.chunks.ndim = 2;
  for (int i = 0; i < 1000; ++i) z.chunks.push(0, ckpt::shape_t{0, 0}, ckpt::shape_t{0, 0}, 0, 0, 0, 7);
  const auto zb = encode_index(zeros);
  const auto e = test::catch_error([&] { decode_index(std::as_bytes(std::span(zb.data(), zb.size())), "f"); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find("chunk count 1000 with columns 8 bytes wide") != std::string::npos);
}

TEST_CASE("an empty tensor, one zero-byte chunk from each of two ranks, commits as a list of two chunks") {
  // Format 1 had to refuse it: its chunk map's packed columns took 11 bytes a chunk, under the
  // 8 + ndim a reader charges. Format 2 lists a layout that is not a grid unpacked (4 + 16 ndim
  // bytes a chunk), and each file's footer holds one chunk.
  auto report = [](std::uint32_t r) {
    written_shard w;
    w.path = "mp_rank_0" + std::to_string(r) + "/model_optim_rng.ckpt";
    w.index.rank = r;
    auto& g = w.index.tensors.emplace_back();
    g.name = "empty";
    g.global_shape = ckpt::shape_t(8, 0);
    g.chunks.ndim = 8;
    g.chunks.push(0, ckpt::shape_t(8, 0), ckpt::shape_t(8, 0), 0, 4096, 0, 0);
    w.size = 8192;
    const auto s = encode_report(w, {});
    const auto* b = reinterpret_cast<const std::byte*>(s.data());
    return std::vector<std::byte>(b, b + s.size());
  };
  const std::vector<std::vector<std::byte>> two = {report(0), report(1)};
  const auto md = merge_reports("global_step1", 1, {2, 1, 1, 2}, {}, two, 1);
  REQUIRE(md.tensors.size() == 1);
  CHECK(md.tensors[0].placement->how == chunk_layout::kind::list);
  CHECK(md.tensors[0].chunk_count == 2);
  // Its chunk map reads back, the layout checked.
  auto back = md;
  const auto map = encode_chunk_map(back);
  back.chunk_map.size = map.size();
  back.chunk_map.xxh3 = xxh3(map);
  for (auto& t : back.tensors) t.placement.reset();
  back.files = md.files;
  decode_chunk_map(std::as_bytes(std::span(map.data(), map.size())), back, "chunk_map.bin");
  CHECK(back.tensors[0].placement->chunks().size() == 2);
  const std::vector<std::vector<std::byte>> one = {report(0)};
  CHECK(merge_reports("global_step1", 1, {1, 1, 1, 1}, {}, one, 1).tensors.at(0).chunk_count == 1);
}

TEST_CASE("the worked example of docs/format.md section 12 is what ckpt writes") {
  struct model {
    std::vector<float> w = {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f};
    std::vector<std::int32_t> b = {7, -8, 9};
    std::uint64_t step = 200;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("fc.weight", ckpt::view(w, {2, 3}));
      v.group("optimizer", [&](ckpt::visitor& g) { g.tensor("bias_m", b); });
      v.value("step", step);
    }
  } m;
  auto hex = [](const std::vector<std::byte>& b) {
    std::string s;
    for (const auto x : b) {
      static constexpr char digits[] = "0123456789abcdef";
      s += digits[std::to_integer<unsigned>(x) >> 4];
      s += digits[std::to_integer<unsigned>(x) & 15];
    }
    return s;
  };
  for (const std::uint64_t chunk_bytes : {std::uint64_t{4} << 20, std::uint64_t{12}}) {
    ckpt::memory_storage mem;
    ckpt::checkpointer cp{ckpt::single_process{}, mem, ckpt::checkpointer_options{.chunk_bytes = chunk_bytes}};
    cp.save(200, m, {.config = {{"hidden_size", 3}, {"lr", 3e-4}, {"precision", "fp32"}}});
    const auto map = hex(mem.bytes("global_step200/chunk_map.bin"));
    if (chunk_bytes == 12) {  // fc.weight in two chunks of one row: a grid of one cell and two pieces
      CHECK(map.substr(50, 226) ==
            "01"                                  // grid
            "0200000000000000" "0300000000000000"  // its cell's shape: the whole of [2, 3]
            "0200000000000000"                    // two pieces: offsets and shapes
            "0000000000000000" "0000000000000000" "0100000000000000" "0300000000000000"
            "0100000000000000" "0000000000000000" "0100000000000000" "0300000000000000"
            "0100000000000000" "0100000000000000" "00000000" "00000000");  // one run: 1 cell, file 0
      continue;
    }
    CHECK(map ==
          "434b5054434d4150" "02000000" "00000000"  // magic, version 2, flags
          "01" "0200000000000000"                     // byte order, two tensors
          "01" "0200000000000000" "0300000000000000"  // fc.weight: a grid whose cell is [2, 3]
          "0100000000000000" "0000000000000000" "0000000000000000" "0200000000000000" "0300000000000000"
          "0100000000000000" "0100000000000000" "00000000" "00000000"  // one run: 1 cell, file 0
          "01" "0300000000000000"                     // optimizer.bias_m: a grid whose cell is [3]
          "0100000000000000" "0000000000000000" "0300000000000000"
          "0100000000000000" "0100000000000000" "00000000" "00000000");
    const auto& file = mem.bytes("global_step200/mp_rank_00/model_optim_rng.ckpt");
    CHECK(file.size() == 8444);  // version 1 padded fc.weight to 4 KiB: 12540
    // Byte for byte what docs/format.md section 12 shows.
    const auto& md = mem.bytes("global_step200/metadata.json");
    CHECK(md.size() == 1068);
    CHECK(to_hex(xxh3(std::span<const std::byte>(md))) == "5e7a6e966c9c7828");
  }
}

namespace {
/// Tensors of bytes of the given sizes, and a value: a shard file's chunk area in miniature.
struct sized_tensors {
  std::vector<std::vector<std::uint8_t>> t;
  std::uint64_t step = 7;
  void checkpoint(ckpt::visitor& v) {
    for (std::size_t i = 0; i < t.size(); ++i) v.tensor("t" + std::to_string(i), t[i]);
    v.value("step", step);
  }
};

/// The whole of a file.
std::vector<std::byte> whole_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}
}  // namespace

TEST_CASE("chunk_start places a raw chunk of 1 MiB or more as far into a block as its bytes lie into their page") {
  const std::uint64_t kib = 1024, mib = kib * kib;
  // Packed, and aligned, whatever the memory.
  CHECK(chunk_start(5000, 100, 64) == 5000);
  CHECK(chunk_start(5000, 64 * kib, 64) == 8192);
  CHECK(chunk_start(5000, mib - 1, 64) == 8192);
  // Placed: the first offset from `end` on that is `in_page` bytes into a block.
  CHECK(chunk_start(4096, mib, 64) == 4096 + 64);
  CHECK(chunk_start(4096 + 64, mib, 64) == 4096 + 64);  // right after a chunk that ended there
  CHECK(chunk_start(4096 + 65, mib, 64) == 8192 + 64);
  CHECK(chunk_start(8191, 4 * mib, 16) == 8192 + 16);
  CHECK(chunk_start(8192 + 16, 4 * mib, 4095) == 8192 + 4095);
  // Page-aligned memory (or none: in_page 0): on a block boundary, as before.
  CHECK(chunk_start(4097, mib, 0) == 8192);
  CHECK(chunk_start(8192, mib, 4096) == 8192);
}

TEST_CASE("a version-2 shard file packs chunks under 64 KiB and starts larger ones on 4 KiB boundaries") {
  // Small chunks before, between and after large ones, around the threshold, and an empty one.
  const std::vector<std::size_t> sizes = {5, 12, 65535, 65536, 3, 0, 100000, 1, 40000, 70000, 4096, 7};
  sized_tensors saved, loaded;
  std::mt19937_64 g(3);
  for (const auto n : sizes) {
    auto& v = saved.t.emplace_back(n);
    for (auto& x : v) x = static_cast<std::uint8_t>(g());
    loaded.t.emplace_back(n, std::uint8_t{0});
  }
  test::temp_dir dir;
  ckpt::checkpointer cp{ckpt::single_process{}, ckpt::posix{dir.path()}};
  cp.save(1, saved);
  const auto file = dir.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt";
  const auto bytes = whole_file(file);
  REQUIRE(bytes.size() > header_bytes + trailer_bytes);
  CHECK(check_header(std::span<const std::byte, header_used>(bytes.data(), header_used), "f") == 2);
  const auto t = check_trailer(std::span<const std::byte, trailer_bytes>(bytes.data() + bytes.size() - trailer_bytes, trailer_bytes),
                               bytes.size(), "f");
  CHECK(get_u32(bytes.data() + bytes.size() - 16) == 2);
  const auto idx = decode_index(std::span(bytes).subspan(t.index_offset, t.index_size), "f");
  REQUIRE(idx.tensors.size() == sizes.size());
  // In file order, every chunk where the rule puts it, from 4096 on.
  std::uint64_t end = header_bytes;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto& c = idx.tensors[i].chunks;
    REQUIRE(c.size() == 1);
    CAPTURE(sizes[i]);
    CHECK(c.stored_size[0] == sizes[i]);
    CHECK(c.file_offset[0] == (sizes[i] >= packed_below ? align_up(end) : end));
    end = c.file_offset[0] + c.stored_size[0];
  }
  REQUIRE(idx.values.size() == 1);
  CHECK(idx.values[0].file_offset == align_up(end));  // the chunk area ends on a block boundary
  // 88 blocks of chunks, where version 1, padding every chunk, took 91.
  CHECK(align_up(end) == header_bytes + 88 * alignment);

  // Loaded back, from the disk where O_DIRECT is taken (the packed chunks are read as runs).
  if (test::o_direct_testable(dir)) CHECK(test::drop_from_cache(file));
  cp.load(loaded);
  for (std::size_t i = 0; i < sizes.size(); ++i) CHECK(loaded.t[i] == saved.t[i]);
  CHECK(loaded.step == 7);
}

TEST_CASE("a shard file of an unknown version, or whose header and trailer disagree, is corrupt") {
  sized_tensors m;
  m.t = {std::vector<std::uint8_t>(100, 1)};
  ckpt::memory_storage mem;
  ckpt::checkpointer cp{ckpt::single_process{}, mem};
  cp.save(1, m);
  auto& file = mem.bytes("global_step1/mp_rank_00/model_optim_rng.ckpt");
  const auto good = file, good_json = mem.bytes("global_step1/metadata.json"), good_map = mem.bytes("global_step1/chunk_map.bin");
  SUBCASE("version 3 in the header") {
    put_u32(file.data() + 8, 3);
    put_u64(file.data() + 16, xxh3(std::span<const std::byte>(file.data(), 16)));
    const auto e = test::catch_error([&] { cp.load(m); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(test::mentions(e.what(), "model_optim_rng.ckpt has format version 3, this ckpt reads versions 1 to 2"));
  }
  SUBCASE("version 1 in the trailer of a version-2 file") {
    put_u32(file.data() + file.size() - 16, 1);
    const auto e = test::catch_error([&] { cp.load(m); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(test::mentions(e.what(), "its header says format version 2, its trailer 1"));
  }
  SUBCASE("version 1 in the footer index of a version-2 file, both its checksums made to match") {
    auto md = test::read_metadata(mem, "global_step1");
    const auto at = get_u64(file.data() + file.size() - 40), size = get_u64(file.data() + file.size() - 32);
    put_u32(file.data() + at + 1, 1);  // after the endianness byte
    const auto hash = xxh3(std::span<const std::byte>(file).subspan(at, size));
    put_u64(file.data() + file.size() - 24, hash);
    md.files[0].index_xxh3 = hash;
    test::write_metadata(mem, md, "global_step1");
    const auto e = test::catch_error([&] { cp.load(m); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(test::mentions(e.what(), "model_optim_rng.ckpt: its header says format version 2, its footer index 1"));
  }
  SUBCASE("version 0 in a footer index, parsed") {
    const auto at = get_u64(file.data() + file.size() - 40), size = get_u64(file.data() + file.size() - 32);
    std::vector<std::byte> b(file.begin() + static_cast<std::ptrdiff_t>(at), file.begin() + static_cast<std::ptrdiff_t>(at + size));
    put_u32(b.data() + 1, 0);
    CHECK(test::mentions(test::catch_error([&] { (void)decode_index(b, "f"); }).what(),
                         "format version 0, this ckpt reads versions 1 to 2"));
  }
  file = good;
  mem.bytes("global_step1/metadata.json") = good_json;
  mem.bytes("global_step1/chunk_map.bin") = good_map;
  cp.load(m);
  CHECK(m.t[0] == std::vector<std::uint8_t>(100, 1));
}

namespace {
/// A metadata.json envelope around `doc`, with its checksum right, so only the JSON is wrong.
std::string envelope(const std::string& doc) {
  return std::string(envelope_head) + to_hex(xxh3(doc)) + std::string(envelope_mid) + doc + std::string(envelope_tail);
}
}  // namespace

namespace {
/// A tag's metadata with a config entry, one file and one value, and no tensors yet.
metadata one_file_metadata(std::uint64_t iteration) {
  metadata md;
  md.tag = "global_step" + std::to_string(iteration);
  md.iteration = iteration;
  md.config.set("lr", "0.1");
  md.files.push_back({"mp_rank_00/model_optim_rng.ckpt", 0, 8192, 0x0123456789abcdefu});
  md.values.push_back({"step", 0, 0, 4096, 9, 42});
  return md;
}
}  // namespace

TEST_CASE("metadata.json written in parts around tensor records encoded ahead is the file as it was") {
  // A save encodes the tensors' records while its bytes are written, and the commit writes the
  // rest around them (tag_store::commit). The texts below are what encode_metadata wrote before
  // the file was written in parts (f655a94): the parts must give them byte for byte.
  auto md = one_file_metadata(7);
  const auto parts = [](const metadata& m) {
    const auto records = encode_tensor_records(m);
    const auto around = encode_metadata_around(m, records);
    return around.head + records + around.tail;
  };
  // What f655a94 wrote for `md` with checksum `hash` and the tensors' array `tensors`.
  const auto written = [](std::string_view hash, std::string_view tensors) {
    return R"({"xxh3_64": ")" + std::string(hash) + R"(", "metadata": {
    "ckpt": {
        "format_version": 2,
        "tag": "global_step7",
        "iteration": 7,
        "topology": {
            "tp": 1,
            "pp": 1,
            "dp": 1,
            "world": 1
        },
        "config": {
            "lr": "0.1"
        },
        "files": [
            {
                "path": "mp_rank_00/model_optim_rng.ckpt",
                "rank": 0,
                "size": 8192,
                "index_xxh3": "0123456789abcdef"
            }
        ],
        "tensors": )" + std::string(tensors) + R"(,
        "values": [
            {"name":"step","rank":0,"file":0,"file_offset":4096,"size":9,"xxh3":"000000000000002a"}
        ],
        "chunk_map": {
            "path": "chunk_map.bin",
            "size": 0,
            "xxh3": "0000000000000000"
        }
    }
}}
)";
  };
  SUBCASE("no tensors") {
    CHECK(encode_tensor_records(md) == "[]");
    const auto before = written("262e7778232a5da5", "[]");
    CHECK(parts(md) == before);
    CHECK(encode_metadata(md) == before);
  }
  SUBCASE("tensors of both layouts") {
    for (int i = 0; i < 3; ++i) {
      tensor_meta t;
      t.name = "layers." + std::to_string(i) + ".w\"quoted\"";
      t.type = ckpt::dtype::bf16;
      t.shape = {4, 5 + static_cast<std::uint64_t>(i)};
      if (i == 1) t.order = ckpt::layout::column_major;
      md.tensors.push_back(t);
    }
    const auto before = written("27353557344dc142", R"([
            {"name":"layers.0.w\"quoted\"","dtype":"bf16","shape":[4,5],"chunks":0},
            {"name":"layers.1.w\"quoted\"","dtype":"bf16","shape":[4,6],"chunks":0,"layout":"column_major"},
            {"name":"layers.2.w\"quoted\"","dtype":"bf16","shape":[4,7],"chunks":0}
        ])");
    CHECK(parts(md) == before);
    CHECK(encode_metadata(md) == before);
    const auto back = decode_metadata(parts(md), "m.json");  // its checksum covers all three parts
    CHECK(back.tensors.size() == 3);
    CHECK(back.tensors.at(1).order == ckpt::layout::column_major);
    CHECK(back.tensors.at(2).name == "layers.2.w\"quoted\"");
  }
  SUBCASE("records of other tensors give another checksum") {
    tensor_meta t;
    t.name = "w";
    md.tensors.push_back(t);
    auto other = md;
    other.tensors[0].name = "v";
    const auto around = encode_metadata_around(md, encode_tensor_records(other));
    CHECK(around.head != encode_metadata_around(md, encode_tensor_records(md)).head);
  }
}

TEST_CASE("metadata.json is read by member name, and a wrong member is corrupt, naming it") {
  auto md = one_file_metadata(3);
  tensor_meta t;
  t.name = "w";
  t.type = ckpt::dtype::bf16;
  t.shape = {4, 5};
  t.order = ckpt::layout::column_major;
  md.tensors.push_back(t);
  const auto text = encode_metadata(md);
  const auto back = decode_metadata(text, "m.json");
  CHECK(encode_metadata(back) == text);
  CHECK(back.tensors.at(0).order == ckpt::layout::column_major);
  CHECK(back.tensors.at(0).shape == ckpt::shape_t{4, 5});
  CHECK(*back.config.find("lr") == "0.1");
  CHECK(back.files.at(0).index_xxh3 == 0x0123456789abcdefu);

  const std::string doc(text.substr(envelope_head.size() + 16 + envelope_mid.size(),
                                    text.size() - envelope_head.size() - 16 - envelope_mid.size() - envelope_tail.size()));
  const auto replaced = [](std::string d, const std::string& from, const std::string& to) {
    const auto at = d.find(from);
    REQUIRE(at != std::string::npos);
    return d.replace(at, from.size(), to);
  };
  const auto edited = [&](const std::string& from, const std::string& to) { return envelope(replaced(doc, from, to)); };
  const auto corrupt_with = [&](const std::string& bad, const std::string& words) {
    CAPTURE(words);
    const auto e = test::catch_error([&] { (void)decode_metadata(bad, "m.json"); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(std::string(e.what()).starts_with("m.json: "));
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find(words) != std::string::npos);
  };
  // Members in another order, and members ckpt does not know, read as before.
  const auto moved = replaced(replaced(doc, "\"name\":\"w\",", "\"future\": [1, {}],"), "\"chunks\":0",
                              "\"chunks\": 0, \"name\": \"w\"");
  CHECK(decode_metadata(envelope(moved), "m.json").tensors.at(0).name == "w");
  // The layout too, which ckpt writes right after "chunks" (older readers look only there).
  const auto layout_first = replaced(replaced(doc, ",\"layout\":\"column_major\"", ""), "\"name\":\"w\",",
                                     "\"layout\": \"column_major\", \"name\": \"w\",");
  CHECK(decode_metadata(envelope(layout_first), "m.json").tensors.at(0).order == ckpt::layout::column_major);

  corrupt_with(edited("\"iteration\": 3", "\"iteration\": -3"), "\"iteration\" that is not an unsigned 64-bit integer");
  corrupt_with(edited("\"rank\": 0,\n                \"size\"", "\"rank\": 4294967296,\n                \"size\""),
               "file #0 has a \"rank\" that is not an unsigned 32-bit integer");
  corrupt_with(edited("\"dtype\":\"bf16\"", "\"dtype\": 16"), "tensor #0 ('w') has a \"dtype\" that is not a string");
  corrupt_with(edited("\"dtype\":\"bf16\"", "\"dtype\": \"bf17\""), "unknown dtype 'bf17' of tensor 'w'");
  corrupt_with(edited("\"chunks\":0", "\"chunk\": 0"), "tensor #0 ('w') has no \"chunks\"");
  corrupt_with(edited("\"layout\":\"column_major\"", "\"layout\": \"diagonal\""), "unknown layout 'diagonal' of tensor 'w'");
  corrupt_with(edited("\"lr\": \"0.1\"", "\"lr\": 0.1"), "the config has a value of 'lr' that is not a string");
  corrupt_with(edited("\"tensors\": [", "\"tensors\": {\"x\": ["), "malformed JSON");
  corrupt_with(edited("\"values\": [", "\"values\": 7, \"v\": ["), "\"ckpt\" has a \"values\" that is not an array");
  corrupt_with(edited("\"xxh3\":\"000000000000002a\"", "\"xxh3\": \"00000000000000zz\""), "bad checksum text of value 'step'");
  corrupt_with(envelope("[1, 2]"), "the document is not a JSON object");
  corrupt_with(envelope("{\"ckpt\": {}}"), "\"ckpt\" has no \"format_version\"");
  corrupt_with(envelope("{\"ckpt\": 1}"), "\"ckpt\" is not a JSON object");
  // A number rapidjson starts and cannot finish (its assertion throws): found by tools/fuzz.sh.
  corrupt_with(envelope("NaNE5"), "malformed JSON");
  corrupt_with(edited("\"shape\":[4,5]", "\"shape\":[4,NaNE5]"), "malformed JSON");
}

TEST_CASE("the tensors' records, read as the parser meets them, are checked as the DOM checked them") {
  // decode_metadata reads the "tensors" array of the "ckpt" object without building its DOM
  // (metadata_json::tensor_records); what it accepts and how it words what it refuses are the
  // DOM's, record by record.
  auto md = one_file_metadata(3);
  for (const char* name : {"w", "u"}) {
    tensor_meta t;
    t.name = name;
    t.type = ckpt::dtype::bf16;
    t.shape = {4, 5};
    md.tensors.push_back(t);
  }
  const auto text = encode_metadata(md);
  const auto back = decode_metadata(text, "m.json");
  REQUIRE(back.tensors.size() == 2);
  CHECK(back.tensors[1].name == "u");
  CHECK(encode_metadata(back) == text);

  const std::string doc(text.substr(envelope_head.size() + 16 + envelope_mid.size(),
                                    text.size() - envelope_head.size() - 16 - envelope_mid.size() - envelope_tail.size()));
  const std::string w = R"({"name":"w","dtype":"bf16","shape":[4,5],"chunks":0})";
  const std::string u = R"({"name":"u","dtype":"bf16","shape":[4,5],"chunks":0})";
  REQUIRE(doc.find(w) != std::string::npos);
  REQUIRE(doc.find(u) != std::string::npos);
  const auto replaced = [&](std::string d, const std::string& from, const std::string& to) {
    const auto at = d.find(from);
    REQUIRE(at != std::string::npos);
    return d.replace(at, from.size(), to);
  };
  // `record` in place of the first record (w), or `first` and `second` in place of both.
  const auto with = [&](const std::string& record) { return envelope(replaced(doc, w, record)); };
  const auto with_two = [&](const std::string& first, const std::string& second) {
    return envelope(replaced(replaced(doc, w, first), u, second));
  };
  const auto corrupt_with = [&](const std::string& bad, const std::string& words) {
    CAPTURE(words);
    const auto e = test::catch_error([&] { (void)decode_metadata(bad, "m.json"); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    const std::string what = e.what();
    INFO(what);
    CHECK(what == "m.json: " + words);
  };

  // Accepted: the first of two members of one name, members ckpt does not know (whatever they
  // hold), "-0" (an integer that is not negative), and a "tensors" member of another object.
  auto m = decode_metadata(with(R"({"name":"w","name":"v","x":{"name":"y","shape":[[1]]},"dtype":"bf16",)"
                                R"("shape":[4,-0],"chunks":7,"chunks":"8"})"),
                           "m.json");
  CHECK(m.tensors.at(0).name == "w");
  CHECK(m.tensors.at(0).shape == ckpt::shape_t{4, 0});
  CHECK(m.tensors.at(0).chunk_count == 7);
  m = decode_metadata(envelope(replaced(doc, "\"world\": 1", "\"world\": 1, \"tensors\": [{\"name\": 3}]")), "m.json");
  CHECK(m.tensors.size() == 2);
  m = decode_metadata(envelope(replaced(doc, "\"values\": [", "\"tensors\": [7], \"values\": [")), "m.json");
  CHECK(m.tensors.size() == 2);  // find_member takes the first "tensors"
  CHECK(decode_metadata(with(R"({"chunks":0,"shape":[],"dtype":"f32","name":"s"})"), "m.json").tensors.at(0).shape.empty());

  // Refused, in the DOM's words.
  corrupt_with(with("7"), "tensor #0 is not a JSON object");
  corrupt_with(with("[{}]"), "tensor #0 is not a JSON object");
  corrupt_with(with(R"({"dtype":"bf16","shape":[4,5],"chunks":0})"), "tensor #0 has no \"name\"");
  corrupt_with(with(R"({"name":["w"],"dtype":"bf16","shape":[4,5],"chunks":0})"), "tensor #0 has a \"name\" that is not a string");
  corrupt_with(with(R"({"name":"w","dtype":{},"shape":[4,5],"chunks":0})"), "tensor #0 ('w') has a \"dtype\" that is not a string");
  corrupt_with(with(R"({"name":"w","dtype":"bf16","shape":4,"chunks":0})"), "tensor #0 ('w') has a \"shape\" that is not an array");
  corrupt_with(with(R"({"name":"w","dtype":"bf16","chunks":0})"), "tensor #0 ('w') has no \"shape\"");
  for (const std::string entry : {"-5", "[5]", "5.0"})
    corrupt_with(with(R"({"name":"w","dtype":"bf16","shape":[4,)" + entry + R"(],"chunks":0})"),
                 "tensor #0 ('w') has a shape entry that is not an unsigned 64-bit integer");
  std::string wide = "[1";
  for (int d = 1; d < 65; ++d) wide += ",1";
  corrupt_with(with(R"({"name":"w","dtype":"bf16","shape":)" + wide + R"(],"chunks":0})"), "tensor #0 ('w') has 65 dimensions");
  for (const std::string chunks : {"1.5", "-1", "18446744073709551616"})
    corrupt_with(with(R"({"name":"w","dtype":"bf16","shape":[4,5],"chunks":)" + chunks + "}"),
                 "tensor #0 ('w') has a \"chunks\" that is not an unsigned 64-bit integer");
  corrupt_with(with(R"({"name":"w","dtype":"bf16","shape":[4,5],"chunks":0,"layout":3})"),
               "unknown layout '' of tensor 'w' (expected \"row_major\" or \"column_major\")");
  corrupt_with(with(R"({"name":"w\u0001","dtype":"b16","shape":[4,5],"chunks":0})"), "unknown dtype 'b16' of tensor 'w\\x01'");
  // The first record found wrong is the one reported; the document's own faults come first:
  // a text that is not JSON, then the members checked before the tensors.
  corrupt_with(with_two(R"({"name":"w","dtype":"b16","shape":[4,5],"chunks":0})", "{}"), "unknown dtype 'b16' of tensor 'w'");
  corrupt_with(with_two(w, R"({"name":"u","dtype":"bf16","shape":[4,5]})"), "tensor #1 ('u') has no \"chunks\"");
  const auto bad_record = replaced(doc, w, "{}");
  corrupt_with(envelope(replaced(bad_record, "\"values\": [", "\"values\": [,")),
               "malformed JSON: invalid value at byte " + std::to_string(replaced(bad_record, "\"values\": [", "\"values\": [,").find("[,") + 1) +
                   " of the document");
  corrupt_with(envelope(replaced(bad_record, "\"iteration\": 3", "\"iteration\": \"3\"")),
               "\"ckpt\" has a \"iteration\" that is not an unsigned 64-bit integer");
  corrupt_with(envelope(replaced(doc, "\"tensors\": [", "\"tensor\": [")), "\"ckpt\" has no \"tensors\"");
  corrupt_with(envelope(replaced(doc, "\"tensors\": [", "\"tensors\": 1, \"t\": [")), "\"ckpt\" has a \"tensors\" that is not an array");
}

TEST_CASE("the checksum is XXH3-64 exactly, whichever vector unit computes it") {
  // detail::xxh3 may run libxxhash's AVX2/AVX-512 dispatch (hash.hpp); the format defines the
  // checksum as XXH3-64, which the library's baseline XXH3_64bits computes by definition.
  std::vector<std::byte> data((std::size_t{1} << 20) + 7);
  std::uint64_t x = 0x9e3779b97f4a7c15;
  for (auto& b : data) b = static_cast<std::byte>((x = x * 6364136223846793005 + 1442695040888963407) >> 56);
  std::vector<std::size_t> sizes;
  for (std::size_t n = 0; n <= 600; ++n) sizes.push_back(n);
  for (std::size_t n : {1023, 1024, 1025, 4096, 65536 + 3, 262144, 1 << 20}) sizes.push_back(n);
  sizes.push_back(data.size());
  for (const auto n : sizes) {
    CAPTURE(n);
    const std::span<const std::byte> in(data.data(), n);
    const auto want = XXH3_64bits(in.data(), in.size());
    CHECK(xxh3(in) == want);
    xxh3_stream h;  // in uneven pieces
    for (std::size_t at = 0, piece = 1; at < n; at += piece, piece = piece * 3 + 1) h.update(in.subspan(at, std::min(piece, n - at)));
    CHECK(h.digest() == want);
  }
  CHECK(xxh3(std::string_view("")) == 0x2d06800538d394c2);  // XXH3-64 of nothing (xxHash's test vector)
}

TEST_CASE("latest holds a tag and its checksum, and a tag outside the root is rejected") {
  const auto text = encode_latest("global_step7");
  CHECK(decode_latest(text, "latest") == "global_step7");
  const auto evil = std::string("../../etc\n") + to_hex(xxh3(std::string_view("../../etc"))) + "\n";
  const auto e = test::catch_error([&] { decode_latest(evil, "latest"); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find("invalid tag") != std::string::npos);
  CHECK_THROWS_AS(decode_latest("global_step7\n", "latest"), ckpt::error);
  CHECK_THROWS_AS(decode_latest(text + "\n", "latest"), ckpt::error);
}
