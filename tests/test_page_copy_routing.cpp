// Which buffer ckpt::posix (and the safetensors reader and writer) hands the kernel: its own
// bounce buffer for copies in the slow window (detail/page_copy.hpp), the caller's buffer
// otherwise; and, for posix's O_DIRECT writes, aligned whole blocks. The bytes are the same
// either way (the unit suite checks them), so only the system calls can tell the paths apart:
// this binary replaces pread, preadv, pwrite and write with wrappers that record the buffer, file
// position and O_DIRECT flag of each call and then make the system call themselves. It is its own executable because the wrappers replace those functions for
// everything linked into it.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <ckpt/interop/safetensors.hpp>
#include <ckpt/posix.hpp>

#include "helpers.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

struct call {
  std::uintptr_t buffer;
  std::size_t bytes;
  std::uint64_t position;  // in the file
  bool o_direct = false;   // the descriptor had O_DIRECT
  bool refused = false;    // failed with EINVAL (refuse_o_direct)
};
// posix's O_DIRECT writes and a load's reads run on threads of their own: the wrappers record
// under a lock.
std::atomic<bool> recording = false;
std::atomic<bool> refuse_o_direct = false;  // reads and writes fail with EINVAL on O_DIRECT descriptors, as some file systems do
std::mutex calls_mu;
std::vector<call> calls;
// The file space posix allocates ahead of its writes and cuts off after them, while recording.
struct space_call {
  bool truncate;  // ftruncate (to `length`); otherwise fallocate
  std::string file;
  std::uint64_t offset, length;
};
std::vector<space_call> space_calls;  // under calls_mu
std::atomic<bool> slow_writes = false;         // O_DIRECT pwrites sleep 2 ms first
std::atomic<int> in_flight = 0, most_in_flight = 0;  // O_DIRECT pwrites under way while slow_writes
std::atomic<std::int64_t> fail_direct_write_at = -1;  // an O_DIRECT pwrite over this file position fails with EIO

void note(const call& c) {
  if (!recording) return;
  std::lock_guard lock(calls_mu);
  calls.push_back(c);
}

/// Records the calls `f` makes.
template <class F>
std::vector<call> record(F&& f) {
  {
    std::lock_guard lock(calls_mu);
    calls.clear();
    space_calls.clear();
  }
  recording = true;
  f();
  recording = false;
  std::lock_guard lock(calls_mu);
  return calls;
}

/// The calls that moved bytes (not the refused ones), in file order: they must tile [0, size).
std::vector<call> by_position(std::vector<call> got) {
  std::erase_if(got, [](const call& c) { return c.refused; });
  std::sort(got.begin(), got.end(), [](const call& a, const call& b) { return a.position < b.position; });
  return got;
}
void check_tiles(const std::vector<call>& sorted, std::uint64_t from, std::uint64_t to) {
  std::uint64_t at = from;
  for (const auto& c : sorted) {
    CHECK(c.position == at);
    at = c.position + c.bytes;
  }
  CHECK(at == to);
}

bool in_window(std::size_t distance) { return distance % 4096 != 0 && distance % 4096 < 64; }

/// Every call used a buffer 2 KiB from its file position (the bounce buffer), none of them the
/// caller's, and together they moved `bytes` bytes.
void check_bounced(const std::vector<call>& got, std::uintptr_t user, std::size_t bytes, bool writing) {
  REQUIRE_FALSE(got.empty());
  std::size_t moved = 0;
  for (const auto& c : got) {
    CHECK((c.buffer + c.bytes <= user || c.buffer >= user + bytes));  // not the caller's buffer
    const auto distance = writing ? (c.position - c.buffer) % 4096 : (c.buffer - c.position) % 4096;
    CHECK(distance == 2048);
    CHECK(c.bytes <= ckpt::detail::bounce_buffer::size);
    moved += c.bytes;
  }
  CHECK(moved == bytes);
}

/// One call, straight from or into the caller's buffer, at `position`, moving all `bytes`.
void check_direct(const std::vector<call>& got, std::uintptr_t user, std::uint64_t position, std::size_t bytes) {
  REQUIRE(got.size() == 1);
  CHECK(got[0].buffer == user);
  CHECK(got[0].position == position);
  CHECK(got[0].bytes == bytes);
}

/// Writes `size` random bytes (from `seed`) to `path` and returns them.
std::vector<std::byte> write_random_file(const std::filesystem::path& path, std::size_t size, unsigned seed) {
  std::vector<std::byte> content(size);
  std::mt19937 rng(seed);
  test::fill_bytes(content, rng);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
  return content;
}

}  // namespace

extern "C" ssize_t pread(int fd, void* buffer, size_t bytes, off_t offset) {
  const bool o_direct = (::fcntl(fd, F_GETFL) & O_DIRECT) != 0, refused = o_direct && refuse_o_direct;
  note({reinterpret_cast<std::uintptr_t>(buffer), bytes, static_cast<std::uint64_t>(offset), o_direct, refused});
  if (refused) {
    errno = EINVAL;
    return -1;
  }
  return ::syscall(SYS_pread64, fd, buffer, bytes, offset);
}

// posix's reader reads a range in place with one preadv: each of its parts is recorded as a call.
extern "C" ssize_t preadv(int fd, const struct iovec* parts, int count, off_t offset) {
  const bool o_direct = (::fcntl(fd, F_GETFL) & O_DIRECT) != 0, refused = o_direct && refuse_o_direct;
  std::uint64_t at = static_cast<std::uint64_t>(offset);
  for (int k = 0; k < count; ++k) {
    note({reinterpret_cast<std::uintptr_t>(parts[k].iov_base), parts[k].iov_len, at, o_direct, refused});
    at += parts[k].iov_len;
  }
  if (refused) {
    errno = EINVAL;
    return -1;
  }
  const auto pos = static_cast<std::uint64_t>(offset);
  return ::syscall(SYS_preadv, fd, parts, count, static_cast<unsigned long>(pos), static_cast<unsigned long>(pos >> 32));
}

extern "C" ssize_t pwrite(int fd, const void* buffer, size_t bytes, off_t offset) {
  const bool o_direct = (::fcntl(fd, F_GETFL) & O_DIRECT) != 0, refused = o_direct && refuse_o_direct;
  note({reinterpret_cast<std::uintptr_t>(buffer), bytes, static_cast<std::uint64_t>(offset), o_direct, refused});
  if (refused) {
    errno = EINVAL;
    return -1;
  }
  if (const auto at = fail_direct_write_at.load(); o_direct && at >= offset && at < offset + static_cast<off_t>(bytes)) {
    errno = EIO;
    return -1;
  }
  if (o_direct && slow_writes) {
    const int now = ++in_flight;
    for (int seen = most_in_flight; now > seen && !most_in_flight.compare_exchange_weak(seen, now);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto n = ::syscall(SYS_pwrite64, fd, buffer, bytes, offset);
    --in_flight;
    return n;
  }
  return ::syscall(SYS_pwrite64, fd, buffer, bytes, offset);
}

// How often posix asks the kernel which pages are cached, while recording.
std::atomic<int> mincore_calls = 0;
extern "C" int mincore(void* address, size_t bytes, unsigned char* pages) {
  if (recording) ++mincore_calls;
  return static_cast<int>(::syscall(SYS_mincore, address, bytes, pages));
}

void note_space(int fd, bool truncate, std::uint64_t offset, std::uint64_t length) {
  if (!recording) return;
  char path[4096] = {};
  const auto n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), path, sizeof path - 1);
  std::lock_guard lock(calls_mu);
  space_calls.push_back({truncate, n > 0 ? std::string(path, static_cast<std::size_t>(n)) : std::string(), offset, length});
}
std::atomic<bool> fallocate_runs_out = false;  // fallocate allocates half of what it is asked for, then fails with ENOSPC
extern "C" int fallocate(int fd, int mode, off_t offset, off_t length) {
  note_space(fd, false, static_cast<std::uint64_t>(offset), static_cast<std::uint64_t>(length));
  if (fallocate_runs_out) {
    ::syscall(SYS_fallocate, fd, mode, offset, length / 2);
    errno = ENOSPC;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_fallocate, fd, mode, offset, length));
}
extern "C" int ftruncate(int fd, off_t length) {
  note_space(fd, true, 0, static_cast<std::uint64_t>(length));
  return static_cast<int>(::syscall(SYS_ftruncate, fd, length));
}

extern "C" ssize_t write(int fd, const void* buffer, size_t bytes) {
  const bool o_direct = (::fcntl(fd, F_GETFL) & O_DIRECT) != 0, refused = o_direct && refuse_o_direct;
  if (recording)
    note({reinterpret_cast<std::uintptr_t>(buffer), bytes, static_cast<std::uint64_t>(::lseek(fd, 0, SEEK_CUR)), o_direct,
          refused});
  if (refused) {
    errno = EINVAL;
    return -1;
  }
  return ::syscall(SYS_write, fd, buffer, bytes);
}

