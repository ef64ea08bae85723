// Single-process save and load throughput, async save, memory and codecs, each figure as a ratio
// to a baseline measured in the same run (issue 4's targets). Prints one "name value" line per
// figure and run, which bench/report.py turns into docs/performance.md.
//
//   bench/save_load --dir /var/tmp --workload fp32|bf16_adam [--gib 1] [--runs 5]
//   bench/save_load --dir /var/tmp --once fp32|bf16_adam [--gib 1]      (one save and load, for report.py's torch peer)
//   bench/save_load --dir /var/tmp --rss 4 [--codec raw|zstd_bytegroup] (extra peak RSS of one save)
//   bench/save_load --codecs [--runs 5]                                 (ratios and encode throughput)
//
// The workloads (fp32, bf16_adam) and the raw baselines are in workload.hpp.

#include <ckpt/ckpt.hpp>
#include <ckpt/impl/checkpointer.ipp>  // it makes checkpointers impl/instances.hpp does not list (zstd_bytegroup)
#include <ckpt/detail/pipeline.hpp>
#include <ckpt/detail/table_memory.hpp>

#include "workload.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace bench;

/// The raw writer, timed whole (write calls and fsync).
double timed_raw_write(const state& s, const std::filesystem::path& file) {
  const auto t0 = clock_type::now();
  (void)raw_write(s, file);
  return since(t0);
}
double timed_raw_read(state& s, const std::filesystem::path& file) {
  const auto t0 = clock_type::now();
  raw_read(s, file);
  return since(t0);
}

void print(const char* name, double value) {
  std::printf("%s %.6g\n", name, value);
  std::fflush(stdout);
}

