// A sync save against a raw writer of the same bytes, in one process, under the calmest
// conditions this machine offers. This VM's disk absorbs a burst of writes quickly and then
// slows down for seconds: measured back to back, whichever of two 1 GiB writers goes second
// takes 2-3x longer, whoever it is, even after a pause of seconds; what comes right after
// deleting files is fast. So each writer starts the same way: everything the others wrote is
// deleted (outside the timing), then sync and a pause; and rounds rotate which goes first.
// Two raw writers: write(2) through the page cache, then fsync (the limit), and O_DIRECT
// from an aligned buffer, then fsync (the limit for a writer that bypasses the page cache, as
// ckpt::posix does by default); and their cold reads, read(2) and O_DIRECT. Prints, per round,
// the wall time of each and the time spent inside the write(2) calls of the first raw writer;
// the medians at the end.
//
// The strictest limit is the fastest way the machine moves the same bytes, and a loop of
// read(2) or write(2) calls keeps only one request in flight. Where Debian's fio is installed
// (`--fio fio`, the default; `--fio ''` skips it), each round also times fio writing and reading
// a file of the same size with O_DIRECT, libaio, iodepth=16 (issue 24), in 1 MiB and 4 MiB
// blocks, by fio's own job runtime (which leaves out its start-up); the "best" columns are the
// fastest of the queue-depth-1 loop and the fio runs of that round, and the ratios against them
// decide the targets. Two more writers and two more cold reads say what bounds ckpt: the least
// a verified save or load of the same 64-byte aligned tensors must do without ckpt's format
// (O_DIRECT at ckpt's depth, a copy between the tensors and aligned buffers, a hash of every
// byte: `verified_w`, `verified_r`), and ckpt's save and load of page-aligned tensors, which
// O_DIRECT writes without the copy (`paged_w`, `paged_r`; loads copy out of the reader's buffer
// unless posix_options::read_in_place is set).
//
//   bench/save_vs_raw [--workload fp32|bf16_adam] [--dir /work/benchdir] [--gib 1] [--rounds 6] [--chunk-mib 4] [--threads 0] [--pause 3] [--fio fio] [--reads-in-flight 16] [--writes-in-flight 32]

#include <ckpt/ckpt.hpp>

#include "workload.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

using namespace bench;

