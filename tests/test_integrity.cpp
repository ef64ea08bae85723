// Every byte ckpt reads is checked: flipped bytes, truncation and appended garbage in any file
// give a `corrupt` error naming the file, or (for bytes that carry nothing, like padding) a
// load that returns exactly the saved data. Never a crash, never silently wrong data.

#include "helpers.hpp"

#include <ckpt/detail/metadata.hpp>
#include <ckpt/detail/page_copy.hpp>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <new>
#include <random>
#include <sstream>

using test::catch_error;
using test::every_dtype_state;

namespace {
const std::string shard = "global_step5/mp_rank_00/model_optim_rng.ckpt";
const std::string metadata = "global_step5/metadata.json";
const std::string chunk_map = "global_step5/chunk_map.bin";

struct fixture {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem, {.chunk_bytes = 512}};
  every_dtype_state saved, other;  // what was saved, and what a load starts from
  fixture() {
    saved.randomise(5);
    other.randomise(99);
    cp.save(5, saved);
  }
  /// Loads into a fresh state: "ok" with equal data, or the error (which must be `corrupt`).
  std::optional<ckpt::error> load_outcome(bool& equal) {
    every_dtype_state x = other;  // a copy: campaigns load thousands of times
    try {
      cp.load(x);
    } catch (const ckpt::error& e) {
      return e;
    }
    equal = x == saved;
    return std::nullopt;
  }
};

struct tally {
  int detected = 0, harmless = 0;
};

/// Applies `mutate` to `file` at each position, loads, restores the file.
template <class F>
tally campaign(fixture& f, const std::string& file, const std::vector<std::size_t>& positions, F&& mutate) {
  tally t;
  const auto original = f.mem.bytes(file);
  for (std::size_t pos : positions) {
    CAPTURE(file);
    CAPTURE(pos);
    auto& b = f.mem.bytes(file);
    mutate(b, pos);
    bool equal = false;
    const auto e = f.load_outcome(equal);
    if (e) {
      CHECK(e->kind() == ckpt::error_kind::corrupt);
      CHECK(std::string(e->what()).find(file.substr(0, file.find('/'))) != std::string::npos);
      // The message names the file that was damaged (or, for latest, the latest file).
      CHECK(std::string(e->what()).find(file.substr(file.rfind('/') + 1)) != std::string::npos);
      ++t.detected;
    } else {
      CHECK_MESSAGE(equal, "a mutation was accepted and changed the loaded data");
      ++t.harmless;
    }
    f.mem.bytes(file) = original;
  }
  return t;
}

std::vector<std::size_t> all_positions(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}
}  // namespace

TEST_CASE("a flipped bit anywhere in the shard file is caught or harmless") {
  fixture f;
  // Every byte that carries data (header, chunks, values, index, trailer), and a sample of the
  // zero padding between chunks, which carries nothing.
  const auto md = test::read_metadata(f.mem, "global_step5");
  const auto size = f.mem.bytes(shard).size();
  std::vector<bool> meaningful(size, false);
  for (std::size_t i = 0; i < 24; ++i) meaningful[i] = true;
  std::uint64_t end_of_chunks = 4096;
  for (const auto& t : md.tensors)
    for (std::size_t k = 0; k < t.chunks.size(); ++k) {
      const auto at = t.chunks.file_offset[k], n = t.chunks.stored_size[k];
      for (auto i = at; i < at + n; ++i) meaningful[i] = true;
      end_of_chunks = std::max(end_of_chunks, ckpt::detail::align_up(at + n));
    }
  for (auto i = end_of_chunks; i < size; ++i) meaningful[i] = true;
  std::vector<std::size_t> positions, padding;
  for (std::size_t i = 0; i < size; ++i) (meaningful[i] ? positions : padding).push_back(i);
  for (std::size_t i = 0; i < padding.size(); i += 97) positions.push_back(padding[i]);
  const auto t = campaign(f, shard, positions, [](std::vector<std::byte>& b, std::size_t pos) { b[pos] ^= std::byte{0x10}; });
  MESSAGE("shard file of " << size << " bytes: " << t.detected << " flips detected, " << t.harmless
                           << " harmless (padding)");
  CHECK(t.detected > 0);
  CHECK(t.detected + t.harmless == static_cast<int>(positions.size()));
}

TEST_CASE("a flipped bit anywhere in metadata.json, chunk_map.bin or latest is caught") {
  fixture f;
  for (const std::string& file : {metadata, chunk_map, std::string("latest")}) {
    const auto size = f.mem.bytes(file).size();
    const auto t = campaign(f, file, all_positions(size), [](std::vector<std::byte>& b, std::size_t pos) { b[pos] ^= std::byte{0x01}; });
    CHECK(t.detected == static_cast<int>(size));
  }
}

