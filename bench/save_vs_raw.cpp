// A sync save against a raw writer of the same bytes, in one process, under the calmest
// conditions this machine offers. This VM's disk absorbs a burst of writes quickly and then
// slows down for seconds: measured back to back, whichever of two 1 GiB writers goes second
// takes 2-3x longer, whoever it is, even after a pause of seconds; what comes right after
// deleting files is fast. So each writer starts the same way: everything the other wrote is
// deleted (outside the timing), then sync and a pause; and rounds alternate which goes first. Prints, per round, the wall time of each and the time spent inside write(2)'s
// caller-visible calls of the raw writer; the medians at the end.
//
//   bench/save_vs_raw [--workload fp32|bf16_adam] [--dir /work/benchdir] [--gib 1] [--rounds 6] [--chunk-mib 4] [--threads 0] [--pause 3]

#include <ckpt/ckpt.hpp>

#include "workload.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using namespace bench;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path dir = "/tmp";
  double gib = 1;
  int rounds = 6;
  unsigned threads = 0, pause = 3;
  std::uint64_t chunk_mib = 4;
  std::string workload = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--workload") workload = v;
    else if (a == "--gib") gib = std::stod(v);
    else if (a == "--rounds") rounds = std::stoi(v);
    else if (a == "--chunk-mib") chunk_mib = std::stoull(v);
    else if (a == "--threads") threads = static_cast<unsigned>(std::stoul(v));
    else if (a == "--pause") pause = static_cast<unsigned>(std::stoul(v));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const auto root = dir / ("ckpt-save-vs-raw-" + std::to_string(::getpid()));
  std::filesystem::create_directories(root / "ckpt");
  auto s = make_state(workload, gib);
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{
      {}, root / "ckpt", {.chunk_bytes = chunk_mib << 20, .threads = threads}};
  auto back = s;  // load targets
  std::vector<double> raw_s, save_s, ratio, read_ratio;
  std::printf("%6s %8s %10s %8s %8s %11s %11s %8s\n", "round", "raw_s", "in_write_s", "save_s", "ratio", "read_cold_s",
              "load_cold_s", "ratio");
  for (int r = 0; r < rounds; ++r) {
    double raw = 0, in_write = 0, saved = 0;
    auto settle = [&] {  // give each writer the same start: nothing of ours on disk, quiet
      for (const auto& e : std::filesystem::directory_iterator(root / "ckpt"))
        if (e.path().filename().string().starts_with("global_step")) std::filesystem::remove_all(e.path());
      std::filesystem::remove(root / "raw.bin");
      ::sync();
      ::sleep(pause);
    };
    auto do_raw = [&] {
      settle();
      const auto t0 = clock_type::now();
      in_write = raw_write(s, root / "raw.bin");
      raw = since(t0);
    };
    auto do_save = [&] {
      settle();
      const auto t0 = clock_type::now();
      cp.save(static_cast<std::uint64_t>(r + 1), s);
      saved = since(t0);
    };
    if (r % 2 == 0) do_raw(), do_save();
    else do_save(), do_raw();
    // Cold reads of both, each from a settled disk with its file out of the page cache, order
    // alternating. Whichever output the second writer's settling deleted is written again first.
    if (r % 2 == 0) (void)raw_write(s, root / "raw.bin");
    else cp.save(static_cast<std::uint64_t>(r + 1), s);
    double read = 0, loaded = 0;
    auto do_read = [&] {
      drop_cache(root / "raw.bin");
      ::sync();
      ::sleep(pause);
      const auto t0 = clock_type::now();
      raw_read(back, root / "raw.bin");
      read = since(t0);
    };
    auto do_load = [&] {
      drop_cache(root / "ckpt");
      ::sync();
      ::sleep(pause);
      const auto t0 = clock_type::now();
      cp.load(back);
      loaded = since(t0);
    };
    if (r % 2 == 0) do_read(), do_load();
    else do_load(), do_read();
    std::printf("%6d %8.3f %10.3f %8.3f %8.3f %11.3f %11.3f %8.3f\n", r, raw, in_write, saved, raw / saved, read, loaded,
                read / loaded);
    std::fflush(stdout);
    if (r > 0) {  // round 0 warms up
      raw_s.push_back(raw), save_s.push_back(saved), ratio.push_back(raw / saved), read_ratio.push_back(read / loaded);
      std::printf("settled_save_ratio %.6g\n", raw / saved);  // for bench/report.py
      std::printf("settled_load_cold_ratio %.6g\n", read / loaded);
    }
  }
  if (!back.same_bytes(s)) {
    std::fprintf(stderr, "loaded bytes differ from the saved ones\n");
    return 1;
  }
  std::printf("median of rounds 1-%d: raw %.3f s, save %.3f s, raw/save %.3f; cold read/load %.3f\n", rounds - 1,
              median(raw_s), median(save_s), median(ratio), median(read_ratio));
  std::filesystem::remove_all(root);
}
