#pragma once
// The benchmarks' model-like state and their raw-I/O baselines (save_load, save_vs_raw).
//
// Workloads (values from N(0, 0.02), like initialised weights):
//   fp32       200 fp32 tensors sized like a transformer's (every eighth four times the others),
//              `gib` GiB in all;
//   bf16_adam  the same 200 tensors in bf16 plus fp32 Adam moments (exp_avg, exp_avg_sq) of
//              each, 2.5 × `gib` GiB in all.
//
// Tensor buffers are 64-byte aligned, as PyTorch's CPU allocator and most engines' allocators
// give them; a large one starts 64 bytes into its page. The kernel's copy out of the page cache
// runs 3x slower when the destination lies 1-31 bytes past the file offset modulo 4 KiB
// (ckpt/detail/page_copy.hpp), and the raw baselines must run at the speed the kernel allows.
// `shifted()` makes a copy whose buffers start `bytes` into a page, to measure ckpt on buffers
// like a std::vector's (16 bytes into a page, where its reads meet that window).

#include <ckpt/ckpt.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bench {

using clock_type = std::chrono::steady_clock;
inline double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

/// The median of a benchmark's runs (the upper of the two middle values for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "bench: %s\n", what.c_str());
  std::exit(1);
}

/// std::allocator with 64-byte alignment.
template <class T>
struct aligned64 {
  using value_type = T;
  aligned64() = default;
  template <class U>
  aligned64(const aligned64<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{64}); }
  friend bool operator==(const aligned64&, const aligned64&) { return true; }
};

/// One named tensor in its own buffer; its bytes start `shift` bytes into a 64-byte aligned block.
struct tensor_buf {
  std::string name;
  ckpt::dtype type{};
  ckpt::shape_t shape;
  std::vector<std::byte, aligned64<std::byte>> block;
  std::size_t shift = 0;

  std::byte* data() { return block.data() + shift; }
  const std::byte* data() const { return block.data() + shift; }
  std::size_t size() const { return block.size() - shift; }
};

struct state {
  std::vector<tensor_buf> tensors;
  std::uint64_t step = 0;
  template <class V>
  void checkpoint(V& v) {
    for (auto& t : tensors) v.tensor(t.name, ckpt::tensor_ref(t.type, t.shape, t.data()));
    v.value("step", step);
  }
  std::uint64_t bytes() const {
    std::uint64_t n = 0;
    for (const auto& t : tensors) n += t.size();
    return n;
  }
  bool same_bytes(const state& o) const {
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (!std::equal(tensors[i].data(), tensors[i].data() + tensors[i].size(), o.tensors[i].data())) return false;
    return true;
  }
};

inline void fill_normal(tensor_buf& t, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 0.02f);
  const auto n = t.size() / ckpt::size_of(t.type);
  if (t.type == ckpt::dtype::f32) {
    auto* p = reinterpret_cast<float*>(t.data());
    for (std::size_t i = 0; i < n; ++i) p[i] = d(g);
  } else {
    auto* p = reinterpret_cast<ckpt::bfloat16*>(t.data());
    for (std::size_t i = 0; i < n; ++i) p[i] = ckpt::bfloat16(d(g));
  }
}

/// The workload, filled by one thread per core.
inline state make_state(const std::string& workload, double gib) {
  std::vector<double> weight(200);
  double sum = 0;
  for (std::size_t i = 0; i < weight.size(); ++i) sum += weight[i] = (i % 8 == 0) ? 4.0 : (i % 8 < 4 ? 1.0 : 0.5);
  state s;
  auto add = [&](std::string name, ckpt::dtype type, std::uint64_t n) {
    auto& t = s.tensors.emplace_back();
    t.name = std::move(name);
    t.type = type;
    t.shape = {n / 1024, 1024};
    t.block.resize(n * ckpt::size_of(type));
  };
  for (std::size_t i = 0; i < weight.size(); ++i) {
    const auto n = static_cast<std::uint64_t>(weight[i] / sum * gib * (1u << 30) / 4) / 1024 * 1024;
    const auto base = "layers." + std::to_string(i / 8) + ".w" + std::to_string(i % 8);
    if (workload == "fp32") {
      add(base, ckpt::dtype::f32, n);
    } else if (workload == "bf16_adam") {
      add(base, ckpt::dtype::bf16, n);
      add("optimizer." + base + ".exp_avg", ckpt::dtype::f32, n);
      add("optimizer." + base + ".exp_avg_sq", ckpt::dtype::f32, n);
    } else {
      die("unknown workload " + workload);
    }
  }
  std::vector<std::thread> pool;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      for (std::size_t i = w; i < s.tensors.size(); i += threads) fill_normal(s.tensors[i], 1000 + i);
    });
  for (auto& t : pool) t.join();
  return s;
}