TEST_CASE("truncation and appended garbage of every file are caught") {
  fixture f;
  for (const std::string& file : {shard, metadata, chunk_map, std::string("latest")}) {
    const auto size = f.mem.bytes(file).size();
    std::vector<std::size_t> cuts = {0, 1, size / 2, size - 1};
    if (file == shard) cuts.insert(cuts.end(), {4096, 4100, size - 40, size - 41});
    for (auto cut : cuts) {
      CAPTURE(file);
      CAPTURE(cut);
      const auto original = f.mem.bytes(file);
      f.mem.bytes(file).resize(cut);
      bool equal = false;
      const auto e = f.load_outcome(equal);
      REQUIRE(e);
      CHECK(e->kind() == ckpt::error_kind::corrupt);
      f.mem.bytes(file) = original;
    }
    for (std::size_t extra : {1u, 7u, 40u, 5000u}) {
      CAPTURE(file);
      CAPTURE(extra);
      const auto original = f.mem.bytes(file);
      f.mem.bytes(file).resize(original.size() + extra, std::byte{0x41});
      bool equal = false;
      const auto e = f.load_outcome(equal);
      REQUIRE(e);
      CHECK(e->kind() == ckpt::error_kind::corrupt);
      f.mem.bytes(file) = original;
    }
  }
}

