#pragma once
// Shared pieces of the unit tests: temporary directories, a state with every dtype, and
// storage factories so one test body runs against every Storage.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ckpt/ckpt.hpp>
// The suite makes checkpointers of its own (storages that fail or count, codecs, devices), and
// tools/dev.sh builds it with CKPT_SEPARATE_COMPILATION: every test file needs the members'
// definitions, not only those whose unity group happens to include a back end's header.
#include <ckpt/impl/checkpointer.ipp>
#include <ckpt/detail/chunk_details.hpp>
#include <ckpt/detail/page_copy.hpp>
#include <ckpt/detail/metadata.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <new>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace test {

/// Whether an error message (or any text) mentions `what`.
inline bool mentions(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

/// Makes `t` (a chunk or region table) hold the chunks whose offsets and shapes, `ndim` of each
/// per chunk, are `coords`: a table's columns are sized with the table, not one by one.
template <class Table>
void set_coords(Table& t, std::initializer_list<std::uint64_t> coords) {
  t.resize(t.ndim ? coords.size() / (2 * t.ndim) : 0);
  std::copy(coords.begin(), coords.end(), t.coords.begin());
}


/// A fresh directory under /tmp, removed with its contents at scope exit.
class temp_dir {
 public:
  temp_dir() {
    static std::atomic<int> n{0};
    path_ = std::filesystem::temp_directory_path() /
            ("ckpt-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

/// A page-aligned block, for placing buffers at chosen distances from a file position
/// (detail/page_copy.hpp's slow window).
struct page_block {
  explicit page_block(std::size_t bytes) : start(static_cast<std::byte*>(::operator new(bytes, std::align_val_t{4096}))) {}
  ~page_block() { ::operator delete(start, std::align_val_t{4096}); }
  page_block(const page_block&) = delete;
  page_block& operator=(const page_block&) = delete;
  std::byte* start;
};

/// Has ckpt::detail::slow_copy_window_here() answer `slow` until the end of the scope, so that
/// a test takes the bounced route (or the direct one) for copies in the slow window whatever
/// this machine's CPU would have it take.
struct copy_window_forced {
  explicit copy_window_forced(bool slow) { ckpt::detail::slow_copy_window_forced().store(slow ? 1 : 0); }
  ~copy_window_forced() { ckpt::detail::slow_copy_window_forced().store(-1); }
  copy_window_forced(const copy_window_forced&) = delete;
  copy_window_forced& operator=(const copy_window_forced&) = delete;
};

/// Whether the file system under `dir` takes O_DIRECT, asked without ckpt's code.
inline bool takes_o_direct(const std::filesystem::path& dir) {
  const auto probe = dir / "o_direct_probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
  std::filesystem::remove(probe);
  return fd >= 0;
}

/// takes_o_direct, saying so in the test's output when not (the O_DIRECT checks then have
/// nothing to look at).
inline bool o_direct_testable(const temp_dir& dir) {
  if (takes_o_direct(dir.path())) return true;
  MESSAGE("the file system under " << dir.str() << " refuses O_DIRECT: nothing to check here");
  return false;
}

/// How many of the file's pages are in the page cache (mincore on an untouched mapping).
inline std::size_t resident_pages(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st{};
  std::size_t count = 0;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    const auto bytes = static_cast<std::size_t>(st.st_size);
    void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
      std::vector<unsigned char> pages((bytes + page - 1) / page);
      if (::mincore(m, bytes, pages.data()) == 0)
        for (auto p : pages) count += p & 1;
      ::munmap(m, bytes);
    }
  }
  ::close(fd);
  return count;
}

/// Makes the file's bytes durable and drops them from the page cache (they are clean then), so
/// that the next read of them goes to the disk. Returns false where the kernel kept some.
inline bool drop_from_cache(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return resident_pages(file) == 0;
}

/// A memory_storage to wrap: a test's Storage derives from it and declares its own `read` (which
/// hides this one) to watch or change the reads; everything else goes to `inner`.
struct wrapped_memory_storage {
  ckpt::memory_storage inner;
  auto create(std::string_view key) { return inner.create(key); }
  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const { inner.read(key, offset, out); }
  std::optional<std::uint64_t> size(std::string_view key) const { return inner.size(key); }
  std::vector<std::string> list(std::string_view prefix) const { return inner.list(prefix); }
  void remove(std::string_view key) { inner.remove(key); }
  void remove_all(std::string_view prefix) { inner.remove_all(prefix); }
  std::string describe(std::string_view key) const { return inner.describe(key); }
};

/// Storage factories for TEST_CASE_TEMPLATE: each owns what its storage needs.
struct posix_backend {
  using storage = ckpt::posix;
  temp_dir dir;
  storage make() { return storage(dir.path()); }
};
struct memory_backend {
  using storage = ckpt::memory_storage;
  storage mem;
  storage make() { return mem; }
};

/// Fills `bytes` from `rng`, every byte of each result it draws (four of a 32-bit engine's,
/// eight of a 64-bit one's): a call per byte is what made the O_DIRECT and mutation tests slow
/// in a build that optimises little (tools/dev.sh test builds with -Og).
template <class Rng>
void fill_bytes(std::span<std::byte> bytes, Rng& rng) {
  static_assert(Rng::min() == 0, "an engine whose results are all bit patterns");
  constexpr std::size_t per_call = Rng::max() >= std::numeric_limits<std::uint64_t>::max()   ? 8
                                   : Rng::max() >= std::numeric_limits<std::uint32_t>::max() ? 4
                                                                                              : 1;
  std::size_t at = 0;
  for (; at < bytes.size(); at += per_call) {
    const auto word = static_cast<std::uint64_t>(rng());
    std::memcpy(bytes.data() + at, &word, std::min(per_call, bytes.size() - at));  // little-endian: the low bytes
  }
}

/// A whole file's bytes, read in one call (empty when it cannot be opened).
inline std::vector<char> file_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) return {};
  std::vector<char> bytes(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<std::size_t>(in.gcount()));
  return bytes;
}