/// Iterations per second of a compute-bound loop over `work`, run for `seconds` or until
/// `keep_going()` is false. One out-of-line function, so that the loop alone and the loop during
/// a save run the same machine code: as a generic lambda it was compiled three times, and one
/// copy (the constant hoisted into a register, the loop 32-byte aligned) ran twice as fast as
/// the others here, which made "alone after the save" 2x "alone before" (2026-12-01).
[[gnu::noinline]] double compute_rate(std::vector<float>& work, double seconds, const std::function<bool()>& keep_going) {
  std::uint64_t iterations = 0;
  const auto start = clock_type::now();
  while (since(start) < seconds && keep_going()) {
    for (auto& x : work) x = x * 0.999f + 0.001f;
    ++iterations;
  }
  return static_cast<double>(iterations) / since(start);
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
  state back = s;              // load targets, preallocated
  state odd = shifted(s, 16);  // the same, 16 bytes into a page, as a std::vector's
  for (int run = 0; run < runs; ++run) {
    // Sync save, raw codec, fsync'd, against raw write + fsync of the same bytes. Whichever
    // writes second often finds the disk slower (this virtual disk's throughput comes in
    // bursts, and the first writer spends them), so the order alternates from run to run.
    double w = 0, sv = 0;
    auto timed_save = [&] {
      const auto t0 = clock_type::now();
      cp.save(static_cast<std::uint64_t>(run + 1), s);
      sv = since(t0);
      // Retention deletes the tag before on a thread of its own, which holds the disk for a
      // quarter of a second: let it end, outside the timing, so that the raw writer and reader
      // after the save get the same quiet disk as before it.
      cp.wait();
    };
    if (run % 2 == 0) {
      w = timed_raw_write(s, raw_file);
      timed_save();
    } else {
      timed_save();
      w = timed_raw_write(s, raw_file);
    }
    print("raw_write_s", w);
    print("save_s", sv);
    print("save_ratio", w / sv);
    // Cold loads: page cache dropped for both files.
    drop_cache(raw_file);
    drop_cache(root);
    const double rc = timed_raw_read(back, raw_file);
    auto t0 = clock_type::now();
    cp.load(back);
    const double lc = since(t0);
    print("raw_read_cold_s", rc);
    print("load_cold_s", lc);
    print("load_cold_ratio", rc / lc);
    // Warm: everything in the page cache (read once more first; ckpt's cold load read with
    // O_DIRECT, which leaves nothing cached). A warm load of 1 GiB takes a tenth of a second,
    // and single ones vary by half on this VM, so each run takes the median of five raw reads
    // and five loads, alternating.
    //
    // The 16-byte shifted buffers are given the history the aligned ones have, a read(2) into
    // them, before they are timed. On this VM (a PVM guest, shadow page tables) the first time the
    // kernel writes into a page of user memory costs a trip to the host, about 2 us per 4 KiB
    // page, even where the program itself has written that page: a first load into memory
    // only the program had touched took 0.56-0.72 s for 1 GiB, the next ones 0.07-0.11 s
    // (docs/performance.md). The raw baseline's buffers always have it behind them.
    raw_read(back, raw_file);
    read_through_cache(root);
    if (run == 0) raw_read(odd, raw_file);
    // Two raw baselines, each timed in every round: one thread's read(2), and pread(2) split
    // over as many threads as ckpt's load uses (its `threads`, one per core up to 8). The
    // decisive ratio takes the faster of their medians. And, as the bound on that ratio, the
    // split pread again with every 256 KiB hashed as it arrives (what ckpt's load must add to
    // it, short of skipping the verification), into the aligned and into the shifted buffers.
    constexpr int warm_pairs = 5;
    const unsigned readers = ckpt::detail::worker_count(0);
    std::vector<double> rws, rps, rvs, rvos, lws, los;
    for (int k = 0; k < warm_pairs; ++k) {
      rws.push_back(timed_raw_read(back, raw_file));
      t0 = clock_type::now();
      raw_read_parallel(back, raw_file, readers);
      rps.push_back(since(t0));
      t0 = clock_type::now();
      raw_read_parallel(back, raw_file, readers, ckpt::detail::read_piece_bytes<ckpt::posix>());
      rvs.push_back(since(t0));
      t0 = clock_type::now();
      cp.load(back);
      lws.push_back(since(t0));
      // Into buffers 16 bytes into a page, as a std::vector's are; against the same raw reads
      // into aligned buffers.
      t0 = clock_type::now();
      cp.load(odd);
      los.push_back(since(t0));
      t0 = clock_type::now();
      raw_read_parallel(odd, raw_file, readers, ckpt::detail::read_piece_bytes<ckpt::posix>());
      rvos.push_back(since(t0));
    }
    const double rw = median(rws), rp = median(rps), rv = median(rvs), rvo = median(rvos), lw = median(lws), lo = median(los);
    const double fastest = std::min(rw, rp);
    print("raw_read_warm_s", rw);
    print("raw_read_parallel_warm_s", rp);
    print("raw_read_verified_warm_s", rv);
    print("load_warm_vs_verified_ratio", rv / lw);
    print("load_warm_s", lw);
    print("load_warm_ratio", rw / lw);
    print("load_warm_vs_fastest_ratio", fastest / lw);
    print("load_warm_misaligned_s", lo);
    print("load_warm_misaligned_ratio", rw / lo);
    print("load_warm_misaligned_vs_fastest_ratio", fastest / lo);
    print("raw_read_verified_warm_misaligned_s", rvo);
    print("load_warm_misaligned_vs_verified_ratio", rvo / lo);
  }
  if (!back.same_bytes(s) || !odd.same_bytes(s)) die("loaded bytes differ from the saved ones");

  // Async: time blocked in save_async (from the second save on, when its snapshot buffers
  // exist) against a copy of the state into preallocated buffers, the fastest of nine made one
  // after the other (so each but the first of a kind copies into memory it just touched): three
  // memcpys on one thread into ordinary pages, three into huge pages (as ckpt's snapshot buffers
  // are), and three split over as many threads as ckpt's snapshot uses (its `threads`, one per
  // core up to 8) into huge pages. The last is the fastest this machine moves the bytes.
  state copy = s;  // preallocated and touched
  std::vector<ckpt::detail::huge_page_buffer> huge;
  for (const auto& t : s.tensors) {
    const auto in_page = reinterpret_cast<std::uintptr_t>(t.data()) % 4096;
    huge.push_back(ckpt::detail::huge_page_memory(t.size() + in_page, t.size() + in_page));
    std::memset(huge.back().get(), 0, t.size() + in_page);
  }
  const auto huge_copy_of = [&](std::size_t i) { return huge[i].get() + reinterpret_cast<std::uintptr_t>(s.tensors[i].data()) % 4096; };
  const unsigned copiers = ckpt::detail::worker_count(0);
  // Thread k copies the k-th of `copiers` equal parts of the state's bytes, taken end to end.
  // The threads are started before the clock and joined after it: it runs from the signal to
  // go until the last part is copied.
  const in_pieces layout(s);
  const auto parallel_copy = [&] {
    const auto part = [&](unsigned k) {
      const auto [from, to] = layout.part(k, copiers);
      if (from == to) return;
      layout.for_each_part(from, to, [&](std::size_t i, std::uint64_t in_tensor, std::uint64_t, std::uint64_t n) {
        std::memcpy(huge_copy_of(i) + in_tensor, s.tensors[i].data() + in_tensor, n);
      });
    };
    std::latch go(1), done(copiers);
    std::vector<std::thread> helpers;
    for (unsigned k = 1; k < copiers; ++k)
      helpers.emplace_back([&, k] {
        go.wait();
        part(k);
        done.count_down();
      });
    const auto c0 = clock_type::now();
    go.count_down();
    part(0);
    done.arrive_and_wait();
    const double took = since(c0);
    for (auto& h : helpers) h.join();
    return took;
  };
  disk_checkpointer acp{{}, dir / "async", {.keep_last_n = 1}};
  acp.save_async(0, s).wait();  // first save: allocates the snapshot buffers
  for (int run = 0; run < runs; ++run) {
    double mc = 0, fastest = 0;
    for (int k = 0; k < 9; ++k) {
      double took = 0;
      if (k < 6) {
        const auto c0 = clock_type::now();
        for (std::size_t i = 0; i < s.tensors.size(); ++i)
          std::memcpy(k < 3 ? copy.tensors[i].data() : huge_copy_of(i), s.tensors[i].data(), s.tensors[i].size());
        took = since(c0);
      } else {
        took = parallel_copy();
      }
      if (k < 6) mc = k == 0 ? took : std::min(mc, took);
      fastest = k == 0 ? took : std::min(fastest, took);
    }
    // A compute-bound loop while the save writes, against the same loop alone. "Alone" is
    // measured just before the save and just after it, each for as long as the save ran, and
    // averaged: this VM's CPUs are shared, and their speed drifts over seconds.
    std::vector<float> work(1 << 16, 1.0f);
    const auto always = [] { return true; };
    // The copies above ran back to back, each finding the memory the one before had just
    // touched. save_async runs after seconds of compute on other memory, and on this VM a copy
    // then takes 30-60 % longer. So also: the same parallel copy after the same compute loop,
    // into the huge pages last written seconds before, as the snapshot buffers were.
    // Each run times three saves, each after its own cold copy, and keeps the fastest of each:
    // at times this VM copies memory left alone for seconds up to ten times slower than at
    // others, for seconds, with no page fault or system time in the guest (docs/performance.md,
    // "Memory left alone for seconds"), and one such spell in a run's only save decided it.
    constexpr int saves_per_run = 3;
    std::vector<double> cold_each, blocked_each, compute_ratio;
    for (int k = 0; k < saves_per_run; ++k) {
      (void)compute_rate(work, 2.0, always);
      const double cold_k = parallel_copy();
      const double idle_before = compute_rate(work, 2.0, always);
      const auto t0 = clock_type::now();
      auto h = acp.save_async(static_cast<std::uint64_t>(run * saves_per_run + k + 1), s);
      const double blocked_k = since(t0);
      const auto busy_start = clock_type::now();
      const double busy = compute_rate(work, 30.0, [&] { return !h.done(); });
      const double busy_s = since(busy_start);
      h.wait();
      const double idle_after = compute_rate(work, std::max(busy_s, 0.5), always);
      cold_each.push_back(cold_k);
      blocked_each.push_back(blocked_k);
      compute_ratio.push_back(busy / ((idle_before + idle_after) / 2));
    }
    const double cold = *std::min_element(cold_each.begin(), cold_each.end());
    const double blocked = *std::min_element(blocked_each.begin(), blocked_each.end());
    std::sort(compute_ratio.begin(), compute_ratio.end());
    print("memcpy_s", mc);
    print("fastest_copy_s", fastest);
    print("async_blocked_s", blocked);
    for (const double b : blocked_each) print("async_blocked_each_s", b);
    print("async_blocked_ratio", blocked / fastest);
    print("async_blocked_memcpy_ratio", blocked / mc);
    print("cold_copy_s", cold);
    print("async_blocked_cold_ratio", blocked / cold);
    print("compute_during_async_ratio", compute_ratio[compute_ratio.size() / 2]);
  }
  std::filesystem::remove(raw_file);
}