TEST_CASE("a corrupt chunk names the file and the tensor") {
  fixture f;
  // Find the first chunk of 'cube' through the metadata and damage it.
  const auto md = test::read_metadata(f.mem, "global_step5");
  std::uint64_t at = 0;
  for (const auto& t : md.tensors)
    if (t.name == "cube") at = t.chunks.size() ? t.chunks.file_offset[0] : 0;
  REQUIRE(at >= 4096);
  f.mem.bytes(shard)[at + 3] ^= std::byte{0xff};
  every_dtype_state x;
  const auto e = catch_error([&] { f.cp.load(x); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find("memory:global_step5/mp_rank_00/model_optim_rng.ckpt, tensor 'cube'") != std::string::npos);
  CHECK(std::string(e.what()).find("checksum mismatch") != std::string::npos);
}

TEST_CASE("a metadata.json with a valid checksum but hostile contents is rejected before any allocation") {
  fixture f;
  const auto md0 = test::read_metadata(f.mem, "global_step5");
  const auto original_md = f.mem.bytes(metadata);
  const auto original_map = f.mem.bytes(chunk_map);
  auto rewrite = [&](auto&& change) {
    auto md = md0;
    change(md);
    test::write_metadata(f.mem, md, "global_step5");
    every_dtype_state x;
    const auto e = catch_error([&] { f.cp.load(x); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    f.mem.bytes(metadata) = original_md;
    f.mem.bytes(chunk_map) = original_map;
    return std::string(e.what());
  };
  auto find = [&](ckpt::detail::metadata& md, const std::string& n) -> ckpt::detail::tensor_meta& {
    for (auto& t : md.tensors)
      if (t.name == n) return t;
    throw std::runtime_error("no tensor " + n);
  };
  CHECK(rewrite([&](auto& md) { find(md, "f64").chunks.stored_size[0] = std::uint64_t{1} << 62; }).find("lies outside") !=
        std::string::npos);
  CHECK(rewrite([&](auto& md) {
          auto& t = find(md, "f64");
          t.shape = {std::uint64_t{1} << 40, std::uint64_t{1} << 40};
          t.chunks.ndim = 2;
          test::set_coords(t.chunks, {0, 0, 1, 37});
        }).find("overflows") != std::string::npos);
  CHECK(rewrite([&](auto& md) { find(md, "f64").chunks.file[0] = 7; }).find("file #7") != std::string::npos);
  CHECK(rewrite([&](auto& md) { md.files[0].path = "../../etc/passwd"; }).find("invalid storage key") != std::string::npos);
  CHECK(rewrite([&](auto& md) { md.chunk_map.path = "../latest"; }).find("invalid storage key") != std::string::npos);
  CHECK(rewrite([&](auto& md) { md.tag = "other"; }).find("records tag") != std::string::npos);
  CHECK(rewrite([&](auto& md) { find(md, "f64").name = "a/../b"; }).find("tensor name") != std::string::npos);
  CHECK(rewrite([&](auto& md) { md.format_version = 3; }).find("format version 3") != std::string::npos);
  CHECK(rewrite([&](auto& md) {
          auto& t = find(md, "layers.0.f32");
          t.chunks.append(t.chunks, 0);
        }).find("stored twice") != std::string::npos);
  CHECK(rewrite([&](auto& md) {
          auto& t = find(md, "layers.0.f32");
          t.chunks.resize(t.chunks.size() - 1);
        }).find("not stored by any shard") != std::string::npos);
  CHECK(rewrite([&](auto& md) { find(md, "f64").chunks.codec[0] = 77; }).find("unknown codec id 77") != std::string::npos);
  CHECK(rewrite([&](auto& md) { md.files[0].size += 1; }).find("recorded") != std::string::npos);
  CHECK(rewrite([&](auto& md) { md.values[0].rank = 5; }).find("in a world of 1") != std::string::npos);
  // A chunk map that disagrees with metadata.json on the number of chunks.
  {
    auto md = md0;
    find(md, "f64").chunks.resize(0);
    test::write_metadata(f.mem, md, "global_step5");
    auto md_json = md0;  // its JSON still says f64 has one chunk
    md_json.format_version = 1;  // as write_metadata wrote the map
    for (auto& t : md_json.tensors) t.placement.reset();
    md_json.chunk_map = test::read_metadata(f.mem, "global_step5").chunk_map;
    const auto s = ckpt::detail::encode_metadata(md_json);  // JSON still says the old counts
    f.mem.bytes(metadata).assign(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
    every_dtype_state x;
    const auto e = catch_error([&] { f.cp.load(x); });
    CHECK(std::string(e.what()).find("chunk_map.bin holds 0 chunks") != std::string::npos);
    f.mem.bytes(metadata) = original_md;
    f.mem.bytes(chunk_map) = original_map;
  }
  // Deeply nested JSON never reaches the recursive parser.
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const auto wrapped = std::string(ckpt::detail::envelope_head) + ckpt::detail::to_hex(ckpt::detail::xxh3(deep)) +
                       std::string(ckpt::detail::envelope_mid) + deep + std::string(ckpt::detail::envelope_tail);
  const auto e = catch_error([&] { ckpt::detail::decode_metadata(wrapped, "deep.json"); });
  CHECK(std::string(e.what()).find("nested too deeply") != std::string::npos);
}

TEST_CASE("metadata.json's pre-scan: brackets inside strings do not nest, whatever their escapes") {
  using ckpt::detail::check_json_depth;
  const std::string deep(ckpt::detail::max_json_depth + 1, '[');
  CHECK_NOTHROW(check_json_depth(std::string(ckpt::detail::max_json_depth, '['), "f"));
  // Inside a string (its quote escaped): not nesting.
  CHECK_NOTHROW(check_json_depth("{\"a\\\"" + deep + "\": 1}", "f"));
  CHECK_NOTHROW(check_json_depth("{\"a\\\\\\\"" + deep + "\": 1}", "f"));  // three backslashes: still escaped
  // After an escaped backslash the string has ended: the brackets nest.
  CHECK_THROWS_WITH_AS(check_json_depth("[\"a\\\\\", " + deep, "f"), doctest::Contains("f: JSON nested too deeply"), ckpt::error);
  // A number past a string with an escaped quote is still checked.
  CHECK_THROWS_WITH_AS(check_json_depth("[\"\\\"\", 1e0000]", "f"), doctest::Contains("f: number '1e0000' at byte 7 is longer than any ckpt writes"),
                       ckpt::error);
  // 20 MiB of backslashes (an even run: the string ends after it), then too deep.
  CHECK_THROWS_WITH_AS(check_json_depth("[\"" + std::string(std::size_t{20} << 20, '\\') + "\", " + deep, "f"),
                       doctest::Contains("nested too deeply"), ckpt::error);
  // An unterminated string ends the scan; the parser reports it.
  CHECK_NOTHROW(check_json_depth("[\"abc" + deep, "f"));
}

TEST_CASE("a damaged file on disk is caught through the posix storage too") {
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path()};
  every_dtype_state s;
  s.randomise(8);
  cp.save(5, s);
  const auto path = dir.path() / shard;
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 1);
    f.put('\x5a');
  }
  every_dtype_state x;
  auto e = catch_error([&] { cp.load(x); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find(path.string()) != std::string::npos);
  std::filesystem::resize_file(path, 5000);
  e = catch_error([&] { cp.load(x); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find("truncated or extended") != std::string::npos);
  std::filesystem::remove(path);
  e = catch_error([&] { cp.load(x); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find("missing") != std::string::npos);
}

TEST_CASE("chunks larger than one read piece are verified piece by piece through one open file") {
  // Loads read a chunk in 256 KiB pieces, hashing each as it arrives, through one posix reader.
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path()};
  struct big {
    std::vector<float> w = std::vector<float>(std::size_t{3} << 18);  // 3 MiB: one chunk, 12 pieces
    void checkpoint(ckpt::visitor& v) { v.tensor("w", w); }
  } s, x;
  for (std::size_t i = 0; i < s.w.size(); ++i) s.w[i] = static_cast<float>(i) * 0.25f;
  cp.save(1, s);
  cp.load(x);
  CHECK(x.w == s.w);
  const auto path = dir.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 5 * 256 * 1024 + 17);  // in the sixth piece
    f.put('\x5a');
  }
  const auto e = catch_error([&] { cp.load(x); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find(path.string()) != std::string::npos);
  CHECK(std::string(e.what()).find("tensor 'w': chunk checksum mismatch") != std::string::npos);

  // The reader itself: exact reads, a short file is corrupt, a missing one not_found.
  ckpt::posix disk(dir.path());
  const auto r = disk.open_reader("global_step1/mp_rank_00/model_optim_rng.ckpt");
  std::vector<std::byte> head(8);
  r.read(0, head);
  CHECK(std::memcmp(head.data(), "CKPTSHRD", 8) == 0);
  const auto size = std::filesystem::file_size(path);
  const auto short_read = catch_error([&] { r.read(size - 4, head); });
  CHECK(short_read.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(short_read.what()).find("is truncated") != std::string::npos);
  CHECK(catch_error([&] { (void)disk.open_reader("nope"); }).kind() == ckpt::error_kind::not_found);
  static_assert(ckpt::detail::opens_readers<ckpt::posix>);
}

namespace {
// Distances (modulo 4 KiB) of a buffer from its file position: inside the slow window that posix
// bounces (1-63 past) and outside it.
constexpr std::size_t distances[] = {0, 1, 8, 16, 31, 32, 48, 63, 64, 80, 2048, 4032, 4080, 4095};
}  // namespace

TEST_CASE("the slow page-copy window and the bounce buffer's placement") {
  using ckpt::detail::slow_page_copy;
  for (std::uint64_t source : {std::uint64_t{0}, std::uint64_t{4096}, std::uint64_t{100000} - 7, std::uint64_t{1} << 40}) {
    CAPTURE(source);
    CHECK_FALSE(slow_page_copy(source, source));
    CHECK(slow_page_copy(source + 1, source));
    CHECK(slow_page_copy(source + 16, source));
    CHECK(slow_page_copy(source + 63, source));
    CHECK_FALSE(slow_page_copy(source + 64, source));
    CHECK_FALSE(slow_page_copy(source + 2048, source));
    CHECK(slow_page_copy(source + 4096 + 16, source));  // modulo 4 KiB
    CHECK_FALSE(slow_page_copy(source - 16, source));   // behind the source is fine
    // The bounce buffer lies 2 KiB from the position modulo 4 KiB: far from the window in
    // both directions, for the kernel's copy and for the memcpy to or from the user's buffer.
    const ckpt::detail::bounce_buffer bounce(source);
    const auto at = reinterpret_cast<std::uintptr_t>(bounce.data());
    CHECK((at - source) % 4096 == 2048);
    for (std::size_t d : distances) CHECK_FALSE(slow_page_copy(source + d, at));
  }
}

TEST_CASE("whether copies in the window are slow here: CKPT_SLOW_COPY_WINDOW, else measured, and forced by tests") {
  using ckpt::detail::slow_copy_window_from_env;
  CHECK(slow_copy_window_from_env("1") == std::optional<bool>(true));
  CHECK(slow_copy_window_from_env("0") == std::optional<bool>(false));
  for (const char* other : {"", "yes", "10", " 1", "true"}) {
    CAPTURE(other);
    CHECK_FALSE(slow_copy_window_from_env(other).has_value());  // anything else: measure
  }
  CHECK_FALSE(slow_copy_window_from_env(nullptr).has_value());  // unset: measure
  // What the measurement says depends on the CPU; asked twice in a process, the answer is the same.
  const bool here = ckpt::detail::slow_copy_window_here();
  CHECK(ckpt::detail::slow_copy_window_here() == here);
  {
    const test::copy_window_forced forced(!here);
    CHECK(ckpt::detail::slow_copy_window_here() == !here);
    CHECK(ckpt::detail::avoid_copy(4096 + 16, 4096) == !here);
    CHECK_FALSE(ckpt::detail::avoid_copy(4096 + 2048, 4096));  // outside the window: never
  }
  CHECK(ckpt::detail::slow_copy_window_here() == here);  // and back after the test's scope
}

TEST_CASE("copy_avoiding_slow_copy copies exactly, in the slow window and out of it") {
  // In the window, where copies there are slow, it copies in 2 KiB pieces (page_copy.hpp says
  // why): every size around the piece boundaries, at every distance, must give exactly the
  // source's bytes and nothing more, on either kind of CPU.
  bool slow = true;
  SUBCASE("on a CPU whose copies in the window are slow") {}
  SUBCASE("on one whose are not") { slow = false; }
  const test::copy_window_forced forced(slow);
  test::page_block block(3 * 65536);
  std::byte* source = block.start;
  std::byte* space = block.start + 65536;
  std::mt19937 rng(17);
  test::fill_bytes(std::span<std::byte>(source, 65536), rng);
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{2047}, std::size_t{2048}, std::size_t{2049},
                           std::size_t{6000}, std::size_t{65536} - 64}) {
    for (std::size_t distance : distances) {
      CAPTURE(size);
      CAPTURE(distance);
      std::fill(space, space + 2 * 65536, std::byte{0xee});
      std::byte* destination = space + distance + 8;  // 8: room to see a stray byte before it
      ckpt::detail::copy_avoiding_slow_copy(destination, source + 8, size);
      CHECK(std::memcmp(destination, source + 8, size) == 0);
      CHECK(destination[-1] == std::byte{0xee});
      CHECK(destination[size] == std::byte{0xee});
    }
  }
}