TEST_CASE("posix reads into a buffer just past the file offset through the bounce buffer, others directly") {
  // Bounced only where this machine's copies in the window are slow (page_copy.hpp,
  // slow_copy_window_here): both answers, whatever this CPU's is.
  bool slow = true;
  SUBCASE("on a CPU whose copies in the window are slow") {}
  SUBCASE("on one whose are not: nothing is bounced") { slow = false; }
  CAPTURE(slow);
  const test::copy_window_forced forced(slow);
  // Through the page cache (the file was just written, and direct_reads is off anyway).
  test::temp_dir dir;
  std::vector<std::byte> content(std::size_t{300} * 1024);
  std::mt19937 rng(5);
  test::fill_bytes(content, rng);
  {
    std::ofstream f(dir.path() / "blob", std::ios::binary);
    f.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
  }
  ckpt::posix disk(dir.path(), {.direct_reads = false});
  const auto r = disk.open_reader("blob");
  test::page_block block(content.size() + 8192);
  const std::size_t size = std::size_t{200} * 1024 + 13;
  for (std::uint64_t offset : {std::uint64_t{4096}, std::uint64_t{5000}}) {
    for (std::size_t distance : {0, 1, 16, 63, 64, 80, 2048, 4080}) {
      CAPTURE(offset);
      CAPTURE(distance);
      const std::span<std::byte> out(block.start + (offset + distance) % 4096, size);
      const auto got = record([&] { r.read(offset, out); });
      const auto user = reinterpret_cast<std::uintptr_t>(out.data());
      if (slow && in_window(distance)) {
        check_bounced(got, user, size, false);
      } else {
        check_direct(got, user, offset, size);
      }
      CHECK(std::equal(out.begin(), out.end(), content.begin() + static_cast<std::ptrdiff_t>(offset)));
    }
  }
  // Reads under 64 KiB are never bounced: the slow copy costs little there.
  const std::span<std::byte> small(block.start + 16, 1000);
  const auto got = record([&] { r.read(0, small); });
  check_direct(got, reinterpret_cast<std::uintptr_t>(small.data()), 0, small.size());
}

TEST_CASE("posix writes from a buffer just behind the file position through the bounce buffer, others directly") {
  // Bounced only where this machine's copies in the window are slow (page_copy.hpp,
  // slow_copy_window_here): both answers, whatever this CPU's is.
  bool slow = true;
  SUBCASE("on a CPU whose copies in the window are slow") {}
  SUBCASE("on one whose are not: nothing is bounced") { slow = false; }
  CAPTURE(slow);
  const test::copy_window_forced forced(slow);
  test::temp_dir dir;
  ckpt::posix disk(dir.path(), {.direct_writes = false});  // through the page cache
  const std::size_t size = std::size_t{200} * 1024 + 13;
  test::page_block block(size + 8192);
  std::mt19937 rng(6);
  std::vector<std::byte> want;
  std::uint64_t position = 0;  // what the writer has written, gathered bytes included
  std::optional<ckpt::posix::writer> w(disk.create("blob"));
  for (std::size_t distance : {0, 1, 16, 63, 64, 80, 2048, 4080}) {
    CAPTURE(distance);
    if (distance == 63) {  // a writer moved (assigned, then constructed) keeps its position
      auto other = disk.create("other");
      other = std::move(*w);
      w.reset();
      w.emplace(std::move(other));
    }
    // Seven gathered bytes first, so the position is off 4 KiB; they are written (flushed)
    // ahead of the big write.
    const std::vector<std::byte> seven(7, static_cast<std::byte>(distance));
    w->write(seven);
    want.insert(want.end(), seven.begin(), seven.end());
    position += 7;
    const std::span<std::byte> src(block.start + (position + 4096 - distance % 4096) % 4096, size);
    test::fill_bytes(src, rng);
    auto got = record([&] { w->write(src); });
    REQUIRE(got.size() >= 2);
    CHECK(got[0].bytes == 7);  // the gathered bytes, flushed first
    CHECK(got[0].position == position - 7);
    got.erase(got.begin());
    const auto user = reinterpret_cast<std::uintptr_t>(src.data());
    if (slow && in_window(distance)) {
      check_bounced(got, user, size, true);
    } else {
      check_direct(got, user, position, size);
    }
    want.insert(want.end(), src.begin(), src.end());
    position += size;
  }
  w->sync();
  w->publish();
  std::ifstream in(dir.path() / "blob", std::ios::binary);
  const std::vector<char> file{std::istreambuf_iterator<char>(in), {}};
  REQUIRE(file.size() == want.size());
  CHECK(std::memcmp(file.data(), want.data(), want.size()) == 0);
}

TEST_CASE("safetensors reads and writes in the slow window go through the bounce buffer too") {
  // Bounced only where this machine's copies in the window are slow (page_copy.hpp,
  // slow_copy_window_here): both answers, whatever this CPU's is.
  bool slow = true;
  SUBCASE("on a CPU whose copies in the window are slow") {}
  SUBCASE("on one whose are not: nothing is bounced") { slow = false; }
  CAPTURE(slow);
  const test::copy_window_forced forced(slow);
  namespace st = ckpt::interop;
  test::temp_dir dir;
  const auto path = dir.path() / "model.safetensors";
  const std::size_t n = 51200 + 3;  // floats: 200 KiB and 12 bytes
  const std::size_t bytes = n * sizeof(float);
  test::page_block block(bytes + 8192);
  std::mt19937 rng(8);
  std::vector<std::byte> want(bytes);
  test::fill_bytes(want, rng);
  for (std::size_t distance : {0, 16, 80}) {
    CAPTURE(distance);
    std::uint64_t position = 0;  // of the tensor's bytes in the file
    {
      st::safetensors_writer w(path, {{"w", ckpt::dtype::f32, {static_cast<std::int64_t>(n)}}});
      position = w.data_start();
      // The source starts `distance` bytes before the file position, modulo 4 KiB.
      const std::span<std::byte> src(block.start + (position + 4096 - distance) % 4096, bytes);
      std::copy(want.begin(), want.end(), src.begin());
      const auto got = record([&] { w.write("w", src); });
      if (slow && in_window(distance)) {
        check_bounced(got, reinterpret_cast<std::uintptr_t>(src.data()), bytes, true);
      } else {
        check_direct(got, reinterpret_cast<std::uintptr_t>(src.data()), position, bytes);
      }
      w.finish();
    }
    const st::safetensors_file f(path);
    REQUIRE(f.data_start() + f.at("w").begin == position);
    const std::span<std::byte> out(block.start + (position + distance) % 4096, bytes);
    std::fill(out.begin(), out.end(), std::byte{0});
    const auto got = record([&] { f.read("w", out); });
    if (slow && in_window(distance)) {
      check_bounced(got, reinterpret_cast<std::uintptr_t>(out.data()), bytes, false);
    } else {
      check_direct(got, reinterpret_cast<std::uintptr_t>(out.data()), position, bytes);
    }
    CHECK(std::equal(out.begin(), out.end(), want.begin()));
  }
}

TEST_CASE("posix O_DIRECT writes hand the kernel whole aligned blocks, and only the last partial block goes through the page cache") {
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  unsigned depth = 32;  // the default: writes of 1 MiB on the write queue's threads
  SUBCASE("many writes in flight") {}
  SUBCASE("one at a time, on the caller's thread") { depth = 1; }
  CAPTURE(depth);
  ckpt::posix disk(dir.path(), {.writes_in_flight = depth});  // O_DIRECT is the default
  constexpr std::size_t buffer = std::size_t{1} << 20;
  const std::size_t size = 2 * buffer + 3 * 4096 + 100;
  test::page_block block(size + 8192);
  std::mt19937 rng(12);
  const std::span<std::byte> src(block.start + 16, size);  // a std::vector's placement
  test::fill_bytes(src, rng);
  const auto user = reinterpret_cast<std::uintptr_t>(src.data());
  auto w = disk.create("blob");
  REQUIRE(w.writes_direct());
  auto got = by_position(record([&] {
    w.write(src.first(4096 + 7));  // into the buffer
    w.write(src.subspan(4096 + 7));
    w.sync();
  }));
  // Two full buffers went out with O_DIRECT, from aligned buffers that are not the caller's;
  // sync wrote the three whole blocks left with O_DIRECT and the last 100 bytes without.
  REQUIRE(got.size() == 4);
  check_tiles(got, 0, size);
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].o_direct == (i < 3));
    CHECK(got[i].bytes == (i < 2 ? buffer : i == 2 ? 3 * 4096 : 100));
    if (i < 3) CHECK(got[i].buffer % 4096 == 0);
    CHECK((got[i].buffer + got[i].bytes <= user || got[i].buffer >= user + size));
  }
  CHECK_FALSE(w.writes_direct());
  w.publish();
  const auto file = test::file_bytes(dir.path() / "blob");
  REQUIRE(file.size() == size);  // what was allocated ahead of the writes is cut off
  CHECK(std::memcmp(file.data(), src.data(), size) == 0);

  // An aligned caller's buffer (pinned staging memory is) is written from in place, whole
  // blocks at a time in writes of at most 1 MiB, while the writer's own buffer is empty.
  const std::span<std::byte> aligned(block.start, 2 * buffer + 5 * 4096 + 10);
  auto w2 = disk.create("aligned");
  got = by_position(record([&] {
    w2.write(aligned);
    w2.publish();
  }));
  REQUIRE(got.size() == 4);
  check_tiles(got, 0, aligned.size());
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(got[i].o_direct);
    CHECK(got[i].buffer == reinterpret_cast<std::uintptr_t>(aligned.data()) + i * buffer);
    CHECK(got[i].bytes == (i < 2 ? buffer : 5 * 4096));
  }
  CHECK_FALSE(got[3].o_direct);
  CHECK(got[3].bytes == 10);
  const auto file2 = test::file_bytes(dir.path() / "aligned");
  REQUIRE(file2.size() == aligned.size());
  CHECK(std::memcmp(file2.data(), aligned.data(), aligned.size()) == 0);
}

