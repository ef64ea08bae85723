// Single-process save and load throughput, async save, memory and codecs, each figure as a ratio
// to a baseline measured in the same run (issue 4's targets). Prints one "name value" line per
// figure and run, which bench/report.py turns into docs/performance.md.
//
//   bench/save_load --dir /var/tmp --workload fp32|bf16_adam [--gib 1] [--runs 5]
//   bench/save_load --dir /var/tmp --once fp32|bf16_adam [--gib 1]      (one save and load, for report.py's torch peer)
//   bench/save_load --dir /var/tmp --rss 4 [--codec raw|zstd_bytegroup] (extra peak RSS of one save)
//   bench/save_load --codecs [--runs 5]                                 (ratios and encode throughput)
//
// Workloads (values from N(0, 0.02), like initialised weights):
//   fp32       200 fp32 tensors, `gib` GiB in all;
//   bf16_adam  the same 200 tensors in bf16 plus fp32 Adam moments (exp_avg, exp_avg_sq) of
//              each, 2.5 × `gib` GiB in all.

#include <ckpt/ckpt.hpp>
#include <ckpt/detail/pipeline.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "save_load: %s\n", what.c_str());
  std::exit(1);
}

/// A model-like state: named tensors in plain buffers.
struct tensor_buf {
  std::string name;
  ckpt::dtype type;
  ckpt::shape_t shape;
  std::vector<std::byte> bytes;
};
struct state {
  std::vector<tensor_buf> tensors;
  std::uint64_t step = 0;
  template <class V>
  void checkpoint(V& v) {
    for (auto& t : tensors) v.tensor(t.name, ckpt::tensor_ref(t.type, t.shape, t.bytes.data()));
    v.value("step", step);
  }
  std::uint64_t bytes() const {
    std::uint64_t n = 0;
    for (const auto& t : tensors) n += t.bytes.size();
    return n;
  }
};

/// 200 tensors whose sizes vary like a transformer's (a few large, many medium), `total` bytes
/// of fp32 in all, filled from N(0, 0.02) by several threads.
std::vector<std::uint64_t> element_counts(std::uint64_t total_fp32_bytes) {
  std::vector<double> weight(200);
  for (std::size_t i = 0; i < weight.size(); ++i) weight[i] = (i % 8 == 0) ? 4.0 : (i % 8 < 4 ? 1.0 : 0.5);
  double sum = 0;
  for (auto w : weight) sum += w;
  std::vector<std::uint64_t> counts;
  for (auto w : weight) counts.push_back(static_cast<std::uint64_t>(w / sum * static_cast<double>(total_fp32_bytes) / 4) / 1024 * 1024);
  return counts;
}

void fill_normal(tensor_buf& t, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 0.02f);
  const auto n = t.bytes.size() / ckpt::size_of(t.type);
  if (t.type == ckpt::dtype::f32) {
    auto* p = reinterpret_cast<float*>(t.bytes.data());
    for (std::size_t i = 0; i < n; ++i) p[i] = d(g);
  } else {
    auto* p = reinterpret_cast<ckpt::bfloat16*>(t.bytes.data());
    for (std::size_t i = 0; i < n; ++i) p[i] = ckpt::bfloat16(d(g));
  }
}

