// The C++ peer: libtorch's torch::save (+ fsync) and torch::load of the same tensors
// bench/save_load builds (same shapes and dtypes, values from N(0, 0.02)). Built only when
// Debian's libtorch-dev is installed. Prints "name seconds" lines for bench/report.py, and the
// peak resident memory the save and the loads added to the process's (libtorch_extra_peak_rss_mib).
//
//   bench/libtorch_peer --dir /var/tmp --workload fp32|bf16_adam --gib 1

#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// Mirrors element_counts() in save_load.cpp.
std::vector<std::int64_t> element_counts(std::uint64_t total_fp32_bytes) {
  std::vector<double> weight(200);
  for (std::size_t i = 0; i < weight.size(); ++i) weight[i] = (i % 8 == 0) ? 4.0 : (i % 8 < 4 ? 1.0 : 0.5);
  double sum = 0;
  for (auto w : weight) sum += w;
  std::vector<std::int64_t> counts;
  for (auto w : weight)
    counts.push_back(static_cast<std::int64_t>(w / sum * static_cast<double>(total_fp32_bytes) / 4) / 1024 * 1024);
  return counts;
}

/// VmHWM (the peak resident set) of this process, in MiB.
double peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  return 0;
}

void sync_and_drop(const std::string& path, bool drop) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  if (drop) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp", workload = "fp32";
  double gib = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--workload") workload = v;
    else if (a == "--gib") gib = std::stod(v);
  }
  torch::manual_seed(0);
  std::vector<torch::Tensor> tensors;
  for (auto n : element_counts(static_cast<std::uint64_t>(gib * 1024 * 1024 * 1024))) {
    auto t = torch::randn({n / 1024, 1024}) * 0.02;
    if (workload == "fp32") {
      tensors.push_back(t);
    } else {
      tensors.push_back(t.to(torch::kBFloat16));
      tensors.push_back(torch::randn({n / 1024, 1024}) * 0.02);
      tensors.push_back(torch::randn({n / 1024, 1024}) * 0.02);
    }
  }
  const auto path = dir + "/libtorch-peer-" + std::to_string(::getpid()) + ".pt";
  const double rss_before = peak_rss_mib();  // the tensors are made and touched
  ::sync();
  ::sleep(3);  // start from a settled disk, as the peers do (report.py rotates their order)
  auto t0 = clock_type::now();
  torch::save(tensors, path);
  sync_and_drop(path, false);  // fsync the file torch::save wrote
  std::printf("libtorch_save_s %.6f\n", since(t0));
  sync_and_drop(path, true);
  ::sync();
  ::sleep(3);  // as torch_peer.py does: the disk slows down for seconds after a burst of writes
  std::vector<torch::Tensor> back;
  t0 = clock_type::now();
  torch::load(back, path);
  std::printf("libtorch_load_cold_s %.6f\n", since(t0));
  back.clear();
  t0 = clock_type::now();
  torch::load(back, path);
  std::printf("libtorch_load_warm_s %.6f\n", since(t0));
  // torch::load allocates the tensors it returns: the loads' share includes one copy of the state.
  std::printf("libtorch_extra_peak_rss_mib %.3f\n", peak_rss_mib() - rss_before);
  const bool same = back.size() == tensors.size() && torch::equal(back[0], tensors[0]);
  std::filesystem::remove(path);
  return same ? 0 : 1;
}