TEST_CASE("posix writes aligned bytes that follow whole blocks in its buffer from where they are") {
  // A chunk whose size is not whole blocks (a bf16 tensor of 2 KiB rows) leaves its tail and
  // the padding after it in the writer's buffer: the next chunk, page-aligned, is written from
  // the caller's memory once the buffer has gone out as a shorter write.
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  ckpt::posix disk(dir.path());
  constexpr std::size_t mib = std::size_t{1} << 20;
  test::page_block first(3 * mib), second(3 * mib);
  std::mt19937 rng(24);
  const std::span<std::byte> a(first.start, 2 * mib + 2048), b(second.start, 2 * mib);
  test::fill_bytes(a, rng);
  test::fill_bytes(b, rng);
  const std::vector<std::byte> zeros(2048);
  auto w = disk.create("blob");
  const auto got = by_position(record([&] {
    w.write(a);
    w.write(zeros);  // the tail of `a` and the padding: one whole block, buffered
    w.write(b);
    w.sync();
  }));
  check_tiles(got, 0, a.size() + zeros.size() + b.size());
  const auto from_b = [&](const call& c) { return c.buffer >= reinterpret_cast<std::uintptr_t>(b.data()) &&
                                                  c.buffer < reinterpret_cast<std::uintptr_t>(b.data()) + b.size(); };
  std::size_t in_place = 0;
  for (const auto& c : got)
    if (from_b(c)) {
      CHECK(c.o_direct);
      in_place += c.bytes;
    }
  CHECK(in_place == b.size());  // none of `b` was copied
  w.publish();
  const auto file = test::file_bytes(dir.path() / "blob");
  REQUIRE(file.size() == a.size() + zeros.size() + b.size());
  CHECK(std::memcmp(file.data(), a.data(), a.size()) == 0);
  CHECK(std::memcmp(file.data() + a.size() + zeros.size(), b.data(), b.size()) == 0);
}

TEST_CASE("posix O_DIRECT writes that the file system refuses go through the page cache instead") {
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  unsigned depth = 32;
  SUBCASE("many writes in flight") {}
  SUBCASE("one at a time") { depth = 1; }
  CAPTURE(depth);
  ckpt::posix disk(dir.path(), {.writes_in_flight = depth});
  constexpr std::size_t buffer = std::size_t{1} << 20;
  const std::size_t size = 3 * buffer + 5000;
  test::page_block block(size + 4096);
  std::mt19937 rng(13);
  const std::span<std::byte> src(block.start + 16, size);
  test::fill_bytes(src, rng);
  for (int aligned_source = 0; aligned_source < 2; ++aligned_source) {
    CAPTURE(aligned_source);
    const auto from = aligned_source ? std::span<std::byte>(block.start, size) : src;
    if (aligned_source) std::memmove(from.data(), src.data(), size);
    auto w = disk.create("blob");
    REQUIRE(w.writes_direct());
    refuse_o_direct = true;
    const auto all = record([&] {
      w.write(from);
      // Refused, then through the page cache for good: at once when the writes ran on this
      // thread or were waited for (in place), by sync at the latest otherwise.
      if (depth == 1 || aligned_source) CHECK_FALSE(w.writes_direct());
      w.sync();
    });
    refuse_o_direct = false;
    CHECK_FALSE(w.writes_direct());
    w.publish();
    // Each refused write went through the page cache at the same position, and the rest of the
    // file after the refusal was seen; every byte was written once.
    const auto refused = std::count_if(all.begin(), all.end(), [](const call& c) { return c.refused; });
    CHECK(refused >= 1);
    if (depth == 1) CHECK(refused == 1);
    const auto got = by_position(all);
    check_tiles(got, 0, size);
    for (const auto& c : got) CHECK_FALSE(c.o_direct);
    const auto file = test::file_bytes(dir.path() / "blob");
    REQUIRE(file.size() == size);
    CHECK(std::memcmp(file.data(), from.data(), size) == 0);
  }
}

TEST_CASE("posix O_DIRECT writes keep several writes in flight, at most writes_in_flight") {
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  ckpt::posix disk(dir.path(), {.writes_in_flight = 4});
  constexpr std::size_t buffer = std::size_t{1} << 20;
  const std::size_t size = 24 * buffer;
  std::vector<std::byte> src(size);
  std::mt19937 rng(14);
  test::fill_bytes(src, rng);
  slow_writes = true;  // each O_DIRECT write takes 2 ms: the writer fills buffers meanwhile
  auto w = disk.create("blob");
  w.write(src);
  w.sync();
  slow_writes = false;
  w.publish();
  CHECK(most_in_flight > 1);
  CHECK(most_in_flight <= 4);
  const auto file = test::file_bytes(dir.path() / "blob");
  REQUIRE(file.size() == size);
  CHECK(std::memcmp(file.data(), src.data(), size) == 0);
}

TEST_CASE("posix writes retained bytes from where they are and keeps them in flight from one call to the next, until sync") {
  // write() waits for its writes from the caller's memory before it returns; write_retained(),
  // whose caller keeps the bytes until sync, queues the next call's writes behind them at once
  // (a save's raw chunks, written from the tensors: one chunk's writes no longer drain before
  // the next chunk's start).
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  ckpt::posix disk(dir.path(), {.writes_in_flight = 4});
  const std::size_t mib = std::size_t{1} << 20, pieces = 8;
  test::page_block block(pieces * mib);
  std::mt19937 rng(21);
  test::fill_bytes(std::span<std::byte>(block.start, pieces * mib), rng);
  const auto most_at_once = [&](bool retained) {
    most_in_flight = 0;
    slow_writes = true;  // each O_DIRECT write takes 2 ms
    const auto key = retained ? "retained" : "written";
    auto w = disk.create(key);
    const auto got = record([&] {
      for (std::size_t k = 0; k < pieces; ++k) {
        const std::span<const std::byte> piece(block.start + k * mib, mib);
        if (retained)
          w.write_retained(piece);
        else
          w.write(piece);
      }
      w.sync();
    });
    slow_writes = false;
    w.publish();
    std::size_t from_caller = 0;
    for (const auto& c : got)
      if (c.o_direct && c.buffer >= reinterpret_cast<std::uintptr_t>(block.start) &&
          c.buffer < reinterpret_cast<std::uintptr_t>(block.start) + pieces * mib)
        from_caller += c.bytes;
    CHECK(from_caller == pieces * mib);  // none copied
    const auto file = test::file_bytes(dir.path() / key);
    REQUIRE(file.size() == pieces * mib);
    CHECK(std::memcmp(file.data(), block.start, file.size()) == 0);
    return most_in_flight.load();
  };
  CHECK(most_at_once(false) == 1);
  const auto retained = most_at_once(true);
  CHECK(retained > 1);
  CHECK(retained <= 4);
}

TEST_CASE("a failed O_DIRECT write in flight surfaces as an io error naming the file, and nothing is published") {
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  for (unsigned depth : {1u, 32u}) {
    CAPTURE(depth);
    ckpt::posix disk(dir.path(), {.writes_in_flight = depth});
    std::vector<std::byte> src(std::size_t{8} << 20, std::byte{7});
    fail_direct_write_at = std::int64_t{3} << 20;  // the fourth write of 1 MiB
    std::optional<ckpt::posix::writer> w(disk.create("blob"));
    bool thrown = false;
    try {
      w->write(src);  // the failure surfaces here, or at the latest in sync
      w->sync();
      w->publish();
    } catch (const ckpt::error& e) {
      thrown = true;
      CHECK(e.kind() == ckpt::error_kind::io);
      const std::string what = e.what();
      CHECK(what.find(dir.str()) != std::string::npos);
      CHECK(what.find("blob") != std::string::npos);
      CHECK(what.find(std::strerror(EIO)) != std::string::npos);
    }
    fail_direct_write_at = -1;
    CHECK(thrown);
    w.reset();  // waits for the writes still in flight, then removes the temporary file
    CHECK(disk.list("").empty());
  }
}