/// A copy of `s` whose buffers start `bytes` (under 4096) into a page.
inline state shifted(const state& s, std::size_t bytes) {
  state out;
  out.step = s.step;
  for (const auto& t : s.tensors) {
    auto& c = out.tensors.emplace_back();
    c.name = t.name, c.type = t.type, c.shape = t.shape;
    c.block.resize(t.size() + 4096 + bytes);
    c.shift = (4096 - reinterpret_cast<std::uintptr_t>(c.block.data()) % 4096) % 4096 + bytes;
    c.block.resize(c.shift + t.size());  // shrinking keeps the address
    std::copy(t.data(), t.data() + t.size(), c.data());
  }
  return out;
}

/// Calls `f` with `p`, or with every regular file under `p` when it is a directory.
template <class F>
void for_each_file(const std::filesystem::path& p, F&& f) {
  if (std::filesystem::is_directory(p)) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(p))
      if (e.is_regular_file()) f(e.path());
  } else {
    f(p);
  }
}

/// Drops a file, or every file under a directory, from the page cache (the pages are clean
/// after fsync), so the next read comes from the disk.
inline void drop_cache(const std::filesystem::path& p) {
  for_each_file(p, [](const std::filesystem::path& f) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  });
}

/// Reads every file under `p` (or `p` itself) through the page cache and throws the bytes away,
/// so that they are cached for a warm load. ckpt's own loads read uncached bytes with O_DIRECT
/// (posix_options::direct_reads), which leaves them uncached: a warm load needs this first.
inline void read_through_cache(const std::filesystem::path& p) {
  std::vector<char> sink(std::size_t{1} << 20);
  for_each_file(p, [&](const std::filesystem::path& f) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) die("open " + f.string());
    while (::read(fd, sink.data(), sink.size()) > 0) {
    }
    ::close(fd);
  });
}

/// The limit for saves: every tensor written in turn with write(2) into one new file, then
/// fsync. Returns the seconds spent inside write calls; callers time the whole.
inline double raw_write(const state& s, const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("open " + file.string());
  double in_write = 0;
  for (const auto& t : s.tensors) {
    std::size_t done = 0;
    const auto t0 = clock_type::now();
    while (done < t.size()) {
      const auto n = ::write(fd, t.data() + done, t.size() - done);
      if (n <= 0) die("write " + file.string());
      done += static_cast<std::size_t>(n);
    }
    in_write += since(t0);
  }
  if (::fsync(fd) != 0) die("fsync " + file.string());
  ::close(fd);
  return in_write;
}

/// `depth` buffers of `piece` bytes, 2 MiB aligned, in huge pages and touched once: the same
/// ones at every call with these sizes, so that the raw baselines below pay for no fresh memory
/// inside their timing (on this VM a fresh page costs tens of microseconds; ckpt's readers and
/// writers keep theirs in huge pages too).
inline std::vector<std::byte*> kept_buffers(std::size_t piece, unsigned depth) {
  static std::mutex m;
  static std::vector<std::pair<std::size_t, ckpt::detail::huge_page_buffer>> kept;  // per piece size
  const std::lock_guard lock(m);
  std::vector<std::byte*> out;
  for (auto& [size, b] : kept)
    if (size == piece && out.size() < depth) out.push_back(b.get());
  while (out.size() < depth) {
    auto& [size, b] = kept.emplace_back(piece, ckpt::detail::huge_page_memory(piece, piece));
    std::memset(b.get(), 0, piece);  // touched now, not inside a timed call
    out.push_back(b.get());
  }
  return out;
}

/// The same file written with O_DIRECT, the way posix_options::direct_writes does it, without
/// the checkpoint around it: the tensors copied one after another into an 8 MiB buffer aligned
/// to 4 KiB, each full buffer written with O_DIRECT, the last partial 4 KiB through the page
/// cache, then fsync. The limit for a save that bypasses the page cache.
inline void raw_write_direct(const state& s, const std::filesystem::path& file) {
  constexpr std::size_t block = 4096, buffer = std::size_t{8} << 20;
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) die("open with O_DIRECT " + file.string());
  auto* buf = kept_buffers(buffer, 1).front();  // 2 MiB aligned
  std::size_t filled = 0;
  auto put = [&](const std::byte* p, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      const auto w = ::write(fd, p + done, n - done);
      if (w <= 0) die("write " + file.string());
      done += static_cast<std::size_t>(w);
    }
  };
  for (const auto& t : s.tensors) {
    for (std::size_t at = 0; at < t.size();) {
      const auto n = std::min(buffer - filled, t.size() - at);
      std::memcpy(buf + filled, t.data() + at, n);
      filled += n;
      at += n;
      if (filled == buffer) put(buf, buffer), filled = 0;
    }
  }
  const auto whole = filled / block * block;
  put(buf, whole);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
  put(buf + whole, filled - whole);
  if (::fsync(fd) != 0) die("fsync " + file.string());
  ::close(fd);
}