int main(int argc, char** argv) {
  std::filesystem::path dir = "/tmp";
  double gib = 1;
  int rounds = 6;
  unsigned threads = 0, pause = 3, reads_in_flight = ckpt::posix_options{}.reads_in_flight,
           writes_in_flight = ckpt::posix_options{}.writes_in_flight;
  std::uint64_t chunk_mib = 4;
  std::string workload = "fp32", fio = "fio";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--workload") workload = v;
    else if (a == "--gib") gib = std::stod(v);
    else if (a == "--rounds") rounds = std::stoi(v);
    else if (a == "--chunk-mib") chunk_mib = std::stoull(v);
    else if (a == "--threads") threads = static_cast<unsigned>(std::stoul(v));
    else if (a == "--pause") pause = static_cast<unsigned>(std::stoul(v));
    else if (a == "--fio") fio = v;
    else if (a == "--reads-in-flight") reads_in_flight = static_cast<unsigned>(std::stoul(v));
    else if (a == "--writes-in-flight") writes_in_flight = static_cast<unsigned>(std::stoul(v));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const auto root = dir / ("ckpt-save-vs-raw-" + std::to_string(::getpid()));
  std::filesystem::create_directories(root / "ckpt");
  auto s = make_state(workload, gib);
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{
      {}, ckpt::posix(root / "ckpt", {.reads_in_flight = reads_in_flight, .writes_in_flight = writes_in_flight}), {.chunk_bytes = chunk_mib << 20, .threads = threads}};
  auto back = s;  // load targets, 64-byte aligned as PyTorch's tensors
  // The same tensors at the start of a page, as pinned or page-allocated memory is: saved by a
  // checkpointer of their own, and loaded into.
  auto paged = shifted(s, 0);
  std::filesystem::create_directories(root / "ckpt_paged");
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp_paged{
      {}, ckpt::posix(root / "ckpt_paged", {.reads_in_flight = reads_in_flight, .writes_in_flight = writes_in_flight}), {.chunk_bytes = chunk_mib << 20, .threads = threads}};
  const auto raw_file = root / "raw.bin", direct_file = root / "raw_direct.bin", verified_file = root / "raw_verified.bin";
  fio = usable_fio(fio);
  const auto fio_file = root / "fio.bin";
  std::vector<double> raw_s, save_s, ratio, read_ratio, direct_ratio, direct_read_ratio, best_ratio, best_read_ratio;
  std::printf("%6s %8s %10s %9s %8s %8s %8s %11s %13s %10s %11s %8s %10s %10s %10s %8s %10s %8s\n", "round", "raw_s", "in_write_s",
              "direct_s", "fio_w_s", "save_s", "ratio", "read_cold_s", "direct_read_s", "fio_read_s", "load_cold_s", "ratio",
              "best_save", "best_load", "verified_w", "paged_w", "verified_r", "paged_r");
  for (int r = 0; r < rounds; ++r) {
    double raw = 0, in_write = 0, direct = 0, saved = 0, verified_write = 0, saved_paged = 0;
    auto settle = [&] {  // give each writer the same start: nothing of ours on disk, quiet
      for (const char* dir : {"ckpt", "ckpt_paged"})
        for (const auto& e : std::filesystem::directory_iterator(root / dir))
          if (e.path().filename().string().starts_with("global_step")) std::filesystem::remove_all(e.path());
      std::filesystem::remove(raw_file);
      std::filesystem::remove(verified_file);
      std::filesystem::remove(direct_file);
      std::filesystem::remove(fio_file);
      ::sync();
      ::sleep(pause);
    };
    auto timed = [&](double& seconds, auto&& write) {
      settle();
      const auto t0 = clock_type::now();
      write();
      seconds = since(t0);
    };
    const auto save = [&] { cp.save(static_cast<std::uint64_t>(r + 1), s); };
    const auto bytes = s.bytes();
    // fio, deep queue, 1 MiB and 4 MiB blocks: writes, each from the same settled disk, then
    // reads of the last file written, from a dropped cache. Before the others, so that its
    // settling does not delete what they wrote.
    double fio_write = std::numeric_limits<double>::infinity(), fio_read = fio_write;
    if (!fio.empty()) {
      for (const char* block : {"1M", "4M"}) {
        settle();
        fio_write = std::min(fio_write, fio_seconds(fio, fio_file, bytes, "write", block));
      }
      fio_read = fastest_fio_read(fio, fio_file, bytes, pause);
    }
    // Three writers, in an order that rotates from round to round: raw write(2) + fsync,
    // raw O_DIRECT + fsync (what posix_options::direct_writes does, without the checkpoint),
    // and ckpt's save. Besides them: the least a verified save must do without ckpt's format
    // (a copy into aligned buffers and a hash of every byte, O_DIRECT at ckpt's depth), and
    // ckpt's save of page-aligned tensors, which O_DIRECT writes without the copy.
    for (int k = 0; k < 5; ++k) {
      switch ((r + k) % 5) {
        case 0: timed(raw, [&] { in_write = raw_write(s, raw_file); }); break;
        case 1: timed(direct, [&] { raw_write_direct(s, direct_file); }); break;
        case 2: timed(verified_write, [&] { raw_write_verified(s, verified_file, writes_in_flight); }); break;
        case 3: timed(saved_paged, [&] { cp_paged.save(static_cast<std::uint64_t>(r + 1), paged); }); break;
        default: timed(saved, save); break;
      }
    }
    // Cold reads of all three, each from a settled disk with its file out of the page cache,
    // order rotating. What the later writers' settling deleted is written again first.
    if (!std::filesystem::exists(raw_file)) (void)raw_write(s, raw_file);
    if (!std::filesystem::exists(direct_file)) raw_write_direct(s, direct_file);
    if (!std::filesystem::exists(root / "ckpt" / ("global_step" + std::to_string(r + 1)))) save();
    if (!std::filesystem::exists(root / "ckpt_paged" / ("global_step" + std::to_string(r + 1))))
      cp_paged.save(static_cast<std::uint64_t>(r + 1), paged);
    double read = 0, direct_read = 0, loaded = 0, verified = 0, loaded_paged = 0;
    auto cold = [&](double& seconds, const std::filesystem::path& what, auto&& read_it) {
      seconds = timed_cold(what, pause, read_it);
    };
    // Besides the three: the least work a verified load into the same tensors must do without
    // ckpt's format (O_DIRECT at ckpt's depth, a copy and a hash of every byte), and ckpt's load
    // of the page-aligned tensors' checkpoint into them. Both read through the reader's buffer in
    // windows of 4 MiB (since 2026-12-07; from 2026-12-05 both read in place, before that only the
    // page-aligned one did).
    for (int k = 0; k < 5; ++k) {
      switch ((r + k) % 5) {
        case 0: cold(read, raw_file, [&] { raw_read(back, raw_file); }); break;
        case 1: cold(direct_read, direct_file, [&] { raw_read_direct(back, direct_file); }); break;
        case 2: cold(verified, direct_file, [&] { raw_read_verified(back, direct_file, reads_in_flight); }); break;
        case 3: cold(loaded_paged, root / "ckpt_paged", [&] { cp_paged.load(paged); }); break;
        default: cold(loaded, root / "ckpt", [&] { cp.load(back); }); break;
      }
    }
    // The strictest limits of the round: the fastest raw writer and reader, queue depth 1 or deep.
    const double best_write = std::min(direct, fio_write), best_read = std::min(direct_read, fio_read);
    std::printf("%6d %8.3f %10.3f %9.3f %8.3f %8.3f %8.3f %11.3f %13.3f %10.3f %11.3f %8.3f %10.3f %10.3f %10.3f %8.3f %10.3f %8.3f\n",
                r, raw, in_write, direct, fio_write, saved, raw / saved, read, direct_read, fio_read, loaded, read / loaded,
                best_write / saved, best_read / loaded, verified_write, saved_paged, verified, loaded_paged);
    std::fflush(stdout);
    if (r > 0) {  // round 0 warms up
      raw_s.push_back(raw), save_s.push_back(saved), ratio.push_back(raw / saved), read_ratio.push_back(read / loaded);
      direct_ratio.push_back(direct / saved), direct_read_ratio.push_back(direct_read / loaded);
      best_ratio.push_back(best_write / saved), best_read_ratio.push_back(best_read / loaded);
      if (!fio.empty()) {
        std::printf("settled_fio_write_s %.6g\nsettled_fio_read_s %.6g\n", fio_write, fio_read);
        std::printf("settled_save_vs_best_ratio %.6g\n", best_write / saved);
        std::printf("settled_load_cold_vs_best_ratio %.6g\n", best_read / loaded);
      }
      std::printf("settled_save_ratio %.6g\n", raw / saved);  // for bench/report.py
      std::printf("settled_load_cold_ratio %.6g\n", read / loaded);
      std::printf("settled_save_vs_direct_ratio %.6g\n", direct / saved);
      std::printf("settled_load_cold_vs_direct_ratio %.6g\n", direct_read / loaded);
      std::printf("settled_raw_write_s %.6g\nsettled_direct_write_s %.6g\nsettled_save_s %.6g\n", raw, direct, saved);
      std::printf("settled_raw_read_s %.6g\nsettled_direct_read_s %.6g\nsettled_load_s %.6g\n", read, direct_read, loaded);
      std::printf("settled_verified_read_s %.6g\nsettled_load_paged_s %.6g\n", verified, loaded_paged);
      std::printf("settled_verified_write_s %.6g\nsettled_save_paged_s %.6g\n", verified_write, saved_paged);
      std::printf("settled_save_vs_verified_ratio %.6g\n", verified_write / saved);
      std::printf("settled_save_paged_vs_best_ratio %.6g\n", best_write / saved_paged);
      std::printf("settled_load_vs_verified_ratio %.6g\n", verified / loaded);
      std::printf("settled_load_paged_vs_best_ratio %.6g\n", best_read / loaded_paged);
    }
  }
  if (!back.same_bytes(s) || !paged.same_bytes(s)) {
    std::fprintf(stderr, "loaded bytes differ from the saved ones\n");
    return 1;
  }
  std::printf("median of rounds 1-%d: raw %.3f s, save %.3f s, raw/save %.3f; cold read/load %.3f; O_DIRECT write/save "
              "%.3f, O_DIRECT read/load %.3f; best write/save %.3f, best read/load %.3f\n",
              rounds - 1, median(raw_s), median(save_s), median(ratio), median(read_ratio), median(direct_ratio),
              median(direct_read_ratio), median(best_ratio), median(best_read_ratio));
  std::filesystem::remove_all(root);
}