TEST_CASE("posix reads bytes not in the page cache with O_DIRECT, and cached bytes through the cache") {
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  const auto path = dir.path() / "blob";
  const auto content = write_random_file(path, std::size_t{6} << 20, 14);
  if (!test::drop_from_cache(path)) {
    MESSAGE("the kernel keeps " << dir.str() << "'s files in its page cache: nothing to check here");
    return;
  }
  ckpt::posix disk(dir.path());  // O_DIRECT reads are the default
  const auto r = disk.open_reader("blob");
  REQUIRE(r.reads_direct());
  test::page_block block(content.size() + 8192);
  const std::size_t size = std::size_t{256} * 1024;

  // From the disk: the whole blocks that hold the range, into an aligned buffer (not the
  // caller's), at aligned offsets; read that way, the bytes do not enter the page cache.
  const std::uint64_t offset = 4096 + 100;
  const std::span<std::byte> out(block.start + 16, size);
  const auto user = [](std::span<std::byte> s) {
    return std::pair{reinterpret_cast<std::uintptr_t>(s.data()), reinterpret_cast<std::uintptr_t>(s.data()) + s.size()};
  };
  const auto check_o_direct = [&](const std::vector<call>& got, std::uint64_t from, std::uint64_t to, std::span<std::byte> dst) {
    std::uint64_t next = from;
    for (const auto& c : got) {
      CHECK(c.o_direct);
      CHECK(c.buffer % 4096 == 0);
      CHECK(c.position == next);
      CHECK(c.bytes % 4096 == 0);
      CHECK((c.buffer + c.bytes <= user(dst).first || c.buffer >= user(dst).second));
      next += c.bytes;
    }
    CHECK(next == to);
  };
  auto got = record([&] { r.read(offset, out); });
  REQUIRE(got.size() == 1);
  check_o_direct(got, 4096, (offset + size + 4095) / 4096 * 4096, out);
  CHECK(std::equal(out.begin(), out.end(), content.begin() + static_cast<std::ptrdiff_t>(offset)));
  CHECK(test::resident_pages(path) == 0);
  // Bytes it already holds are copied out without another read.
  const auto again = out.first(1000);
  got = record([&] { r.read(offset + 5000, again); });
  CHECK(got.empty());
  CHECK(std::equal(again.begin(), again.end(), content.begin() + static_cast<std::ptrdiff_t>(offset) + 5000));

  // A range announced with will_read is read ahead, 4 MiB per read, never past its end; its
  // pieces then come out of the buffer, however small.
  const std::uint64_t chunk_at = 512 * 1024, chunk = (std::uint64_t{5} << 20) + 300;  // past what it holds
  r.will_read(chunk_at, chunk);
  std::vector<call> all;
  std::vector<std::byte> got_bytes;
  for (std::uint64_t at = 0; at < chunk; at += size) {
    const auto piece = out.first(std::min<std::uint64_t>(size, chunk - at));
    got = record([&] { r.read(chunk_at + at, piece); });
    all.insert(all.end(), got.begin(), got.end());
    got_bytes.insert(got_bytes.end(), piece.begin(), piece.end());
  }
  REQUIRE(all.size() == 2);  // 4 MiB, then the rest
  CHECK(all[0].bytes == std::size_t{4} << 20);
  check_o_direct(all, chunk_at, (chunk_at + chunk + 4095) / 4096 * 4096, out);
  REQUIRE(got_bytes.size() == chunk);
  CHECK(std::equal(got_bytes.begin(), got_bytes.end(), content.begin() + static_cast<std::ptrdiff_t>(chunk_at)));
  CHECK(test::resident_pages(path) == 0);

  // Cached bytes: one read through the cache, straight into the caller's buffer.
  {
    std::ifstream warm(path, std::ios::binary);
    std::vector<char> sink(content.size());
    warm.read(sink.data(), static_cast<std::streamsize>(sink.size()));
  }
  REQUIRE(test::resident_pages(path) == content.size() / 4096);
  const std::span<std::byte> aligned_out(block.start, size);
  got = record([&] { r.read(1 << 20, aligned_out); });
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0].o_direct);
  CHECK(got[0].buffer == reinterpret_cast<std::uintptr_t>(aligned_out.data()));
  CHECK(std::equal(aligned_out.begin(), aligned_out.end(), content.begin() + (1 << 20)));
  // A cached range announced as a whole (a run of small chunks, loaded just after the save):
  // the kernel is asked once which of its pages are cached, not once per piece, and the pieces
  // come out of one read of the range through the cache (read_batched).
  r.will_read(0, std::uint64_t{2} << 20);
  mincore_calls = 0;
  std::vector<std::byte> pieces;
  got = record([&] {
    for (std::uint64_t at = 0; at < (std::uint64_t{2} << 20); at += 32768) {
      r.read(at, aligned_out.first(32768));
      pieces.insert(pieces.end(), aligned_out.begin(), aligned_out.begin() + 32768);
    }
  });
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0].o_direct);
  CHECK(got[0].position == 0);
  CHECK(got[0].bytes == std::size_t{2} << 20);
  CHECK(mincore_calls == 1);
  CHECK(std::equal(pieces.begin(), pieces.end(), content.begin()));
  r.will_read(0, 0);  // nothing announced: the reads below are judged on their own

  // Reads under 64 KiB go through the cache even when the bytes are not in it (past the 2 MiB
  // the reader's buffer holds).
  REQUIRE(test::drop_from_cache(path));
  const std::span<std::byte> small(block.start, 60000);
  const std::uint64_t small_at = (std::uint64_t{3} << 20) + 4096;
  got = record([&] { r.read(small_at, small); });
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0].o_direct);
  CHECK(std::equal(small.begin(), small.end(), content.begin() + static_cast<std::ptrdiff_t>(small_at)));

  // A file system that refuses the O_DIRECT read: the same bytes through the cache, and every
  // later read of that reader too.
  REQUIRE(test::drop_from_cache(path));
  const auto r2 = disk.open_reader("blob");
  refuse_o_direct = true;
  got = record([&] { r2.read(offset, out); });
  refuse_o_direct = false;
  REQUIRE(got.size() == 2);
  CHECK(got[0].o_direct);  // refused
  CHECK_FALSE(got[1].o_direct);
  CHECK(got[1].position == offset);
  CHECK_FALSE(r2.reads_direct());
  CHECK(std::equal(out.begin(), out.end(), content.begin() + static_cast<std::ptrdiff_t>(offset)));
}

TEST_CASE("posix reads small pieces of an announced range through the page cache 4 MiB at a time") {
  test::temp_dir dir;
  const auto path = dir.path() / "blob";
  const auto content = write_random_file(path, (std::size_t{9} << 20) + 1000, 15);
  ckpt::posix disk(dir.path(), {.direct_reads = false});  // as a memory tier's tmpfs, or any file system without O_DIRECT
  const auto r = disk.open_reader("blob");
  REQUIRE_FALSE(r.reads_direct());
  std::vector<std::byte> out(std::size_t{1} << 20);
  // Pieces of 1-60,000 bytes, one after another, over 9 MiB: three reads of up to 4 MiB, each
  // from the first piece the last did not hold whole, never past the range.
  const std::uint64_t from = 100, to = content.size();
  r.will_read(from, to - from);
  std::vector<std::byte> got_bytes;
  std::mt19937 g(3);
  const auto got = record([&] {
    for (std::uint64_t at = from; at < to;) {
      const auto n = std::min<std::uint64_t>(1 + g() % 60000, to - at);
      r.read(at, std::span(out).first(n));
      got_bytes.insert(got_bytes.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
      at += n;
    }
  });
  REQUIRE(got.size() == 3);
  CHECK(got[0].position == from);
  CHECK(got[0].bytes == std::size_t{4} << 20);
  CHECK(got[1].position > from);  // where the first piece its buffer did not hold starts
  CHECK(got[1].position <= from + (std::uint64_t{4} << 20));
  CHECK(got[2].position + got[2].bytes == to);
  CHECK(std::none_of(got.begin(), got.end(), [&](const call& c) { return c.o_direct || c.buffer == reinterpret_cast<std::uintptr_t>(out.data()); }));
  REQUIRE(got_bytes.size() == to - from);
  CHECK(std::equal(got_bytes.begin(), got_bytes.end(), content.begin() + static_cast<std::ptrdiff_t>(from)));

  // A read of 64 KiB or more, or one outside the range, goes straight into the caller's memory.
  auto direct = record([&] { r.read(200, std::span(out).first(65536)); });
  REQUIRE(direct.size() == 1);
  CHECK(direct[0].buffer == reinterpret_cast<std::uintptr_t>(out.data()));
  r.will_read(0, 0);
  direct = record([&] { r.read(300, std::span(out).first(100)); });
  REQUIRE(direct.size() == 1);
  CHECK(direct[0].buffer == reinterpret_cast<std::uintptr_t>(out.data()));
  CHECK(std::equal(out.begin(), out.begin() + 100, content.begin() + 300));

  // A range announced past the end of a file cut short: the piece past it is `corrupt`, naming
  // the file and where it ends; the pieces before it still read.
  std::filesystem::resize_file(path, 5000);
  const auto cut = disk.open_reader("blob");
  cut.will_read(0, 10000);
  cut.read(0, std::span(out).first(4000));
  CHECK(std::equal(out.begin(), out.begin() + 4000, content.begin()));
  try {
    cut.read(4000, std::span(out).first(2000));
    FAIL("read past the end");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(std::string(e.what()).find(path.string()) != std::string::npos);
    CHECK(std::string(e.what()).find("the file ends at 5000") != std::string::npos);
  }
}

TEST_CASE("a posix reader's O_DIRECT buffer is kept for the next reader, not mapped afresh at every load") {
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  const auto path = dir.path() / "blob";
  const auto content = write_random_file(path, std::size_t{1} << 20, 15);
  ckpt::posix disk(dir.path());
  auto& cache = ckpt::detail::huge_page_cache::io();  // the buffers' own: tables are not pushed out
  std::vector<std::byte> out(std::size_t{256} << 10);
  // Opens a reader, reads with O_DIRECT, closes it; returns the bytes kept while it was open.
  const auto read_once = [&] {
    REQUIRE(test::drop_from_cache(path));
    std::size_t kept_while_open = 0;
    {
      const auto r = disk.open_reader("blob");
      const auto got = record([&] { r.read(4096 + 100, out); });
      REQUIRE(got.size() == 1);
      CHECK(got[0].o_direct);
      CHECK(std::equal(out.begin(), out.end(), content.begin() + 4096 + 100));
      kept_while_open = cache.kept();
    }
    return kept_while_open;
  };
  const auto before = cache.kept();
  const auto while_first = read_once();
  const auto after_first = cache.kept();
  if (CKPT_UNDER_ASAN) {  // nothing is kept, so that AddressSanitizer still sees a use after free
    CHECK(after_first == before);
    return;
  }
  const auto buffer = after_first - while_first;  // the first reader's buffer, given back
  CHECK(buffer >= (std::size_t{4} << 20));
  CHECK(buffer % ckpt::detail::huge_page_bytes == 0);
  // The next reader takes a kept block instead of mapping one, and gives it back.
  CHECK(read_once() == after_first - buffer);
  CHECK(cache.kept() == after_first);
}

namespace {
/// Flips one bit of the byte at `position` in `file` (a damaged chunk).
void flip_byte(const std::filesystem::path& file, std::uint64_t position) {
  std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
  const auto pos = static_cast<std::streamoff>(position);
  f.seekg(pos);
  char c = 0;
  f.get(c);
  f.seekp(pos);
  f.put(static_cast<char>(c ^ 0x10));
}

/// One f32 tensor in memory the test places: page-aligned, or 64 bytes into a page.
struct placed_tensor {
  std::size_t bytes;
  test::page_block block;
  std::byte* data;
  placed_tensor(std::size_t n, std::size_t shift) : bytes(n), block(n + 4096), data(block.start + shift) {}
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::tensor_ref(ckpt::dtype::f32, {bytes / 4}, data));
  }
};
}  // namespace

