// Which buffer ckpt::posix (and the safetensors reader and writer) hands the kernel: its own
// bounce buffer for copies in the slow window (detail/page_copy.hpp), the caller's buffer
// otherwise. The bytes are the same either way (the unit suite checks them), so only the system
// calls can tell the two paths apart: this binary replaces pread, pwrite and write with wrappers
// that record the buffer and file position of each call and then make the system call
// themselves. It is its own executable because the wrappers replace those functions for
// everything linked into it.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <ckpt/interop/safetensors.hpp>
#include <ckpt/posix.hpp>

#include "helpers.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <fstream>
#include <new>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace {

struct call {
  std::uintptr_t buffer;
  std::size_t bytes;
  std::uint64_t position;  // in the file
};
bool recording = false;
std::vector<call> calls;

/// Records the calls `f` makes.
template <class F>
std::vector<call> record(F&& f) {
  calls.clear();
  recording = true;
  f();
  recording = false;
  return calls;
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

}  // namespace

extern "C" ssize_t pread(int fd, void* buffer, size_t bytes, off_t offset) {
  if (recording) calls.push_back({reinterpret_cast<std::uintptr_t>(buffer), bytes, static_cast<std::uint64_t>(offset)});
  return ::syscall(SYS_pread64, fd, buffer, bytes, offset);
}

extern "C" ssize_t pwrite(int fd, const void* buffer, size_t bytes, off_t offset) {
  if (recording) calls.push_back({reinterpret_cast<std::uintptr_t>(buffer), bytes, static_cast<std::uint64_t>(offset)});
  return ::syscall(SYS_pwrite64, fd, buffer, bytes, offset);
}

extern "C" ssize_t write(int fd, const void* buffer, size_t bytes) {
  if (recording) {
    const auto position = ::lseek(fd, 0, SEEK_CUR);
    calls.push_back({reinterpret_cast<std::uintptr_t>(buffer), bytes, static_cast<std::uint64_t>(position)});
  }
  return ::syscall(SYS_write, fd, buffer, bytes);
}

TEST_CASE("posix reads into a buffer just past the file offset through the bounce buffer, others directly") {
  test::temp_dir dir;
  std::vector<std::byte> content(std::size_t{300} * 1024);
  std::mt19937 rng(5);
  for (auto& b : content) b = static_cast<std::byte>(rng());
  {
    std::ofstream f(dir.path() / "blob", std::ios::binary);
    f.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
  }
  ckpt::posix disk(dir.path());
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
      if (in_window(distance)) {
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
  test::temp_dir dir;
  ckpt::posix disk(dir.path());
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
    for (auto& b : src) b = static_cast<std::byte>(rng());
    auto got = record([&] { w->write(src); });
    REQUIRE(got.size() >= 2);
    CHECK(got[0].bytes == 7);  // the gathered bytes, flushed first
    CHECK(got[0].position == position - 7);
    got.erase(got.begin());
    const auto user = reinterpret_cast<std::uintptr_t>(src.data());
    if (in_window(distance)) {
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
  namespace st = ckpt::interop;
  test::temp_dir dir;
  const auto path = dir.path() / "model.safetensors";
  const std::size_t n = 51200 + 3;  // floats: 200 KiB and 12 bytes
  const std::size_t bytes = n * sizeof(float);
  test::page_block block(bytes + 8192);
  std::mt19937 rng(8);
  std::vector<std::byte> want(bytes);
  for (auto& b : want) b = static_cast<std::byte>(rng());
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
      if (in_window(distance)) {
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
    if (in_window(distance)) {
      check_bounced(got, reinterpret_cast<std::uintptr_t>(out.data()), bytes, false);
    } else {
      check_direct(got, reinterpret_cast<std::uintptr_t>(out.data()), position, bytes);
    }
    CHECK(std::equal(out.begin(), out.end(), want.begin()));
  }
}