template <class T>
void fill_random(std::vector<T>& v, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, ckpt::float16> || std::is_same_v<T, ckpt::bfloat16>)
      x = T(std::normal_distribution<float>(0.f, 0.02f)(g));
    else if constexpr (std::is_floating_point_v<T>)
      x = static_cast<T>(std::normal_distribution<double>(0.0, 1.0)(g));
    else
      x = static_cast<T>(g());
  }
}

/// One tensor of every dtype, an empty tensor, scalars, a 3-d tensor, values and an
/// optimizer group: the state most tests save and load.
struct every_dtype_state {
  std::vector<double> f64 = std::vector<double>(37);
  std::vector<float> f32 = std::vector<float>(12 * 33);  // viewed as 12 x 33
  std::vector<ckpt::float16> f16 = std::vector<ckpt::float16>(50);
  std::vector<ckpt::bfloat16> bf16 = std::vector<ckpt::bfloat16>(51);
  std::vector<std::int64_t> i64 = std::vector<std::int64_t>(9);
  std::vector<std::int32_t> i32 = std::vector<std::int32_t>(10);
  std::vector<std::int16_t> i16 = std::vector<std::int16_t>(11);
  std::vector<std::int8_t> i8 = std::vector<std::int8_t>(13);
  std::vector<std::uint8_t> u8 = std::vector<std::uint8_t>(14);
  std::array<bool, 7> flags{};
  std::vector<float> empty;
  double scalar = 0;
  std::int32_t counter = 0;
  std::vector<float> cube = std::vector<float>(4 * 5 * 6);
  std::vector<float> adam_m = std::vector<float>(64), adam_v = std::vector<float>(64);
  std::int64_t adam_step = 0;
  std::mt19937 rng{1};
  std::mt19937_64 rng64{2};
  std::normal_distribution<double> noise{0.0, 1.0};
  std::string note;
  std::map<std::string, int> table;

  template <class V>
  void checkpoint(V& v) {
    v.tensor("f64", f64);
    v.tensor("layers.0.f32", ckpt::view(f32, {12, 33}));
    v.tensor("f16", f16);
    v.tensor("bf16", bf16);
    v.tensor("i64", i64);
    v.tensor("i32", i32);
    v.tensor("i16", i16);
    v.tensor("i8", i8);
    v.tensor("u8", u8);
    v.tensor("flags", flags);
    v.tensor("empty", empty);
    v.tensor("scalar", scalar);
    v.tensor("counter", counter);
    v.tensor("cube", ckpt::view(cube.data(), {4, 5, 6}));
    v.group("optimizer", [&](auto& g) {
      g.tensor("m", adam_m);
      g.tensor("v", adam_v);
      g.value("step", adam_step);
    });
    v.value("rng", rng);
    v.value("rng64", rng64);
    v.value("noise", noise);
    v.value("note", note);
    v.value("table", table);
  }