TEST_CASE("a load from the disk reads each raw chunk with O_DIRECT reads of 4 MiB, not in 256 KiB pieces") {
  // The load reads and hashes a chunk in 256 KiB pieces; the checkpointer announces the chunk
  // to the posix reader (will_read), which reads it ahead in one O_DIRECT read.
  // Saved from page-aligned memory (chunks on block boundaries) and loaded into memory 64 bytes
  // into a page: not read in place, so through the reader's buffer.
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  const std::size_t bytes = std::size_t{9} << 20;  // chunks of 4, 4 and 1 MiB
  placed_tensor saved(bytes, 0), back(bytes, 64);
  std::mt19937 rng(15);
  test::fill_bytes(std::span<std::byte>(saved.data, bytes), rng);
  ckpt::checkpointer<> cp{{}, dir.path(), {.threads = 1}};
  cp.save(1, saved);
  const auto shard = dir.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt";
  REQUIRE(test::drop_from_cache(shard));
  const auto got = record([&] { cp.load(back); });
  CHECK(std::equal(back.data, back.data + bytes, saved.data));
  std::vector<std::size_t> direct_reads;
  for (const auto& c : got)
    if (c.o_direct) direct_reads.push_back(c.bytes);
  std::sort(direct_reads.begin(), direct_reads.end());  // the chunks are read on several workers at once
  CHECK(direct_reads == std::vector<std::size_t>{std::size_t{1} << 20, std::size_t{4} << 20, std::size_t{4} << 20});
  // Only the header, index and footer were read through the cache (with the kernel's readahead
  // around them), not the 2304 pages of the tensor.
  CHECK(test::resident_pages(shard) < 64);
}

TEST_CASE("a load into page-aligned tensors reads raw chunks from the disk straight into them, when asked to") {
  // With O_DIRECT and posix_options::read_in_place, the disk's transfer can land in the tensor
  // itself when the tensor's memory and the chunk's file offset are page-aligned: no aligned
  // buffer, no copy. The chunks are
  // then read and hashed in pieces of 4 MiB, and a partial block at a chunk's end comes
  // through the reader's aligned buffer.
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  const std::size_t bytes = (std::size_t{9} << 20) + 1000;  // chunks of 4 MiB, 4 MiB and 1 MiB + 1000 bytes
  placed_tensor saved(bytes, 0);
  std::mt19937 rng(16);
  test::fill_bytes(std::span<std::byte>(saved.data, bytes), rng);
  ckpt::checkpointer<> cp{{}, ckpt::posix(dir.path(), {.read_in_place = true}), {.threads = 2}};
  cp.save(1, saved);
  const auto shard = dir.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt";
  const auto same = [&](const placed_tensor& t) { return std::equal(t.data, t.data + bytes, saved.data); };

  placed_tensor back(bytes, 0);
  REQUIRE(test::drop_from_cache(shard));
  auto got = record([&] { cp.load(back); });
  CHECK(same(back));
  const auto at = [&](const call& c) { return c.buffer - reinterpret_cast<std::uintptr_t>(back.data); };
  const auto inside = [&](const call& c) { return c.buffer >= reinterpret_cast<std::uintptr_t>(back.data) && at(c) < bytes; };
  std::vector<call> into_tensor;
  for (const auto& c : got)
    if (inside(c)) into_tensor.push_back(c);
  std::sort(into_tensor.begin(), into_tensor.end(), [&](const call& a, const call& b) { return a.buffer < b.buffer; });
  REQUIRE(into_tensor.size() == 3);  // the partial block at the end: through the reader's buffer, in the same request
  const std::size_t mib = std::size_t{1} << 20;
  const std::vector<std::size_t> offsets{0, 4 * mib, 8 * mib}, sizes{4 * mib, 4 * mib, mib};
  for (std::size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(at(into_tensor[k]) == offsets[k]);
    CHECK(into_tensor[k].bytes == sizes[k]);
    CHECK(into_tensor[k].o_direct);
    CHECK(into_tensor[k].position - into_tensor[0].position == offsets[k]);  // one chunk after another in the file
  }
  // Every other read is of the file's header, index or footer.
  for (const auto& c : got)
    if (!inside(c)) CHECK(c.bytes < 64 * 1024);

  // A tensor 64 bytes into a page (as PyTorch aligns them) goes through the reader's buffer.
  placed_tensor shifted(bytes, 64);
  REQUIRE(test::drop_from_cache(shard));
  got = record([&] { cp.load(shifted); });
  CHECK(same(shifted));
  for (const auto& c : got)
    if (c.o_direct) CHECK((c.buffer + c.bytes <= reinterpret_cast<std::uintptr_t>(shifted.data) ||
                           c.buffer >= reinterpret_cast<std::uintptr_t>(shifted.data) + bytes));

  // A file system or memory that refuses O_DIRECT into the tensor: the same bytes, through the
  // page cache.
  placed_tensor refused(bytes, 0);
  REQUIRE(test::drop_from_cache(shard));
  refuse_o_direct = true;
  got = record([&] { cp.load(refused); });
  refuse_o_direct = false;
  CHECK(same(refused));

  // A flipped byte in the second chunk: the load names the file, the tensor and the chunk.
  flip_byte(shard, into_tensor[1].position + 12345);
  REQUIRE(test::drop_from_cache(shard));
  placed_tensor damaged(bytes, 0);
  try {
    cp.load(damaged);
    FAIL("a damaged chunk loaded");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    const std::string what = e.what();
    CHECK(what.find("model_optim_rng.ckpt") != std::string::npos);
    CAPTURE(what);
    CHECK(what.find("tensor 'w'") != std::string::npos);
    CHECK(what.find("checksum mismatch at offset " + std::to_string(into_tensor[1].position)) != std::string::npos);
  }
}

