// What retention costs a save: the same state saved by two checkpointers in one process, one
// with keep_last_n = 1 (each save retires the tag before it) and one keeping every tag, whose
// old tag this program prunes right after each save, outside the timing. Before each save both
// wait the same `--compute` seconds, standing for the training steps between checkpoints (on
// posix, retention deletes the retired tag's files on a thread of its own, which that time
// absorbs), after `sync`. The order alternates from round to round; round 0, which has nothing
// to delete, warms up. Prints per round both saves, their ratio, and how long the deletion the
// keep_last_n save started goes on after the save has returned (`wait()` right after it, outside
// the timing; 0 where the save deleted before returning).
//
//   bench/retention [--workload fp32|bf16_adam] [--dir /var/tmp] [--gib 1] [--rounds 6] [--compute 3]

#include <ckpt/ckpt.hpp>

#include "workload.hpp"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

using namespace bench;

int main(int argc, char** argv) {
  std::filesystem::path dir = "/var/tmp";
  double gib = 1;
  int rounds = 6;
  unsigned compute = 3;
  std::string workload = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--workload") workload = v;
    else if (a == "--gib") gib = std::stod(v);
    else if (a == "--rounds") rounds = std::stoi(v);
    else if (a == "--compute") compute = static_cast<unsigned>(std::stoul(v));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (rounds < 2) die("--rounds must be at least 2 (round 0 warms up)");
  const auto root = dir / ("ckpt-retention-" + std::to_string(::getpid()));
  std::filesystem::create_directories(root / "keep_one");
  std::filesystem::create_directories(root / "keep_all");
  auto s = make_state(workload, gib);
  using disk_checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::posix>;
  disk_checkpointer keep_one{{}, root / "keep_one", {.keep_last_n = 1}};
  disk_checkpointer keep_all{{}, root / "keep_all"};
  std::vector<double> one_s, all_s, ratio, deletion_s;
  std::printf("%6s %12s %12s %8s %12s\n", "round", "keep_one_s", "keep_all_s", "ratio", "deletion_s");
  for (int r = 0; r < rounds; ++r) {
    const auto step = static_cast<std::uint64_t>(r + 1);
    double one = 0, all = 0, deletion = 0;
    for (int k = 0; k < 2; ++k) {
      ::sync();
      ::sleep(compute);
      if ((r + k) % 2 == 0) {
        const auto t0 = clock_type::now();
        keep_one.save(step, s);
        one = since(t0);
        const auto t1 = clock_type::now();
        keep_one.wait();  // the deletion it left running, if any
        deletion = since(t1);
      } else {
        const auto t0 = clock_type::now();
        keep_all.save(step, s);
        all = since(t0);
        (void)keep_all.prune(1);  // the same deletion, outside the timing
      }
    }
    std::printf("%6d %12.3f %12.3f %8.3f %12.3f\n", r, one, all, one / all, deletion);
    std::fflush(stdout);
    if (r == 0) continue;
    one_s.push_back(one), all_s.push_back(all), ratio.push_back(one / all), deletion_s.push_back(deletion);
    std::printf("retention_keep_one_save_s %.6g\nretention_keep_all_save_s %.6g\n", one, all);  // for bench/report.py
    std::printf("retention_save_ratio %.6g\nretention_deletion_after_s %.6g\n", one / all, deletion);
  }
  std::printf("median of rounds 1-%d: save keeping 1 %.3f s, keeping all %.3f s, ratio %.3f; deletion after the save %.3f s\n",
              rounds - 1, median(one_s), median(all_s), median(ratio), median(deletion_s));
  std::filesystem::remove_all(root);
  return 0;
}
