// A real full disk: mounts a small tmpfs (needs root, or CAP_SYS_ADMIN), commits a checkpoint
// on it, then fills the file system to leave 0, 4, 8, ... KiB free and saves again at each
// level, so ENOSPC strikes every step of a save in turn: the shard file's chunks, its index,
// chunk_map.bin, metadata.json, `latest`. At every level:
//   - the save either fits, or fails with an `io` error that names the file and says why;
//   - `latest` still loads and holds exactly the last committed state, and no tag is partial;
//   - once space is freed, the next save succeeds and leaves no temporary file behind.
// Exits 77 (skipped, with the reason) where mounting is not allowed.
//
//   full_disk [--max-free-kib 320] [--step-kib 4]

#include <ckpt/ckpt.hpp>

#include "leftovers.hpp"

#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct state {
  std::vector<float> w = std::vector<float>(48 * 1024);  // 192 KiB, in 64 KiB chunks
  std::vector<std::int64_t> counts = std::vector<std::int64_t>(1000);
  std::uint64_t step = 0;
  void set(std::uint64_t it) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((it * 977 + i) % 65521);
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = static_cast<std::int64_t>(it * i);
    step = it;
  }
  bool operator==(const state&) const = default;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", w);
    v.group("optimizer", [&](auto& g) { g.tensor("counts", counts); });
    v.value("step", step);
  }
};

using checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::posix>;

std::uint64_t free_bytes(const fs::path& p) {
  struct statvfs s{};
  if (::statvfs(p.c_str(), &s) != 0) return 0;
  return static_cast<std::uint64_t>(s.f_bavail) * s.f_frsize;
}

/// Writes zeros to `file` until only `leave` bytes are free (or the disk is full).
void fill(const fs::path& file, const fs::path& mount, std::uint64_t leave) {
  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (!f) return;
  static const std::vector<char> zeros(4096, 0);
  while (free_bytes(mount) > leave) {
    if (std::fwrite(zeros.data(), 1, zeros.size(), f) != zeros.size() || std::fflush(f) != 0) break;
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t max_free_kib = 320, step_kib = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--max-free-kib") max_free_kib = std::stoull(v);
    else if (a == "--step-kib") step_kib = std::stoull(v);
    else return std::fprintf(stderr, "unknown option %s\n", a.c_str()), 2;
  }
  char tmpl[] = "/tmp/ckpt-full-disk-XXXXXX";
  if (!::mkdtemp(tmpl)) return std::perror("mkdtemp"), 1;
  const fs::path mount = tmpl;
  if (::mount("tmpfs", mount.c_str(), "tmpfs", 0, "size=4m") != 0) {
    std::printf("full disk: skipped: cannot mount a tmpfs at %s (%s); run as root to test a real full disk\n",
                mount.c_str(), std::strerror(errno));
    fs::remove(mount);
    return 77;
  }
  int levels = 0, fitted = 0, failed = 0;
  std::string problem;
  const fs::path root = mount / "ckpt", filler = mount / "filler";
  for (std::uint64_t kib = 0; kib <= max_free_kib && problem.empty(); kib += step_kib, ++levels) {
    fs::remove_all(root);
    fs::remove(filler);
    state s;
    {
      checkpointer cp{{}, root, {.chunk_bytes = 64 * 1024}};
      s.set(1);
      cp.save(1, s);  // the last good checkpoint
    }
    fill(filler, mount, kib * 1024);
    std::uint64_t committed = 1;
    {
      checkpointer cp{{}, root, {.chunk_bytes = 64 * 1024}};
      s.set(2);
      try {
        cp.save(2, s);
        committed = 2;
        ++fitted;
      } catch (const ckpt::error& e) {
        ++failed;
        const std::string what = e.what();
        if (e.kind() != ckpt::error_kind::io || what.find(root.string()) == std::string::npos ||
            what.find("No space left") == std::string::npos)
          problem = "with " + std::to_string(kib) + " KiB free the save failed with an unclear error: [" +
                    std::string(ckpt::to_string(e.kind())) + "] " + what;
      }
    }
    if (!problem.empty()) break;
    // The last committed state loads, exactly; no committed tag is partial.
    {
      checkpointer cp{{}, root};
      for (const auto& tag : cp.tags()) {
        state got, want;
        want.set(tag.iteration);
        cp.load(got, {.tag = tag.tag});
        if (!(got == want)) problem = tag.tag + " does not hold what was saved, with " + std::to_string(kib) + " KiB free";
      }
      state got, want;
      want.set(committed);
      const auto r = cp.load(got);
      if (r.iteration != committed || !(got == want))
        problem = "latest does not hold iteration " + std::to_string(committed) + " with " + std::to_string(kib) + " KiB free";
    }
    // Space freed: the next save works and cleans up after the failed one.
    fs::remove(filler);
    {
      checkpointer cp{{}, root};
      s.set(3);
      cp.save(3, s);
      state got;
      if (cp.load(got).iteration != 3 || !(got == s)) problem = "the save after freeing space does not load";
    }
    if (const auto left = crash::leftover(root); !left.empty() && problem.empty())
      problem = "a failed save's leftover remained after the next save: " + left;
  }
  ::umount(mount.c_str());
  fs::remove(mount);
  if (!problem.empty()) {
    std::fprintf(stderr, "full disk: %s\n", problem.c_str());
    return 1;
  }
  std::printf("full disk: %d fill levels (0 to %llu KiB free): %d saves fitted, %d failed with a clear ENOSPC error "
              "naming the file; the last good checkpoint loaded exactly every time, 0 damaged\n",
              levels, static_cast<unsigned long long>(max_free_kib), fitted, failed);
  return failed > 0 ? 0 : 1;  // a campaign in which the disk never filled tested nothing
}