/// The state's tensors one after another, as raw_write_direct writes them, moved in pieces by
/// several threads at once: what raw_write_verified and raw_read_verified share.
class in_pieces {
 public:
  explicit in_pieces(const state& s) {
    for (const auto& t : s.tensors) starts_.push_back(std::exchange(total_, total_ + t.size()));
  }
  std::uint64_t total() const noexcept { return total_; }

  /// The bytes [from, to) of the k-th of `parts` equal parts of the file, taken end to end (the
  /// last takes what the division leaves).
  std::pair<std::uint64_t, std::uint64_t> part(unsigned k, unsigned parts) const noexcept {
    return {total_ / parts * k, k + 1 == parts ? total_ : total_ / parts * (k + 1)};
  }

  /// Calls `f(tensor, at_in_tensor, at_in_piece, n)` for each run of `n` bytes of one tensor
  /// that the file's bytes [from, to) hold.
  template <class F>
  void for_each_part(std::uint64_t from, std::uint64_t to, F&& f) const {
    auto t = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), from) - starts_.begin() - 1);
    for (std::uint64_t at = from; at < to; ++t) {
      const auto n = std::min(to, t + 1 < starts_.size() ? starts_[t + 1] : total_) - at;
      f(t, at - starts_[t], at - from, n);
      at += n;
    }
  }

  /// Cuts the file into pieces of `piece` bytes for `depth` threads, each with a 2 MiB-aligned
  /// buffer of that size, and calls `work(from, to, buffer, hash)` for each piece [from, to);
  /// `hash(n)` hashes the buffer's first n bytes with XXH3 in 256 KiB parts, as ckpt checksums
  /// chunks. The buffers are kept_buffers: a baseline that paid for 64 MB of fresh pages at
  /// every call would be no limit.
  template <class Work>
  void run(std::size_t piece, unsigned depth, Work&& work) const {
    const std::size_t pieces = (total_ + piece - 1) / piece;
    std::atomic<std::size_t> next{0};
    std::atomic<std::uint64_t> sink{0};
    std::vector<std::thread> pool;
    const auto buffers = kept_buffers(piece, depth);
    for (unsigned w = 0; w < depth; ++w)
      pool.emplace_back([&, w] {
        auto* buf = buffers[w];
        std::uint64_t h = 0;
        const auto hash = [&](std::uint64_t n) {
          constexpr std::uint64_t part = std::uint64_t{256} << 10;
          for (std::uint64_t at = 0; at < n; at += part)
            h ^= ckpt::detail::xxh3(std::span<const std::byte>(buf + at, std::min(part, n - at)));
        };
        for (std::size_t k; (k = next++) < pieces;) work(k * piece, std::min<std::uint64_t>((k + 1) * piece, total_), buf, hash);
        sink += h;
      });
    for (auto& p : pool) p.join();
    if (sink == 42) std::printf(" ");  // keeps the hashes
  }

 private:
  std::vector<std::uint64_t> starts_;  // each tensor's first byte in the file
  std::uint64_t total_ = 0;
};