  /// Deterministic, seed-dependent contents.
  void randomise(std::uint64_t seed) {
    fill_random(f64, seed + 1);
    fill_random(f32, seed + 2);
    fill_random(f16, seed + 3);
    fill_random(bf16, seed + 4);
    fill_random(i64, seed + 5);
    fill_random(i32, seed + 6);
    fill_random(i16, seed + 7);
    fill_random(i8, seed + 8);
    fill_random(u8, seed + 9);
    for (std::size_t i = 0; i < flags.size(); ++i) flags[i] = ((seed >> i) & 1) != 0;
    scalar = 0.5 + static_cast<double>(seed);
    counter = static_cast<std::int32_t>(seed * 7);
    fill_random(cube, seed + 10);
    fill_random(adam_m, seed + 11);
    fill_random(adam_v, seed + 12);
    adam_step = static_cast<std::int64_t>(seed * 3);
    rng.seed(static_cast<std::uint32_t>(seed));
    rng.discard(seed % 100);
    rng64.seed(seed + 99);
    noise.reset();
    noise(rng);  // leaves a cached second value in libstdc++'s normal_distribution
    note = "seed " + std::to_string(seed);
    table = {{"a", static_cast<int>(seed)}, {"b", 2}};
  }

  bool operator==(const every_dtype_state& o) const {
    return f64 == o.f64 && f32 == o.f32 && f16 == o.f16 && bf16 == o.bf16 && i64 == o.i64 && i32 == o.i32 &&
           i16 == o.i16 && i8 == o.i8 && u8 == o.u8 && flags == o.flags && empty == o.empty && scalar == o.scalar &&
           counter == o.counter && cube == o.cube && adam_m == o.adam_m && adam_v == o.adam_v &&
           adam_step == o.adam_step && rng == o.rng && rng64 == o.rng64 && noise == o.noise && note == o.note &&
           table == o.table;
  }
};

/// The metadata of `tag` in `mem`, chunk map included, and every chunk's details (for a
/// version-2 tag, from the shard files' footers).
inline ckpt::detail::metadata read_metadata(ckpt::memory_storage& mem, const std::string& tag) {
  const auto& text = mem.bytes(tag + "/metadata.json");
  auto md = ckpt::detail::decode_metadata(std::string(reinterpret_cast<const char*>(text.data()), text.size()), "metadata.json");
  ckpt::detail::decode_chunk_map(mem.bytes(tag + "/" + md.chunk_map.path), md, "chunk_map.bin");
  (void)ckpt::detail::read_all_chunk_details(mem, md);
  return md;
}

/// Rewrites chunk_map.bin and metadata.json of `tag` in `mem` from `md` (which may be hostile),
/// consistently checksummed. A version-2 `md` (as read_metadata returns it, every chunk's
/// details included) is written as version 1, whose chunk map lists those details: the hostile
/// edits tests make to chunk tables then reach the reader, which still reads version 1.
inline void write_metadata(ckpt::memory_storage& mem, ckpt::detail::metadata md, const std::string& tag) {
  if (md.format_version == ckpt::detail::metadata_version) {
    md.format_version = 1;
    for (auto& t : md.tensors) t.placement.reset();
  }
  const auto map = ckpt::detail::encode_chunk_map(md);
  md.chunk_map.size = map.size();
  md.chunk_map.xxh3 = ckpt::detail::xxh3(map);
  const auto text = ckpt::detail::encode_metadata(md);
  auto to_bytes = [](const std::string& s) {
    return std::vector<std::byte>(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
  };
  mem.bytes(tag + "/chunk_map.bin") = to_bytes(map);
  mem.bytes(tag + "/metadata.json") = to_bytes(text);
}

/// Runs `f` and returns the ckpt::error it throws; fails the test if it throws nothing.
template <class F>
ckpt::error catch_error(F&& f) {
  try {
    f();
  } catch (const ckpt::error& e) {
    return e;
  }
  FAIL("expected a ckpt::error");
  return ckpt::error(ckpt::error_kind::io, "unreachable");
}

}  // namespace test