/// One save and one load of the workload (report.py alternates it with torch.save/torch.load).
void once(const std::string& workload, double gib, const std::filesystem::path& dir) {
  auto s = make_state(workload, gib);
  auto back = s;
  disk_checkpointer cp{{}, dir / "ckpt_once", {.keep_last_n = 1}};
  ::sync();
  ::sleep(3);  // start from a settled disk, as the peers do (report.py rotates their order)
  auto t0 = clock_type::now();
  cp.save(1, s);
  print("save_s", since(t0));
  settle_cold(dir / "ckpt_once", 3);  // as torch_peer.py does: the disk slows down for seconds after a burst of writes
  t0 = clock_type::now();
  cp.load(back);
  print("load_cold_s", since(t0));
  read_through_cache(dir / "ckpt_once");  // the cold load read with O_DIRECT: nothing is cached yet
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
/// throughput with two threads against one, on 256 MiB of N(0, 0.02) values in 4 MiB chunks
/// (each run times every encoder twice, in mirrored order).
void codecs(int runs) {
  for (const char* workload : {"bf16", "fp32"}) {
    tensor_buf t;
    t.type = std::string(workload) == "bf16" ? ckpt::dtype::bf16 : ckpt::dtype::f32;
    t.block.resize(std::size_t{256} << 20);
    fill_normal(t, 7);
    const std::size_t chunk = std::size_t{4} << 20, chunks = t.size() / chunk;
    // Output buffers are allocated and touched once, outside the timing, as a checkpointer
    // keeps its staging buffers from one save to the next.
    std::vector<std::vector<std::byte>> out(4);
    for (auto& o : out) o.resize(ckpt::zstd_bytegroup{}.max_encoded_size(chunk), std::byte{1});
    auto encode_all = [&](const auto& codec, unsigned threads, std::uint64_t& stored) {
      std::atomic<std::uint64_t> total{0};
      const auto t0 = clock_type::now();
      ckpt::detail::run_pipeline(
          chunks, 2 * threads, threads, [](std::size_t, std::size_t) {},
          [&](std::size_t i, std::size_t s) {
            total += codec.encode(std::span<const std::byte>(t.data(), t.size()).subspan(i * chunk, chunk), t.type, out[s]);
          },
          [](std::size_t, std::size_t) {});
      stored = total;
      return since(t0);
    };
    for (int run = 0; run < runs; ++run) {
      // In the order A B C C B A, each figure from the sums of its pair: this VM's CPU speed
      // drifts over seconds, and a drift that is linear over the run then cancels.
      std::uint64_t zs = 0, bs = 0, ignored = 0;
      double z1 = encode_all(ckpt::zstd{}, 1, zs);
      double b1 = encode_all(ckpt::zstd_bytegroup{}, 1, bs);
      double b2 = encode_all(ckpt::zstd_bytegroup{}, 2, ignored);
      b2 += encode_all(ckpt::zstd_bytegroup{}, 2, ignored);
      b1 += encode_all(ckpt::zstd_bytegroup{}, 1, ignored);
      z1 += encode_all(ckpt::zstd{}, 1, ignored);
      z1 /= 2, b1 /= 2, b2 /= 2;
      const double raw = static_cast<double>(t.size());
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