namespace {
/// The file offsets of the chunks of a shard file's first tensor, from its footer index.
std::vector<std::uint64_t> first_tensor_chunk_offsets(const std::filesystem::path& shard) {
  std::ifstream in(shard, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto bytes = std::as_bytes(std::span(c));
  using ckpt::detail::trailer_bytes;
  const auto t = ckpt::detail::check_trailer(bytes.last<trailer_bytes>(), bytes.size(), shard.string());
  const auto idx = ckpt::detail::decode_index(bytes.subspan(t.index_offset, t.index_size), shard.string());
  const auto& chunks = idx.tensors.at(0).chunks;
  return {chunks.file_offset.begin(), chunks.file_offset.begin() + static_cast<std::ptrdiff_t>(chunks.size())};
}
}  // namespace

TEST_CASE("a cold load reads runs of placed chunks through the reader's buffer in windows of 4 MiB, one request each") {
  // A tensor 64 bytes into its page, saved in placed chunks of 4 MiB (each 64 bytes into a
  // block): read in place, each chunk would be two requests, its 4 MiB and the block past them.
  // By default (posix_options::read_in_place off) a worker reads a run of chunks in windows of
  // 4 MiB one after the other into the reader's buffer, and copies out: with 2 reads in flight
  // the 20 MiB make runs of at most 10 MiB (an even share per worker): [0, 1], [2, 3], [4, 5].
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  const std::size_t mib = std::size_t{1} << 20, bytes = 20 * mib + 1000;  // chunks of 4 MiB, and one of 1000 bytes
  placed_tensor saved(bytes, 64), back(bytes, 64);
  std::mt19937 rng(41);
  test::fill_bytes(std::span<std::byte>(saved.data, bytes), rng);
  ckpt::checkpointer<> cp{{}, ckpt::posix(dir.path(), {.reads_in_flight = 2}), {.threads = 2}};
  cp.save(1, saved);
  const auto shard = dir.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt";
  const auto offsets = first_tensor_chunk_offsets(shard);
  REQUIRE(offsets.size() == 6);
  CHECK(offsets[0] == 4096 + 64);
  REQUIRE(test::drop_from_cache(shard));
  const auto got = record([&] { cp.load(back); });
  CHECK(std::equal(back.data, back.data + bytes, saved.data));
  std::vector<call> direct;
  for (const auto& c : got) {
    CHECK((c.buffer + c.bytes <= reinterpret_cast<std::uintptr_t>(back.data) ||
           c.buffer >= reinterpret_cast<std::uintptr_t>(back.data) + bytes));  // never into the tensor
    if (c.o_direct) direct.push_back(c);
  }
  direct = by_position(direct);
  // Each run: 4 MiB windows from the block that holds its first byte, then the block that holds
  // its last, from which the next run starts where the same worker reads it (so 7 or 8 requests,
  // depending on which worker reads which run).
  const std::uint64_t first = 4096, end = (offsets[5] + 1000 + 4095) / 4096 * 4096;
  std::size_t whole = 0;
  std::uint64_t covered = first;
  for (const auto& c : direct) {
    CAPTURE(c.position);
    CHECK(c.position % 4096 == 0);
    CHECK(c.bytes % 4096 == 0);
    CHECK(c.bytes <= 4 * mib);
    CHECK(c.position <= covered);  // no byte skipped
    covered = std::max<std::uint64_t>(covered, c.position + c.bytes);
    if (c.bytes == 4 * mib) ++whole;
  }
  CHECK(covered == end);
  CHECK(whole == 5);
  CHECK(direct.size() >= 6);
  CHECK(direct.size() <= 8);  // read in place: 11 (two per placed chunk, and the last one)
}

TEST_CASE("a tensor 64 bytes into its page is saved as far into a block, and, when asked, its whole pages move from disk to tensor and from tensor to disk with no copy") {
  // O_DIRECT moves page-aligned memory at block-aligned file offsets only. PyTorch's tensors
  // (and this one) start 64 bytes into a page: a save (place_for_memory, the default) places each
  // large raw chunk 64 bytes into a block, and a load into memory that lies the same way reads its whole pages straight into
  // it where posix_options::read_in_place asks for that; only the partial pages at a chunk's
  // ends come through the reader's aligned buffer. The
  // save copies the tensor into its buffers, unless posix_options::write_unaligned_in_place says
  // to write the whole pages from the tensor itself: the same file either way.
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  const std::size_t mib = std::size_t{1} << 20, bytes = 10 * mib + 1000;  // chunks of 4 MiB, 4 MiB and 2 MiB + 1000 bytes
  const std::size_t whole_pages = 10 * mib - 3 * 4096;  // of the three chunks, less a partial page at each end
  placed_tensor saved(bytes, 64);
  std::mt19937 rng(19);
  test::fill_bytes(std::span<std::byte>(saved.data, bytes), rng);
  const auto same = [&](const placed_tensor& t) { return std::equal(t.data, t.data + bytes, saved.data); };
  const auto inside = [](const placed_tensor& t, const call& c) {
    return c.buffer >= reinterpret_cast<std::uintptr_t>(t.data) && c.buffer < reinterpret_cast<std::uintptr_t>(t.data) + t.bytes;
  };
  // Bytes the recorded calls moved straight between the disk and `t`: only with O_DIRECT, only
  // from a page boundary.
  const auto moved_with = [&](const placed_tensor& t, const std::vector<call>& calls) {
    std::size_t n = 0;
    for (const auto& c : calls)
      if (inside(t, c)) {
        CHECK(c.o_direct);
        CHECK(c.buffer % 4096 == 0);
        n += c.bytes;
      }
    return n;
  };
  ckpt::checkpointer<> cp{{}, ckpt::posix(dir.path(), {.read_in_place = true}), {.threads = 2}};  // placed by default
  auto writes = record([&] { cp.save(1, saved); });
  const auto shard = dir.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt";
  const auto offsets = first_tensor_chunk_offsets(shard);
  REQUIRE(offsets.size() == 3);
  CHECK(offsets == std::vector<std::uint64_t>{4096 + 64, 4096 + 64 + 4 * mib, 4096 + 64 + 8 * mib});  // no padding between
  CHECK(moved_with(saved, writes) == 0);  // by default, memory that is not page-aligned is copied
  {
    test::temp_dir other;  // place_for_memory turned off: on block boundaries, as before 2026-12-05
    ckpt::checkpointer<> plain{{}, other.path(), {.threads = 2, .place_for_memory = false}};
    plain.save(1, saved);
    CHECK(first_tensor_chunk_offsets(other.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt") ==
          std::vector<std::uint64_t>{4096, 4096 + 4 * mib, 4096 + 8 * mib});
  }
  {
    test::temp_dir other;
    ckpt::checkpointer<> in_place{{}, ckpt::posix(other.path(), {.write_unaligned_in_place = true}), {.threads = 2}};
    writes = record([&] { in_place.save(1, saved); });
    CHECK(first_tensor_chunk_offsets(other.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt") == offsets);
    CHECK(moved_with(saved, writes) == whole_pages);
    CHECK(test::file_bytes(other.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt") == test::file_bytes(shard));
  }

  placed_tensor back(bytes, 64);
  REQUIRE(test::drop_from_cache(shard));
  auto got = record([&] { cp.load(back); });
  CHECK(same(back));
  CHECK(moved_with(back, got) == whole_pages);  // the partial pages came through the reader's buffer

  // Memory that lies otherwise (page-aligned): the same bytes, through the reader's buffer.
  placed_tensor aligned(bytes, 0);
  REQUIRE(test::drop_from_cache(shard));
  got = record([&] { cp.load(aligned); });
  CHECK(same(aligned));
  for (const auto& c : got) CHECK_FALSE((c.o_direct && inside(aligned, c)));

  // save_async writes from a snapshot that lies in its pages as the tensor does: the same placement.
  cp.save_async(2, saved).wait();
  CHECK(first_tensor_chunk_offsets(dir.path() / "global_step2/mp_rank_00/model_optim_rng.ckpt") == offsets);

  // A flipped byte in the partial page at the start of the second chunk, which a load copies
  // from its buffer: still verified, the file, tensor and chunk named.
  flip_byte(shard, offsets[1] + 10);
  REQUIRE(test::drop_from_cache(shard));
  placed_tensor damaged(bytes, 64);
  try {
    cp.load(damaged, {.tag = "global_step1"});
    FAIL("a damaged chunk loaded");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find("model_optim_rng.ckpt") != std::string::npos);
    CHECK(what.find("tensor 'w'") != std::string::npos);
    CHECK(what.find("checksum mismatch at offset " + std::to_string(offsets[1])) != std::string::npos);
  }
}

namespace {
/// ckpt::posix, recording what a load asks its readers for (which buffer, how many bytes).
struct read_call {
  std::uintptr_t buffer;
  std::size_t bytes;
};
std::mutex read_calls_mu;
std::vector<read_call> read_calls;
struct logging_posix : ckpt::posix {
  using ckpt::posix::posix;
  struct reader {
    ckpt::posix::reader inner;
    void read(std::uint64_t offset, std::span<std::byte> out) const {
      {
        std::lock_guard lock(read_calls_mu);
        read_calls.push_back({reinterpret_cast<std::uintptr_t>(out.data()), out.size()});
      }
      inner.read(offset, out);
    }
    void will_read(std::uint64_t offset, std::uint64_t bytes) const noexcept { inner.will_read(offset, bytes); }
    bool reads_in_place(std::uint64_t offset, std::span<const std::byte> out) const { return inner.reads_in_place(offset, out); }
  };
  reader open_reader(std::string_view key) const { return {ckpt::posix::open_reader(key)}; }
};
/// A [3072, 1024] f32 tensor, whole; and its rows [512, 2560).
struct whole_tensor {
  std::byte* data;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::tensor_ref(ckpt::dtype::f32, {3072, 1024}, data));
  }
};
struct row_slice {
  std::byte* data;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::tensor_ref(ckpt::dtype::f32, {2048, 1024}, data).sharded({.global_shape = {3072, 1024}, .offset = {512, 0}}));
  }
};
}  // namespace

TEST_CASE("a resharded load reads the chunks it needs only in part into load buffers, straight from the disk") {
  // A slice of rows [512, 2560) of a [3072, 1024] f32 tensor saved whole in chunks of 1024 rows
  // (4 MiB): the middle chunk lands in the slice whole and is read into it; the first and last
  // are needed in part, so each is read whole into a load buffer, verified there, and its rows
  // copied out. Those buffers lie as far into a page as the chunk into its block in the file
  // (the save placed it as far into a block as the tensor lay into its page), so the disk fills
  // them without the reader's aligned buffer and its copy where posix_options::read_in_place asks
  // for that: one read of 4 MiB each, not 16 of 256 KiB. The tensors are page-aligned, or 64 bytes into a page at save and at load, as
  // PyTorch's are (placed for their memory, as saves are by default).
  for (const std::size_t shift : {std::size_t{0}, std::size_t{64}}) {
    CAPTURE(shift);
    test::temp_dir dir;
    if (!test::o_direct_testable(dir)) return;
    const std::uint64_t rows = 3072, cols = 1024, row_bytes = cols * 4;
    test::page_block whole(rows * row_bytes + 4096);
    std::mt19937 rng(18);
    test::fill_bytes(std::span<std::byte>(whole.start + shift, rows * row_bytes), rng);
    whole_tensor saved{whole.start + shift};
    ckpt::checkpointer<ckpt::single_process, logging_posix> cp{{}, logging_posix(dir.path(), {.read_in_place = true}), {.threads = 2}};
    cp.save(1, saved);
    const std::uint64_t first = 512, count = 2048;
    test::page_block block(count * row_bytes + 4096);
    row_slice back{block.start + shift};
    REQUIRE(test::drop_from_cache(dir.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt"));
    {
      std::lock_guard lock(read_calls_mu);
      read_calls.clear();
    }
    const auto got = record([&] { cp.load(back); });
    CHECK(std::equal(back.data, back.data + count * row_bytes, whole.start + shift + first * row_bytes));
    const auto tensor = reinterpret_cast<std::uintptr_t>(back.data);
    std::vector<read_call> large;  // the chunks' reads; the others are of the header, index and footer
    for (const auto& c : read_calls)
      if (c.bytes >= 64 * 1024) large.push_back(c);
    REQUIRE(large.size() == 3);
    const std::size_t chunk = std::size_t{4} << 20;
    // The disk's transfer into such a buffer: its whole pages (all of it when page-aligned).
    const std::size_t head = (4096 - shift) % 4096, in_pages = shift == 0 ? chunk : chunk - 4096;
    std::size_t into_tensor = 0;
    for (const auto& c : large) {
      CHECK(c.bytes == chunk);  // each chunk in one read
      CHECK(c.buffer % 4096 == shift);
      if (c.buffer == tensor + (1024 - first) * row_bytes) ++into_tensor;  // the middle chunk, in place
      // ... and the disk's transfer went into that very buffer.
      CHECK(std::count_if(got.begin(), got.end(),
                          [&](const call& d) { return d.o_direct && d.buffer == c.buffer + head && d.bytes == in_pages; }) >= 1);
    }
    CHECK(into_tensor == 1);
  }
}

TEST_CASE("posix's reader reads in place only memory as far into its page as the offset into its block, from the disk, and reports a truncated file") {
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  const auto path = dir.path() / "blob";
  const auto content = write_random_file(path, (std::size_t{3} << 20) + 4096 + 500, 17);
  REQUIRE(test::drop_from_cache(path));
  ckpt::posix disk(dir.path(), {.read_in_place = true});
  const auto r = disk.open_reader("blob");
  test::page_block block(std::size_t{4} << 20);
  const std::size_t mib = std::size_t{1} << 20;
  const std::span<std::byte> aligned(block.start, 2 * mib);
  CHECK(r.reads_in_place(4096, aligned));
  CHECK_FALSE(r.reads_in_place(4096 + 512, aligned));                     // the offset
  CHECK_FALSE(r.reads_in_place(4096, std::span<std::byte>(block.start + 64, 2 * mib)));  // the memory
  CHECK_FALSE(r.reads_in_place(4096, aligned.first(mib - 4096)));          // too small: read ahead instead
  // Memory as far into its page as the offset is into its block: one O_DIRECT request, the whole
  // pages straight into it, the blocks that hold the partial pages at either end into the
  // reader's buffer.
  {
    const std::span<std::byte> shifted(block.start + 64, 2 * mib);
    REQUIRE(r.reads_in_place(4096 + 64, shifted));
    const auto calls = by_position(record([&] { r.read(4096 + 64, shifted); }));
    check_tiles(calls, 4096, 4096 + 2 * mib + 4096);  // whole blocks, from the one that holds the first byte
    REQUIRE(calls.size() == 3);
    for (const auto& c : calls) CHECK(c.o_direct);
    CHECK(calls[1].buffer == reinterpret_cast<std::uintptr_t>(block.start + 4096));
    CHECK(calls[1].bytes == 2 * mib - 4096);
    CHECK(calls[0].bytes == 4096);
    CHECK(calls[2].bytes == 4096);
    CHECK(std::equal(shifted.begin(), shifted.end(), content.begin() + 4096 + 64));
    CHECK(test::resident_pages(path) == 0);
  }
  auto got = record([&] { r.read(4096, aligned); });
  check_direct(got, reinterpret_cast<std::uintptr_t>(aligned.data()), 4096, 2 * mib);
  CHECK(got[0].o_direct);
  CHECK(std::equal(aligned.begin(), aligned.end(), content.begin() + 4096));
  CHECK(test::resident_pages(path) == 0);

  // Cached bytes are read through the cache.
  {
    std::ifstream warm(path, std::ios::binary);
    std::vector<char> sink(content.size());
    warm.read(sink.data(), static_cast<std::streamsize>(sink.size()));
  }
  CHECK_FALSE(r.reads_in_place(4096, aligned));
  got = record([&] { r.read(4096, aligned); });
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0].o_direct);
  CHECK(std::equal(aligned.begin(), aligned.end(), content.begin() + 4096));

  // A file that shrinks while it is read (its size was taken when the reader first asked
  // what is cached): `corrupt`, naming the file and where it now ends, whether the end falls in
  // the whole blocks read in place or in the partial block after them.
  const auto truncated = [&](std::uint64_t ends_at) {
    {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
    }
    REQUIRE(test::drop_from_cache(path));
    const auto shrinking = disk.open_reader("blob");
    const std::span<std::byte> out(block.start, content.size() - 2 * mib);  // to the end of the file
    REQUIRE(shrinking.reads_in_place(2 * mib, out));
    std::filesystem::resize_file(path, ends_at);
    try {
      shrinking.read(2 * mib, out);
      FAIL("read past the end");
    } catch (const ckpt::error& e) {
      CHECK(e.kind() == ckpt::error_kind::corrupt);
      const std::string what = e.what();
      CHECK(what.find(path.string() + " is truncated") != std::string::npos);
      CHECK(what.find("the file ends at " + std::to_string(ends_at)) != std::string::npos);
    }
  };
  truncated(2 * mib + mib / 2);            // in the whole blocks
  truncated(content.size() - 300);         // in the partial block after them
}

TEST_CASE("posix's reader keeps the bytes it read ahead while it reads in place, and serves them again without a read") {
  // An in-place read brings the partial pages at either end of its memory into blocks of the
  // reader's own that lie past its read-ahead area, so what was read ahead stays valid.
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  const std::size_t mib = std::size_t{1} << 20;
  const auto path = dir.path() / "blob";
  const auto content = write_random_file(path, 8 * mib, 29);
  REQUIRE(test::drop_from_cache(path));
  ckpt::posix disk(dir.path(), {.read_in_place = true});
  const auto r = disk.open_reader("blob");
  std::vector<std::byte> piece(64 * 1024);
  r.will_read(0, 6 * mib);
  auto got = record([&] { r.read(0, piece); });  // reads 4 MiB ahead, with O_DIRECT
  REQUIRE(got.size() == 1);
  CHECK(got[0].o_direct);
  CHECK(got[0].bytes == 4 * mib);
  CHECK(std::equal(piece.begin(), piece.end(), content.begin()));

  test::page_block block(2 * mib);
  const std::span<std::byte> shifted(block.start + 64, mib);  // partial pages at both ends
  REQUIRE(r.reads_in_place(5 * mib + 64, shifted));
  got = record([&] { r.read(5 * mib + 64, shifted); });
  REQUIRE(got.size() == 3);  // one preadv, recorded per part: the two partial blocks and the whole pages between
  for (const auto& c : got) CHECK(c.o_direct);
  CHECK(std::equal(shifted.begin(), shifted.end(), content.begin() + 5 * mib + 64));

  // Read ahead before the in-place read: no system call, and the same bytes (the first of them
  // sat where the in-place read's partial blocks had gone before).
  piece.assign(piece.size(), std::byte{0});
  got = record([&] { r.read(0, piece); });
  CHECK(got.empty());
  CHECK(std::equal(piece.begin(), piece.end(), content.begin()));
  got = record([&] { r.read(mib, piece); });
  CHECK(got.empty());
  CHECK(std::equal(piece.begin(), piece.end(), content.begin() + mib));
  got = record([&] { r.read(4 * mib - piece.size(), piece); });  // the last of it
  CHECK(got.empty());
  CHECK(std::equal(piece.begin(), piece.end(), content.begin() + 4 * mib - piece.size()));
}

namespace {
struct many_small {
  std::vector<std::vector<float>> w = std::vector<std::vector<float>>(300, std::vector<float>(2048));  // 8 KiB each
  template <class V>
  void checkpoint(V& v) {
    for (std::size_t i = 0; i < w.size(); ++i) v.tensor("expert." + std::to_string(i), w[i]);
  }
};

/// `saved` (random values) saved to `dir` by `cp`, and its shard file, dropped from the page
/// cache; `back` zeroed, to load into.
std::filesystem::path save_many_small(const test::temp_dir& dir, ckpt::checkpointer<>& cp, many_small& saved, many_small& back) {
  for (std::size_t i = 0; i < saved.w.size(); ++i) test::fill_random(saved.w[i], static_cast<unsigned>(i));
  for (auto& t : back.w) std::fill(t.begin(), t.end(), 0.f);
  cp.save(1, saved);
  auto shard = dir.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt";
  REQUIRE(test::drop_from_cache(shard));
  return shard;
}
}  // namespace

TEST_CASE("a load from the disk reads small tensors saved one after another as runs of O_DIRECT reads") {
  // 300 chunks of 8 KiB, each too small for O_DIRECT alone: the chunk reader hands them out in
  // runs of up to 4 MiB, announced as a whole, so the reader fetches each run in one O_DIRECT
  // read and nothing of the tensors passes through the page cache.
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  many_small saved, back;
  ckpt::checkpointer<> cp{{}, dir.path(), {.threads = 2}};
  const auto shard = save_many_small(dir, cp, saved, back);
  const auto got = record([&] { cp.load(back); });
  CHECK(back.w == saved.w);
  const auto direct = std::count_if(got.begin(), got.end(), [](const call& c) { return c.o_direct; });
  CHECK(direct >= 1);
  CHECK(direct <= 2);  // 300 x 8 KiB in one run of 2.4 MiB (two if a read was split)
  CHECK(test::resident_pages(shard) < 64);  // header, index and footer with the kernel's readahead
}

TEST_CASE("a run of small chunks whose start is in the page cache is still read with O_DIRECT") {
  // Chunks at the start of a run may be cached before the load reads them: another reader's,
  // or what the kernel read ahead after the file's header was read through the cache. Were
  // each such chunk read through the cache, every read would have the kernel read further
  // ahead, the next chunk would be cached by the time it is asked for, and the whole run would
  // pass through the page cache (the test above failed that way when the load came late).
  // Here the first 128 KiB are read (with the kernel's readahead) before the load.
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  many_small saved, back;
  ckpt::checkpointer<> cp{{}, dir.path(), {.threads = 2}};
  const auto shard = save_many_small(dir, cp, saved, back);
  {
    std::ifstream f(shard, std::ios::binary);
    std::vector<char> start(128 * 1024);
    f.read(start.data(), static_cast<std::streamsize>(start.size()));
  }
  REQUIRE(test::resident_pages(shard) >= 32);
  const auto got = record([&] { cp.load(back); });
  CHECK(back.w == saved.w);
  const auto direct = std::count_if(got.begin(), got.end(), [](const call& c) { return c.o_direct; });
  CHECK(direct >= 1);
  // What was cached, the kernel's readahead after it, and the footer: not the 600 pages of the file.
  CHECK(test::resident_pages(shard) < 300);
}

TEST_CASE("a posix writer told the file's size allocates it once and has nothing to cut off") {
  // ext4 waits for the O_DIRECT writes in flight before each fallocate, and cutting off space
  // allocated past the end can take a large share of a save: a reserved file needs neither.
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  ckpt::posix disk(dir.path());
  constexpr std::size_t mib = std::size_t{1} << 20;
  const std::size_t size = 9 * mib + 3 * 4096 + 100;
  std::vector<std::byte> src(size);
  std::mt19937 rng(21);
  test::fill_bytes(src, rng);
  const auto write_reserved = [&](const char* name, std::uint64_t reserved) {
    auto w = disk.create(name);
    const auto got = record([&] {
      w.reserve(reserved);
      w.write(std::span(src).first(5000));
      w.write(std::span(src).subspan(5000));
      w.sync();
    });
    w.publish();
    const auto file = test::file_bytes(dir.path() / name);
    REQUIRE(file.size() == size);
    CHECK(std::memcmp(file.data(), src.data(), size) == 0);
    std::lock_guard lock(calls_mu);
    return space_calls;
  };
  SUBCASE("reserved exactly: one allocation, of the whole file, and no cut") {
    const auto got = write_reserved("exact", size);
    REQUIRE(got.size() == 1);
    CHECK_FALSE(got[0].truncate);
    CHECK(got[0].offset == 0);
    CHECK(got[0].length == size);
  }
  SUBCASE("reserved too much: what was not written is cut off") {
    const auto got = write_reserved("more", size + 5 * mib);
    REQUIRE(got.size() == 2);
    CHECK(got[0].length == size + 5 * mib);
    CHECK(got[1].truncate);
    CHECK(got[1].length == size);
  }
  SUBCASE("reserved too little: allocated ahead beyond it as the writes go") {
    const auto got = write_reserved("less", 2 * mib);
    REQUIRE(got.size() >= 2);
    CHECK(got[0].length == 2 * mib);
    CHECK(got[1].offset == 2 * mib);
  }
  SUBCASE("a reservation that fails part-way leaves nothing past the end either") {
    // fallocate may allocate part of the range, and move the file's end, before it fails.
    struct running_out {
      running_out() { fallocate_runs_out = true; }
      ~running_out() { fallocate_runs_out = false; }
    };
    std::vector<space_call> got;
    {
      running_out guard;
      got = write_reserved("failed", 4 * size);  // half of it: twice the file's size
    }
    REQUIRE_FALSE(got.empty());
    CHECK(got.back().truncate);
    CHECK(got.back().length == size);
  }
  SUBCASE("without O_DIRECT, nothing is allocated") {
    ckpt::posix buffered(dir.path(), {.direct_writes = false});
    auto w = buffered.create("buffered");
    const auto got = record([&] {
      w.reserve(size);
      w.write(src);
      w.sync();
    });
    w.publish();
    std::lock_guard lock(calls_mu);
    CHECK(space_calls.empty());
    CHECK(test::file_bytes(dir.path() / "buffered").size() == size);
  }
}

namespace {
struct raw_and_small {
  placed_tensor big{(std::size_t{6} << 20) + 2052, 64};  // two chunks, the second not whole blocks
  std::vector<float> small = std::vector<float>(300);      // packed after it
  std::uint64_t step = 7;
  template <class V>
  void checkpoint(V& v) {
    big.checkpoint(v);
    v.tensor("small", small);
    v.value("step", step);
  }
};
}  // namespace

TEST_CASE("a save of raw chunks allocates its shard file once, up to its footer index, and cuts nothing off") {
  test::temp_dir dir;
  if (!test::o_direct_testable(dir)) return;
  raw_and_small saved;
  std::mt19937 rng(22);
  test::fill_bytes(std::span<std::byte>(saved.big.data, saved.big.bytes), rng);
  test::fill_random(saved.small, 23);
  ckpt::checkpointer<> cp{{}, dir.path(), {.threads = 2}};
  record([&] { cp.save(1, saved); });
  std::vector<space_call> got;
  {
    std::lock_guard lock(calls_mu);
    got = space_calls;
  }
  const auto shard = dir.path() / "global_step1/mp_rank_00/model_optim_rng.ckpt";
  const auto file = test::file_bytes(shard);
  REQUIRE(file.size() > ckpt::detail::trailer_bytes);
  const auto trailer = ckpt::detail::check_trailer(
      std::span<const std::byte, ckpt::detail::trailer_bytes>(
          reinterpret_cast<const std::byte*>(file.data()) + file.size() - ckpt::detail::trailer_bytes,
          ckpt::detail::trailer_bytes),
      file.size(), shard.string());
  // The shard file's one allocation covers header, chunks and values: the footer index and
  // trailer, written last, extend it.
  std::vector<space_call> on_shard;
  for (const auto& c : got)
    if (c.file.find("model_optim_rng.ckpt") != std::string::npos) on_shard.push_back(c);
  REQUIRE(on_shard.size() == 1);
  CHECK_FALSE(on_shard[0].truncate);
  CHECK(on_shard[0].offset == 0);
  CHECK(on_shard[0].length == trailer.index_offset);
  for (const auto& c : got) CHECK_FALSE(c.truncate);  // no file had space to cut off
  raw_and_small back;
  back.step = 0;
  cp.load(back);
  CHECK(std::equal(back.big.data, back.big.data + back.big.bytes, saved.big.data));
  CHECK(back.small == saved.small);
  CHECK(back.step == 7);
}