state make_state(const std::string& workload, double gib) {
  state s;
  const auto total = static_cast<std::uint64_t>(gib * 1024 * 1024 * 1024);
  const auto counts = element_counts(total);
  auto add = [&](std::string name, ckpt::dtype type, std::uint64_t n) {
    auto& t = s.tensors.emplace_back();
    t.name = std::move(name);
    t.type = type;
    t.shape = {n / 1024, 1024};
    t.bytes.resize(n * ckpt::size_of(type));
  };
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const auto base = "layers." + std::to_string(i / 8) + ".w" + std::to_string(i % 8);
    if (workload == "fp32") {
      add(base, ckpt::dtype::f32, counts[i]);
    } else if (workload == "bf16_adam") {
      add(base, ckpt::dtype::bf16, counts[i]);
      add("optimizer." + base + ".exp_avg", ckpt::dtype::f32, counts[i]);
      add("optimizer." + base + ".exp_avg_sq", ckpt::dtype::f32, counts[i]);
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

/// Drops a file's pages from the page cache (they are clean after fsync), so the next read
/// comes from the disk.
void drop_cache(const std::filesystem::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
void drop_cache_tree(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) drop_cache(e.path());
}

/// The limit: one file, every tensor written in turn with write(2), then fsync.
double raw_write(const state& s, const std::filesystem::path& file) {
  const auto t0 = clock_type::now();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("open " + file.string());
  for (const auto& t : s.tensors) {
    std::size_t done = 0;
    while (done < t.bytes.size()) {
      const auto n = ::write(fd, t.bytes.data() + done, t.bytes.size() - done);
      if (n <= 0) die("write " + file.string());
      done += static_cast<std::size_t>(n);
    }
  }
  if (::fsync(fd) != 0) die("fsync");
  ::close(fd);
  return since(t0);
}

/// The limit for loads: the same file read back in order into the state's buffers.
double raw_read(state& s, const std::filesystem::path& file) {
  const auto t0 = clock_type::now();
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) die("open " + file.string());
  for (auto& t : s.tensors) {
    std::size_t done = 0;
    while (done < t.bytes.size()) {
      const auto n = ::read(fd, t.bytes.data() + done, t.bytes.size() - done);
      if (n <= 0) die("read " + file.string());
      done += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  return since(t0);
}

void print(const char* name, double value) {
  std::printf("%s %.6g\n", name, value);
  std::fflush(stdout);
}

using disk_checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::posix>;

/// Sync save and load against raw write and read, warm and cold; async save against memcpy and
/// a compute loop with and without a save in the background.
void throughput(const std::string& workload, double gib, int runs, const std::filesystem::path& dir) {
  auto s = make_state(workload, gib);
  const double bytes = static_cast<double>(s.bytes());
  print("state_bytes", bytes);
  const auto root = dir / "ckpt";
  const auto raw_file = dir / "raw.bin";
  disk_checkpointer cp{{}, root, {.keep_last_n = 1}};
  state back = s;  // load targets, preallocated
  for (int run = 0; run < runs; ++run) {
    // Sync save, raw codec, fsync'd, against raw write + fsync of the same bytes. Whichever
    // writes second often finds the disk slower (this virtual disk's throughput comes in
    // bursts, and the first writer spends them), so the order alternates from run to run.
    double w = 0, sv = 0;
    auto timed_save = [&] {
      const auto t0 = clock_type::now();
      cp.save(static_cast<std::uint64_t>(run + 1), s);
      sv = since(t0);
    };
    if (run % 2 == 0) {
      w = raw_write(s, raw_file);
      timed_save();
    } else {
      timed_save();
      w = raw_write(s, raw_file);
    }
    print("raw_write_s", w);
    print("save_s", sv);
    print("save_ratio", w / sv);
    // Cold loads: page cache dropped for both files.
    drop_cache(raw_file);
    drop_cache_tree(root);
    const double rc = raw_read(back, raw_file);
    auto t0 = clock_type::now();
    cp.load(back);
    const double lc = since(t0);
    print("raw_read_cold_s", rc);
    print("load_cold_s", lc);
    print("load_cold_ratio", rc / lc);
    // Warm: everything in the page cache (read once more first).
    (void)raw_read(back, raw_file);
    const double rw = raw_read(back, raw_file);
    t0 = clock_type::now();
    cp.load(back);
    const double lw = since(t0);
    print("raw_read_warm_s", rw);
    print("load_warm_s", lw);
    print("load_warm_ratio", rw / lw);
  }
  if (std::memcmp(back.tensors[0].bytes.data(), s.tensors[0].bytes.data(), s.tensors[0].bytes.size()) != 0)
    die("loaded bytes differ from the saved ones");

  // Async: time blocked in save_async (from the second save on, when its snapshot buffers
  // exist) against memcpy of the state into preallocated buffers.
  state copy = s;  // preallocated and touched
  disk_checkpointer acp{{}, dir / "async", {.keep_last_n = 1}};
  acp.save_async(0, s).wait();  // first save: allocates the snapshot buffers
  for (int run = 0; run < runs; ++run) {
    auto t0 = clock_type::now();
    for (std::size_t i = 0; i < s.tensors.size(); ++i)
      std::memcpy(copy.tensors[i].bytes.data(), s.tensors[i].bytes.data(), s.tensors[i].bytes.size());
    const double mc = since(t0);
    // A compute-bound loop while the save writes, against the same loop alone. "Alone" is
    // measured just before the save and just after it, each for as long as the save ran, and
    // averaged: this VM's CPUs are shared, and their speed drifts over seconds.
    std::vector<float> work(1 << 16, 1.0f);
    auto compute = [&](double seconds, auto&& keep_going) {
      std::uint64_t iterations = 0;
      const auto start = clock_type::now();
      while (since(start) < seconds && keep_going()) {
        for (auto& x : work) x = x * 0.999f + 0.001f;
        ++iterations;
      }
      return static_cast<double>(iterations) / since(start);
    };
    const double idle_before = compute(2.0, [] { return true; });
    t0 = clock_type::now();
    auto h = acp.save_async(static_cast<std::uint64_t>(run + 1), s);
    const double blocked = since(t0);
    const auto busy_start = clock_type::now();
    const double busy = compute(30.0, [&] { return !h.done(); });
    const double busy_s = since(busy_start);
    h.wait();
    const double idle_after = compute(std::max(busy_s, 0.5), [] { return true; });
    const double idle = (idle_before + idle_after) / 2;
    print("memcpy_s", mc);
    print("async_blocked_s", blocked);
    print("async_blocked_ratio", blocked / mc);
    print("compute_alone_before", idle_before);
    print("compute_alone_after", idle_after);
    print("compute_during_async_ratio", busy / idle);
  }
  std::filesystem::remove(raw_file);
}

/// One save and one load of the workload (report.py alternates it with torch.save/torch.load).
void once(const std::string& workload, double gib, const std::filesystem::path& dir) {
  auto s = make_state(workload, gib);
  auto back = s;
  disk_checkpointer cp{{}, dir / "ckpt_once", {.keep_last_n = 1}};
  auto t0 = clock_type::now();
  cp.save(1, s);
  print("save_s", since(t0));
  drop_cache_tree(dir / "ckpt_once");
  ::sync();
  ::sleep(3);  // as torch_peer.py does: the disk slows down for seconds after a burst of writes
  t0 = clock_type::now();
  cp.load(back);
  print("load_cold_s", since(t0));
  t0 = clock_type::now();
  cp.load(back);
  print("load_warm_s", since(t0));
  std::filesystem::remove_all(dir / "ckpt_once");
}

std::uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

/// Extra peak resident memory of one sync save of a `gib` GiB fp32 state.
template <class Codec>
void rss(double gib, const std::filesystem::path& dir) {
  auto s = make_state("fp32", gib);
  const auto before = peak_rss_bytes();
  {
    ckpt::checkpointer<ckpt::single_process, ckpt::posix, Codec> cp{{}, dir / "ckpt_rss"};
    cp.save(1, s);
  }
  const auto after = peak_rss_bytes();
  print("state_bytes", static_cast<double>(s.bytes()));
  print("extra_peak_rss_mib", static_cast<double>(after - before) / (1024.0 * 1024.0));
  std::filesystem::remove_all(dir / "ckpt_rss");
}

/// Compression ratio and encode throughput of zstd_bytegroup against zstd level 1, and encode
/// throughput with two threads against one, on 256 MiB of N(0, 0.02) values in 4 MiB chunks.
void codecs(int runs) {
  for (const char* workload : {"bf16", "fp32"}) {
    tensor_buf t;
    t.type = std::string(workload) == "bf16" ? ckpt::dtype::bf16 : ckpt::dtype::f32;
    t.bytes.resize(std::size_t{256} << 20);
    fill_normal(t, 7);
    const std::size_t chunk = std::size_t{4} << 20, chunks = t.bytes.size() / chunk;
    auto encode_all = [&](const auto& codec, unsigned threads, std::uint64_t& stored) {
      std::vector<std::vector<std::byte>> out(2 * threads);
      std::atomic<std::uint64_t> total{0};
      const auto t0 = clock_type::now();
      ckpt::detail::run_pipeline(
          chunks, out.size(), threads, [](std::size_t, std::size_t) {},
          [&](std::size_t i, std::size_t s) {
            out[s].resize(codec.max_encoded_size(chunk));
            total += codec.encode(std::span<const std::byte>(t.bytes).subspan(i * chunk, chunk), t.type, out[s]);
          },
          [](std::size_t, std::size_t) {});
      stored = total;
      return since(t0);
    };
    for (int run = 0; run < runs; ++run) {
      std::uint64_t zs = 0, bs = 0, bs2 = 0;
      const double z1 = encode_all(ckpt::zstd{}, 1, zs);
      const double b1 = encode_all(ckpt::zstd_bytegroup{}, 1, bs);
      const double b2 = encode_all(ckpt::zstd_bytegroup{}, 2, bs2);
      const double raw = static_cast<double>(t.bytes.size());
      const std::string w = workload;
      print((w + "_zstd_ratio").c_str(), raw / static_cast<double>(zs));
      print((w + "_bytegroup_ratio").c_str(), raw / static_cast<double>(bs));
      print((w + "_bytegroup_vs_zstd_speed").c_str(), z1 / b1);
      print((w + "_bytegroup_mb_s").c_str(), raw / b1 / 1e6);
      print((w + "_two_threads_speedup").c_str(), b1 / b2);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string workload = "fp32", mode = "throughput", codec = "raw";
  double gib = 1, rss_gib = 4;
  int runs = 5;
  std::filesystem::path dir = "/var/tmp";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--workload") workload = next();
    else if (a == "--once") mode = "once", workload = next();
    else if (a == "--rss") mode = "rss", rss_gib = std::stod(next());
    else if (a == "--codec") codec = next();
    else if (a == "--codecs") mode = "codecs";
    else if (a == "--gib") gib = std::stod(next());
    else if (a == "--runs") runs = std::stoi(next());
    else if (a == "--dir") dir = next();
    else die("unknown option " + a);
  }
  const auto work = dir / ("ckpt-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(work);
  try {
    if (mode == "throughput") throughput(workload, gib, runs, work);
    else if (mode == "once") once(workload, gib, work);
    else if (mode == "rss" && codec == "raw") rss<ckpt::raw>(rss_gib, work);
    else if (mode == "rss" && codec == "zstd_bytegroup") rss<ckpt::zstd_bytegroup>(rss_gib, work);
    else if (mode == "codecs") codecs(runs);
    else die("unknown codec " + codec);
  } catch (const std::exception& e) {
    std::filesystem::remove_all(work);
    die(e.what());
  }
  std::filesystem::remove_all(work);
}
