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

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// save_load's workloads: 200 tensors sized like a transformer's (every eighth four times the
/// others), `gib` of fp32 in all ("fp32"), or the same in bf16 plus two fp32 Adam moments each
/// ("bf16_adam"); values N(0, 0.02).
struct tensor_buf {
  std::string name;
  ckpt::dtype type;
  std::vector<std::byte> bytes;
};
struct state {
  std::vector<tensor_buf> tensors;
  void checkpoint(ckpt::visitor& v) {
    for (auto& t : tensors) {
      const auto n = t.bytes.size() / ckpt::size_of(t.type);
      v.tensor(t.name, ckpt::tensor_ref(t.type, {n / 1024, 1024}, t.bytes.data()));
    }
  }
};

state make_state(const std::string& workload, double gib) {
  state s;
  std::vector<double> weight(200);
  double sum = 0;
  for (std::size_t i = 0; i < weight.size(); ++i) sum += weight[i] = (i % 8 == 0) ? 4.0 : (i % 8 < 4 ? 1.0 : 0.5);
  auto add = [&](std::string name, ckpt::dtype type, std::size_t n) {
    s.tensors.push_back({std::move(name), type, std::vector<std::byte>(n * ckpt::size_of(type))});
  };
  for (std::size_t i = 0; i < weight.size(); ++i) {
    const auto n = static_cast<std::size_t>(weight[i] / sum * gib * (1u << 30) / 4) / 1024 * 1024;
    const auto name = "layers." + std::to_string(i);
    if (workload == "fp32") {
      add(name, ckpt::dtype::f32, n);
    } else if (workload == "bf16_adam") {
      add(name, ckpt::dtype::bf16, n);
      add("optimizer." + name + ".exp_avg", ckpt::dtype::f32, n);
      add("optimizer." + name + ".exp_avg_sq", ckpt::dtype::f32, n);
    } else {
      std::fprintf(stderr, "unknown workload %s\n", workload.c_str());
      std::exit(2);
    }
  }
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < 2; ++t)
    pool.emplace_back([&, t] {
      for (std::size_t i = t; i < s.tensors.size(); i += 2) {
        auto& b = s.tensors[i];
        std::mt19937_64 g(i);
        std::normal_distribution<float> d(0.f, 0.02f);
        if (b.type == ckpt::dtype::f32)
          for (std::size_t k = 0; k < b.bytes.size() / 4; ++k) reinterpret_cast<float*>(b.bytes.data())[k] = d(g);
        else
          for (std::size_t k = 0; k < b.bytes.size() / 2; ++k)
            reinterpret_cast<ckpt::bfloat16*>(b.bytes.data())[k] = ckpt::bfloat16(d(g));
      }
    });
  for (auto& t : pool) t.join();
  return s;
}

/// Every tensor written with write(2) into one new file, then fsync. Returns the seconds spent
/// inside write calls; the caller times the whole.
double raw_write(const state& s, const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) std::exit(1);
  double in_write = 0;
  for (const auto& t : s.tensors) {
    const auto* p = reinterpret_cast<const char*>(t.bytes.data());
    std::size_t done = 0, size = t.bytes.size();
    const auto t0 = clock_type::now();
    while (done < size) {
      const auto n = ::write(fd, p + done, size - done);
      if (n <= 0) std::exit(1);
      done += static_cast<std::size_t>(n);
    }
    in_write += since(t0);
  }
  if (::fsync(fd) != 0) std::exit(1);
  ::close(fd);
  return in_write;
}

/// The same file read back in order into the state's buffers.
void raw_read(state& s, const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) std::exit(1);
  for (auto& t : s.tensors) {
    std::size_t done = 0;
    while (done < t.bytes.size()) {
      const auto n = ::read(fd, t.bytes.data() + done, t.bytes.size() - done);
      if (n <= 0) std::exit(1);
      done += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
}

/// Drops every file under `p` from the page cache (clean after fsync), so reads go to the disk.
void drop_cache(const std::filesystem::path& p) {
  auto drop = [](const std::filesystem::path& f) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  if (std::filesystem::is_directory(p)) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(p))
      if (e.is_regular_file()) drop(e.path());
  } else {
    drop(p);
  }
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
  if (back.tensors[0].bytes != s.tensors[0].bytes) {
    std::fprintf(stderr, "loaded bytes differ from the saved ones\n");
    return 1;
  }
  std::printf("median of rounds 1-%d: raw %.3f s, save %.3f s, raw/save %.3f; cold read/load %.3f\n", rounds - 1,
              median(raw_s), median(save_s), median(ratio), median(read_ratio));
  std::filesystem::remove_all(root);
}