TEST_CASE("posix reads into buffers at every alignment return exactly the file's bytes") {
  // Reads whose destination lies just past the file offset modulo 4 KiB go through a bounce
  // buffer (detail/page_copy.hpp says why), forced here whatever this CPU's answer;
  // reads of bytes not in the page cache go with O_DIRECT through an aligned buffer. Every
  // read must give the same bytes at any size, offset and placement.
  const test::copy_window_forced forced(true);
  test::temp_dir dir;
  std::vector<std::byte> content(std::size_t{600} * 1024 + 77);
  std::mt19937 rng(3);
  test::fill_bytes(content, rng);
  {
    std::ofstream f(dir.path() / "blob", std::ios::binary);
    f.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
  }
  bool direct = false;
  SUBCASE("through the page cache") {}
  SUBCASE("with O_DIRECT, from the disk") { direct = true; }
  CAPTURE(direct);
  if (direct && !test::drop_from_cache(dir.path() / "blob")) {
    MESSAGE("the kernel keeps " << dir.str() << "'s files in its page cache: no O_DIRECT reads to check");
    return;
  }
  ckpt::posix disk(dir.path(), {.direct_reads = direct});
  const auto r = disk.open_reader("blob");
  const std::size_t block_bytes = std::size_t{300} * 1024 + 8192;
  test::page_block block(block_bytes);
  const std::span<std::byte> out(block.start, block_bytes);
  for (std::size_t size : {std::size_t{100}, std::size_t{64} * 1024, std::size_t{64} * 1024 + 1, std::size_t{200} * 1024 + 13,
                           std::size_t{290} * 1024 + 5}) {
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4096}, std::uint64_t{100000} - 7}) {
      for (std::size_t distance : distances) {
        CAPTURE(size);
        CAPTURE(offset);
        CAPTURE(distance);
        const std::size_t at = (offset + distance) % 4096;  // the buffer's place in its page
        std::fill(out.begin(), out.end(), std::byte{0xee});
        const auto dst = out.subspan(at, size);
        // The placement is the one intended: in the bounced window exactly when meant to be.
        // (tests/test_page_copy_routing.cpp checks which buffer the kernel is then given.)
        REQUIRE(ckpt::detail::slow_page_copy(reinterpret_cast<std::uintptr_t>(dst.data()), offset) == (distance % 4096 != 0 && distance < 64));
        // With O_DIRECT, each read starts from a dropped cache (a small read through the cache
        // would bring the rest of the file in with it, by readahead), and reads of 64 KiB or more
        // leave nothing cached: they went to the disk, or came from the reader's own buffer.
        if (direct) test::drop_from_cache(dir.path() / "blob");
        r.read(offset, dst);
        if (direct && size >= 64 * 1024) CHECK(test::resident_pages(dir.path() / "blob") == 0);
        CHECK(std::equal(dst.begin(), dst.end(), content.begin() + static_cast<std::ptrdiff_t>(offset)));
        CHECK(out[at + size] == std::byte{0xee});  // not a byte past the end
        if (at > 0) CHECK(out[at - 1] == std::byte{0xee});  // nor before the start
      }
    }
  }
  // The last bytes of the file, which ends mid-block, with O_DIRECT as through the cache.
  const auto tail = std::span<std::byte>(block.start + 16, std::size_t{100} * 1024 + 77);
  r.read(content.size() - tail.size(), tail);
  CHECK(std::equal(tail.begin(), tail.end(), content.end() - static_cast<std::ptrdiff_t>(tail.size())));
  // A short file is still `corrupt` through the bounce buffer, naming the file and the range.
  const auto from = content.size() - 1000;
  const auto e = catch_error([&] { r.read(from, out.subspan((from + 16) % 4096, 70000)); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(test::mentions(e.what(), "blob is truncated: needed bytes [" + std::to_string(from) + ", " +
                                     std::to_string(from + 70000) + "), the file ends at " + std::to_string(content.size())));
  // And when the file shrinks under an open reader (whose view of its size is then stale), the
  // O_DIRECT read finds the end and reports it the same way.
  std::filesystem::resize_file(dir.path() / "blob", 400 * 1024);
  test::drop_from_cache(dir.path() / "blob");
  const auto e2 = catch_error([&] { r.read(300 * 1024, out.subspan(16, 200 * 1024)); });
  CHECK(e2.kind() == ckpt::error_kind::corrupt);
  CHECK(test::mentions(e2.what(), "blob is truncated: needed bytes [307200, 512000), the file ends at 409600"));
}

TEST_CASE("posix writes of every size reach the file in order, small ones gathered") {
  // Through the page cache, writes under 64 KiB are gathered in a buffer (posix.hpp says why);
  // with O_DIRECT, everything goes through the aligned buffer. Either way sync and publish must
  // write what is held, and big writes must not overtake it.
  bool direct = false;
  SUBCASE("through the page cache") {}
  SUBCASE("with O_DIRECT") { direct = true; }
  test::temp_dir dir;
  ckpt::posix disk(dir.path(), {.direct_writes = direct});
  std::vector<std::byte> want;
  std::mt19937 rng(9);
  {
    auto w = disk.create("out/blob");
    for (std::size_t size : {std::size_t{1}, std::size_t{4095}, std::size_t{65535}, std::size_t{65536}, std::size_t{3},
                             std::size_t{300000}, std::size_t{70000}, std::size_t{1}, std::size_t{60000}}) {
      for (int repeat = 0; repeat < 20; ++repeat) {  // 20 × 60000 overflows the 1 MiB buffer
        std::vector<std::byte> part(size);
        test::fill_bytes(part, rng);
        w.write(part);
        want.insert(want.end(), part.begin(), part.end());
      }
    }
    w.write(std::vector<std::byte>(10, std::byte{7}));  // gathered, then written by sync
    want.insert(want.end(), 10, std::byte{7});
    w.sync();
    std::uintmax_t synced = 0;  // the temporary file's size after sync
    for (const auto& e : std::filesystem::directory_iterator(dir.path() / "out"))
      if (e.path().filename().string().starts_with("blob.tmp.")) synced = e.file_size();
    CHECK(synced == want.size());
    w.write(std::vector<std::byte>(5, std::byte{9}));  // gathered, then written by publish
    want.insert(want.end(), 5, std::byte{9});
    w.publish();
  }
  const auto got = test::file_bytes(dir.path() / "out/blob");
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
}

TEST_CASE("posix writes from buffers at every placement reach the file exactly") {
  // Writes whose file position lies just past the buffer modulo 4 KiB go through a bounce
  // buffer (detail/page_copy.hpp says why; forced here whatever this CPU's answer, and
  // test_page_copy_routing.cpp checks both routes); the file must hold exactly what was
  // written, from any placement, mixed with gathered small writes that move the position off
  // 4 KiB. With O_DIRECT, the same writes are copied into the aligned buffer instead.
  const test::copy_window_forced forced(true);
  bool direct = false;
  SUBCASE("through the page cache") {}
  SUBCASE("with O_DIRECT") { direct = true; }
  test::temp_dir dir;
  ckpt::posix disk(dir.path(), {.direct_writes = direct});
  std::vector<std::byte> want;
  std::mt19937 rng(11);
  const std::size_t biggest = std::size_t{200} * 1024 + 13;
  test::page_block block(biggest + 8192);
  {
    auto w = disk.create("blob");
    for (std::size_t size : {std::size_t{64} * 1024, std::size_t{64} * 1024 + 1, biggest, std::size_t{5}}) {
      for (std::size_t distance : distances) {
        // The source starts `distance` bytes before the file position, modulo 4 KiB.
        const std::size_t at = (want.size() + 4096 - distance % 4096) % 4096;
        const std::span<std::byte> src(block.start + at, size);
        test::fill_bytes(src, rng);
        w.write(src);
        want.insert(want.end(), src.begin(), src.end());
        w.write(std::vector<std::byte>(7, std::byte{1}));  // gathered: the position moves by 7
        want.insert(want.end(), 7, std::byte{1});
      }
    }
    w.sync();
    w.publish();
  }
  const auto got = test::file_bytes(dir.path() / "blob");
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
}

TEST_CASE("posix O_DIRECT writes: files of every size around the block and buffer boundaries") {
  // posix_options::direct_writes writes whole 4 KiB blocks from aligned buffers of 1 MiB, several
  // in flight (or from the caller's buffer when that is aligned), and the last partial block
  // through the page cache. Every file size around those boundaries, written in one piece, in
  // uneven pieces and from aligned sources, one write at a time or many, must come out exactly.
  test::temp_dir dir;
  const bool supported = test::takes_o_direct(dir.path());
  if (!supported) MESSAGE("the file system under " << dir.str() << " refuses O_DIRECT: only the fallback is tested");
  unsigned depth = 32;  // the default
  SUBCASE("many writes in flight") {}
  SUBCASE("one at a time") { depth = 1; }
  CAPTURE(depth);
  ckpt::posix disk(dir.path(), {.writes_in_flight = depth});  // O_DIRECT is the default
  constexpr std::size_t block = 4096, buffer = std::size_t{1} << 20;
  std::mt19937 rng(21);
  test::page_block aligned(41 * buffer + 2 * block);
  int file = 0;
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, block - 1, block, block + 1, buffer - 1, buffer, buffer + 1,
                           buffer + block, 2 * buffer + 17, 40 * buffer + 5}) {  // the last: more buffers than in flight
    for (int how = 0; how < 3; ++how) {  // one write; uneven pieces; aligned sources, in place
      CAPTURE(size);
      CAPTURE(how);
      const std::span<std::byte> want(aligned.start, size);
      test::fill_bytes(want, rng);
      const auto key = "f" + std::to_string(file++);
      {
        auto w = disk.create(key);
        CHECK(w.writes_direct() == supported);
        if (how == 0) {
          w.write(want);
        } else if (how == 1) {
          for (std::size_t at = 0; at < size;) {
            const auto n = std::min<std::size_t>(size - at, 1 + rng() % (3 * block));
            w.write(want.subspan(at, n));
            at += n;
          }
        } else {
          // Whole aligned blocks first (written from in place), then an odd piece that puts the
          // rest through the buffer, then aligned blocks again (now copied: the buffer is not empty).
          const auto first = std::min(size, 2 * block);
          w.write(want.first(first));
          const auto odd = std::min<std::size_t>(size - first, 5);
          w.write(want.subspan(first, odd));
          w.write(want.subspan(first + odd));
        }
        w.sync();
        CHECK_FALSE(w.writes_direct());  // sync wrote the tail through the page cache
        w.publish();
      }
      const auto got = test::file_bytes(dir.path() / key);
      REQUIRE(got.size() == size);
      CHECK((size == 0 || std::memcmp(got.data(), want.data(), size) == 0));  // memcmp takes no null pointers
    }
  }
  // A writer destroyed unpublished discards its file, O_DIRECT or not.
  {
    auto w = disk.create("dropped");
    w.write(std::span<const std::byte>(aligned.start, buffer + 100));
  }
  CHECK_FALSE(disk.size("dropped"));
  CHECK(disk.list("").size() == static_cast<std::size_t>(file));
}