/// The least a verified save of the state must do, without ckpt's format: the same file as
/// raw_write_direct, its space allocated first (fallocate), written in pieces of 1 MiB by `depth`
/// threads at once (as many O_DIRECT writes in flight as ckpt's writer keeps), each piece copied
/// from the tensors into the thread's aligned buffer and hashed with XXH3 in 256 KiB parts, as
/// ckpt checksums chunks; the last partial block padded, the file then cut to size and fsync'd.
inline void raw_write_verified(const state& s, const std::filesystem::path& file, unsigned depth) {
  const in_pieces layout(s);
  const auto total = layout.total();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) die("open with O_DIRECT " + file.string());
  if (::fallocate(fd, 0, 0, static_cast<off_t>((total + 4095) / 4096 * 4096)) != 0) die("fallocate " + file.string());
  layout.run(std::size_t{1} << 20, depth, [&](std::uint64_t from, std::uint64_t to, std::byte* buf, auto& hash) {
    layout.for_each_part(from, to, [&](std::size_t t, std::uint64_t in_tensor, std::uint64_t in_piece, std::uint64_t n) {
      std::memcpy(buf + in_piece, s.tensors[t].data() + in_tensor, n);
    });
    hash(to - from);
    const auto want = (to - from + 4095) / 4096 * 4096;
    std::memset(buf + (to - from), 0, want - (to - from));
    for (std::size_t done = 0; done < want;) {
      const auto n = ::pwrite(fd, buf + done, want - done, static_cast<off_t>(from + done));
      if (n <= 0) die("write " + file.string());
      done += static_cast<std::size_t>(n);
    }
  });
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0 || ::fsync(fd) != 0) die("fsync " + file.string());
  ::close(fd);
}

/// The file read back with O_DIRECT in 8 MiB pieces into an aligned buffer, copied into the
/// state's buffers: the limit for a load that bypasses the page cache.
inline void raw_read_direct(state& s, const std::filesystem::path& file) {
  constexpr std::size_t buffer = std::size_t{8} << 20;
  const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) die("open with O_DIRECT " + file.string());
  auto* buf = kept_buffers(buffer, 1).front();  // 2 MiB aligned
  std::size_t have = 0, used = 0;
  for (auto& t : s.tensors) {
    for (std::size_t at = 0; at < t.size();) {
      if (used == have) {
        const auto n = ::read(fd, buf, buffer);
        if (n <= 0) die("read " + file.string());
        have = static_cast<std::size_t>(n), used = 0;
      }
      const auto n = std::min(have - used, t.size() - at);
      std::memcpy(t.data() + at, buf + used, n);
      used += n;
      at += n;
    }
  }
  ::close(fd);
}

/// The least a verified load into the state's buffers must do, without ckpt's format: the file
/// `raw_write_direct` wrote, read with O_DIRECT in 4 MiB pieces by `depth` threads at once (as
/// many requests in flight as ckpt's load keeps), each piece copied into the tensors it holds
/// and hashed with XXH3 in 256 KiB parts, as ckpt verifies chunks. The copy is needed because
/// O_DIRECT reads land only in aligned memory, and the workload's tensors are 64-byte aligned.
inline void raw_read_verified(state& s, const std::filesystem::path& file, unsigned depth) {
  const in_pieces layout(s);
  const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);  // pread from several threads at once
  if (fd < 0) die("open with O_DIRECT " + file.string());
  layout.run(std::size_t{4} << 20, depth, [&](std::uint64_t from, std::uint64_t to, std::byte* buf, auto& hash) {
    const auto want = (to - from + 4095) / 4096 * 4096;
    for (std::size_t got = 0; got < to - from;) {
      const auto n = ::pread(fd, buf + got, want - got, static_cast<off_t>(from + got));
      if (n <= 0) die("read " + file.string());
      got += static_cast<std::size_t>(n);
    }
    layout.for_each_part(from, to, [&](std::size_t t, std::uint64_t in_tensor, std::uint64_t in_piece, std::uint64_t n) {
      std::memcpy(s.tensors[t].data() + in_tensor, buf + in_piece, n);
    });
    hash(to - from);
  });
  ::close(fd);
}

/// The limit for loads: the same file read back in order with read(2) into the state's buffers.
inline void raw_read(state& s, const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) die("open " + file.string());
  for (auto& t : s.tensors) {
    std::size_t done = 0;
    while (done < t.size()) {
      const auto n = ::read(fd, t.data() + done, t.size() - done);
      if (n <= 0) die("read " + file.string());
      done += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
}

/// The same read split over `threads` threads: thread k reads the k-th of `threads` equal parts
/// of the file, taken end to end, with pread(2) straight into the tensors that part holds. For
/// bytes in the page cache this is the fastest way the machine copies them into the state: one
/// thread's read(2) leaves the other cores idle, where ckpt's load spreads its reads over its
/// `threads` (one per core up to 8). With `hash_piece` > 0, the least a verified load from the
/// page cache must do: each read is of at most `hash_piece` bytes and is hashed with XXH3 as soon
/// as it arrives, while still in the CPU's cache, as ckpt's load verifies chunks.
inline void raw_read_parallel(state& s, const std::filesystem::path& file, unsigned threads, std::size_t hash_piece = 0) {
  const in_pieces layout(s);
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) die("open " + file.string());
  std::atomic<std::uint64_t> sink{0};
  const auto part = [&](unsigned k) {
    const auto [from, to] = layout.part(k, threads);
    if (from == to) return;
    std::uint64_t h = 0;
    layout.for_each_part(from, to, [&](std::size_t t, std::uint64_t in_tensor, std::uint64_t in_part, std::uint64_t n) {
      const std::uint64_t piece = hash_piece > 0 ? hash_piece : n;
      for (std::uint64_t at = 0; at < n; at += piece) {
        std::byte* out = s.tensors[t].data() + in_tensor + at;
        const auto want = std::min(piece, n - at);
        for (std::uint64_t got = 0; got < want;) {
          const auto r = ::pread(fd, out + got, want - got, static_cast<off_t>(from + in_part + at + got));
          if (r <= 0) die("read " + file.string());
          got += static_cast<std::uint64_t>(r);
        }
        if (hash_piece > 0) h ^= ckpt::detail::xxh3(std::span<const std::byte>(out, want));
      }
    });
    sink += h;
  };
  std::vector<std::thread> helpers;
  for (unsigned k = 1; k < threads; ++k) helpers.emplace_back(part, k);
  part(0);
  for (auto& h : helpers) h.join();
  ::close(fd);
  if (sink == 42) std::printf(" ");  // keeps the hashes
}

/// Runs fio on `file` (`rw`: write, which also fsyncs at the end, or read) with O_DIRECT,
/// libaio and 16 requests in flight, in blocks of `block`; returns fio's job runtime in seconds.
inline double fio_seconds(const std::string& fio, const std::filesystem::path& file, std::uint64_t bytes, const char* rw,
                          const char* block) {
  const std::string cmd = fio + " --name=deep --filename=" + file.string() + " --size=" + std::to_string(bytes) +
                          " --rw=" + rw + " --bs=" + block +
                          " --direct=1 --ioengine=libaio --iodepth=16 --end_fsync=1 --output-format=json 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) die("cannot run " + cmd);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (::pclose(p) != 0) die(cmd + " failed:\n" + out);
  const auto at = out.find("\"job_runtime\"");
  const auto colon = at == std::string::npos ? at : out.find(':', at);
  if (colon == std::string::npos) die(cmd + " printed no job_runtime:\n" + out);
  return std::stod(out.substr(colon + 1)) / 1000.0;  // milliseconds
}

/// `fio` if it runs here; otherwise "" after saying on stderr that the deep-queue baselines are
/// skipped.
inline std::string usable_fio(std::string fio) {
  if (!fio.empty() && std::system((fio + " --version >/dev/null 2>&1").c_str()) != 0) {
    std::fprintf(stderr, "no %s: the deep-queue baselines are skipped (apt-get install fio)\n", fio.c_str());
    fio.clear();
  }
  return fio;
}

/// Drops `p`'s pages (every file under it) from the page cache, then lets the disk settle for
/// `pause` seconds: it runs slower for seconds after a burst of writes, so every cold read here
/// starts from the same quiet disk.
inline void settle_cold(const std::filesystem::path& p, unsigned pause) {
  drop_cache(p);
  ::sync();
  ::sleep(pause);
}

/// The seconds `read()` takes, started cold (settle_cold on `p`).
template <class Read>
double timed_cold(const std::filesystem::path& p, unsigned pause, Read&& read) {
  settle_cold(p, pause);
  const auto t0 = clock_type::now();
  read();
  return since(t0);
}

/// The faster of `tries` cold reads (timed_cold each): this disk has spells of slowness that last
/// seconds, and one of them in a single read decided a run.
template <class Read>
double fastest_cold(const std::filesystem::path& p, unsigned pause, int tries, Read&& read) {
  double fastest = std::numeric_limits<double>::infinity();
  for (int attempt = 0; attempt < tries; ++attempt) fastest = std::min(fastest, timed_cold(p, pause, read));
  return fastest;
}

/// fio's cold reads of `file` (`bytes` of it) with 1 MiB and with 4 MiB requests, 16 in flight,
/// each from a settled disk: the faster, in seconds.
inline double fastest_fio_read(const std::string& fio, const std::filesystem::path& file, std::uint64_t bytes,
                               unsigned pause) {
  double fastest = std::numeric_limits<double>::infinity();
  for (const char* block : {"1M", "4M"}) {
    settle_cold(file, pause);
    fastest = std::min(fastest, fio_seconds(fio, file, bytes, "read", block));
  }
  return fastest;
}

}  // namespace bench