// The seeded mutation campaign (issue 5): random damage of every kind to every kind of file.
// CKPT_MUTATIONS sets the number of trials (2500 by default; more for a longer run) and
// CKPT_MUTATION_SEED the seed, so a failure can be replayed exactly.
TEST_CASE("seeded mutation campaign: bit flips, byte runs, truncation, extension and swapped blocks of every file") {
  fixture f;
  const int trials = std::getenv("CKPT_MUTATIONS") ? std::atoi(std::getenv("CKPT_MUTATIONS")) : 2500;
  const std::uint64_t seed = std::getenv("CKPT_MUTATION_SEED") ? std::strtoull(std::getenv("CKPT_MUTATION_SEED"), nullptr, 10) : 1;
  std::mt19937_64 rng(seed);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };

  // The regions of the shard file, so the small header and index are hit as often as the data.
  const auto md = test::read_metadata(f.mem, "global_step5");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> chunk_ranges;
  std::uint64_t end_of_chunks = 4096;
  for (const auto& t : md.tensors)
    for (std::size_t k = 0; k < t.chunks.size(); ++k) {
      if (t.chunks.stored_size[k] > 0) chunk_ranges.emplace_back(t.chunks.file_offset[k], t.chunks.stored_size[k]);
      end_of_chunks = std::max(end_of_chunks, ckpt::detail::align_up(t.chunks.file_offset[k] + t.chunks.stored_size[k]));
    }
  struct target {
    std::string label, file;
  };
  const std::vector<target> targets = {{"shard header", shard}, {"chunk data", shard},     {"values, index and trailer", shard},
                                       {"metadata.json", metadata}, {"chunk_map.bin", chunk_map}, {"latest", "latest"}};
  const char* kinds[] = {"bit flips", "byte run", "truncation", "extension", "swapped blocks"};
  struct counts {
    int tried = 0, detected = 0, harmless = 0, wrong = 0;
  };
  std::map<std::string, counts> by_target, by_kind;
  counts all;

  for (int trial = 0; trial < trials; ++trial) {
    const auto& tg = targets[pick(0, targets.size() - 1)];
    const int kind = static_cast<int>(pick(0, 4));
    const auto original = f.mem.bytes(tg.file);
    auto& b = f.mem.bytes(tg.file);
    const std::uint64_t size = b.size();
    // Where the damage starts: inside the target's region.
    std::uint64_t lo = 0, hi = size - 1;
    if (tg.label == "shard header") hi = 23;
    if (tg.label == "chunk data") {
      const auto& [at, n] = chunk_ranges[pick(0, chunk_ranges.size() - 1)];
      lo = at;
      hi = at + n - 1;
    }
    if (tg.label == "values, index and trailer") lo = end_of_chunks;
    const auto at = pick(lo, hi);
    switch (kind) {
      case 0:  // 1 to 8 bits flipped near each other
        for (auto k = pick(1, 8); k > 0; --k) {
          const auto p = std::min(size - 1, at + pick(0, 15));
          b[p] ^= std::byte(1u << pick(0, 7));
        }
        break;
      case 1: {  // a run of 1 to 64 bytes overwritten with one value
        const auto v = std::byte(pick(0, 255));
        for (auto p = at; p < std::min(size, at + pick(1, 64)); ++p) b[p] = v;
        break;
      }
      case 2:  // cut anywhere
        b.resize(at);
        break;
      case 3: {  // 1 to 4096 random bytes appended
        for (auto k = pick(1, 4096); k > 0; --k) b.push_back(std::byte(pick(0, 255)));
        break;
      }
      case 4: {  // two blocks of the same length swapped
        const auto n = pick(1, std::max<std::uint64_t>(1, std::min<std::uint64_t>(512, size / 2)));
        const auto a = std::min(at, size - n), c = pick(0, size - n);
        std::vector<std::byte> tmp(b.begin() + static_cast<std::ptrdiff_t>(a), b.begin() + static_cast<std::ptrdiff_t>(a + n));
        std::copy_n(b.begin() + static_cast<std::ptrdiff_t>(c), n, b.begin() + static_cast<std::ptrdiff_t>(a));
        std::copy(tmp.begin(), tmp.end(), b.begin() + static_cast<std::ptrdiff_t>(c));
        break;
      }
    }
    const bool changed = b != original;
    bool equal = false;
    const auto e = f.load_outcome(equal);
    auto& t = by_target[tg.label];
    auto& k = by_kind[kinds[kind]];
    ++t.tried, ++k.tried, ++all.tried;
    if (e) {
      CAPTURE(trial);
      CAPTURE(tg.label);
      CAPTURE(kinds[kind]);
      CAPTURE(e->what());
      CHECK((e->kind() == ckpt::error_kind::corrupt || e->kind() == ckpt::error_kind::invalid_argument));
      CHECK(std::string(e->what()).find(tg.file.substr(tg.file.rfind('/') + 1)) != std::string::npos);
      CHECK(changed);  // an undamaged checkpoint must load
      ++t.detected, ++k.detected, ++all.detected;
    } else if (equal) {
      ++t.harmless, ++k.harmless, ++all.harmless;
    } else {
      ++t.wrong, ++k.wrong, ++all.wrong;
      FAIL_CHECK("trial " << trial << " (seed " << seed << "): " << kinds[kind] << " in " << tg.label
                          << " was accepted and changed the loaded data");
    }
    f.mem.bytes(tg.file) = original;
  }
  std::ostringstream report;
  report << "mutation campaign, seed " << seed << ": " << all.tried << " tried, " << all.detected << " detected, "
         << all.harmless << " harmless (data identical: padding, or a swap of equal blocks), " << all.wrong << " silently wrong\n";
  for (const auto* m : {&by_target, &by_kind})
    for (const auto& [name, c] : *m)
      report << "  " << name << ": " << c.tried << " tried, " << c.detected << " detected, " << c.harmless << " harmless, "
             << c.wrong << " wrong\n";
  MESSAGE(report.str());
  CHECK(all.wrong == 0);
  CHECK(all.tried == trials);
}
