#pragma once
// What the two GPU proofs (gpu_proof.cpp: device_copy; gpu_proof_nccl.cpp: the NCCL
// communicator) share: result rows written as soon as they are measured, sections that catch
// their own failures so the next one still runs, and device buffers whose every CUDA call and
// kernel launch is checked.
//
// A row is one line of tab-separated fields, to stdout and (with --results FILE) appended to
// FILE and flushed at once, so a run cut short by a timeout still leaves every row it measured:
//
//   status   section   what   value   detail
//
// status is `ok`, `FAIL`, `not-run` (a part that cannot run here, with the reason) or `figure`
// (a measurement: value is the ratio, detail the measured and limit figures).

#include <cuda_runtime_api.h>

#include <ckpt/ckpt.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.hpp"

namespace gpu_proof {

/// Every row goes to stdout and, when given, to the results file.
class report {
 public:
  explicit report(const std::string& results_file) {
    if (!results_file.empty()) {
      file_ = std::fopen(results_file.c_str(), "a");
      if (!file_) std::fprintf(stderr, "cannot open %s: results go to stdout only\n", results_file.c_str());
    }
  }
  ~report() {
    if (file_) std::fclose(file_);
  }
  report(const report&) = delete;
  report& operator=(const report&) = delete;

  void row(const std::string& status, const std::string& what, const std::string& value = "", const std::string& detail = "") {
    const std::string line = status + "\t" + section_ + "\t" + what + "\t" + value + "\t" + detail + "\n";
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
    if (file_) {
      std::fputs(line.c_str(), file_);
      std::fflush(file_);
    }
    if (status == "FAIL") ++failures_;
  }
  void check(bool ok, const std::string& what, const std::string& detail = "") { row(ok ? "ok" : "FAIL", what, "", detail); }
  void not_run(const std::string& what, const std::string& why) { row("not-run", what, "", why); }
  void figure(const std::string& what, double ratio, const std::string& detail) {
    char v[32];
    std::snprintf(v, sizeof v, "%.2f", ratio);
    row("figure", what, v, detail);
  }

  /// Runs one section; whatever it throws is a FAIL row with the error's text, and the proof
  /// goes on with the next section.
  template <class F>
  void section(const std::string& name, F&& body) {
    section_ = name;
    const auto start = std::chrono::steady_clock::now();
    try {
      body();
    } catch (const ckpt::error& e) {
      row("FAIL", "section ended by a ckpt::error", "", std::string(to_string(e.kind())) + ": " + e.what());
    } catch (const std::exception& e) {
      row("FAIL", "section ended by an exception", "", e.what());
    }
    char took[32];
    std::snprintf(took, sizeof took, "%.1f s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    row("time", "section took", took);
  }

  /// Names the section of the rows that follow, outside `section`.
  void begin(const std::string& name) { section_ = name; }

  int failures() const { return failures_; }

 private:
  std::FILE* file_ = nullptr;
  std::string section_ = "setup";
  int failures_ = 0;
};

/// A CUDA call that must succeed: its failure throws, naming the call (the section reports it).
inline void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
}

/// A kernel launch: checked at once (a bad configuration fails the launch itself), and its
/// execution checked by the next synchronising call.
inline void launched(const char* what) { cuda(cudaGetLastError(), what); }

/// One device buffer viewed as a 1-d tensor of `type`.
struct gpu_tensor {
  ckpt::dtype type;
  std::uint64_t bytes;
  void* p = nullptr;
  int gpu = 0;
  gpu_tensor(ckpt::dtype t, std::uint64_t n, int on = 0) : type(t), bytes(n / ckpt::size_of(t) * ckpt::size_of(t)), gpu(on) {
    cuda(cudaSetDevice(gpu), "cudaSetDevice");
    cuda(cudaMalloc(&p, std::max<std::uint64_t>(bytes, 1)), "cudaMalloc");
  }
  ~gpu_tensor() {
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
  }
  gpu_tensor(const gpu_tensor&) = delete;
  gpu_tensor& operator=(const gpu_tensor&) = delete;
  ckpt::tensor_ref ref() const { return ckpt::tensor_ref(type, {bytes / ckpt::size_of(type)}, p, ckpt::device::cuda(gpu)); }
  bool boolean() const { return type == ckpt::dtype::boolean; }
  void fill(std::uint32_t seed, cudaStream_t s, long long spin_cycles = 0) const {
    cuda(cudaSetDevice(gpu), "cudaSetDevice");
    fill_pattern(p, bytes, seed, boolean(), s, spin_cycles);
    launched("fill_pattern launch");
  }
  /// Bytes that differ from the pattern of `seed` (synchronous; every call checked).
  std::uint64_t mismatches(std::uint32_t seed) const {
    cuda(cudaSetDevice(gpu), "cudaSetDevice");
    std::uint64_t bad = 0;
    cuda(count_mismatches(p, bytes, seed, boolean(), &bad), "count_mismatches");
    return bad;
  }
};

inline double seconds_of(auto&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// "4 GiB", "64 MiB".
inline std::string size_name(std::uint64_t bytes) {
  return bytes % (std::uint64_t{1} << 30) == 0 ? std::to_string(bytes >> 30) + " GiB" : std::to_string(bytes >> 20) + " MiB";
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// The options both proofs take: DIR, --quick, --big-gib N (or --big-mib N), --reps N, --results FILE.
struct options {
  std::string dir;
  std::uint64_t big_bytes = std::uint64_t{4} << 30;  ///< the largest tensor
  int reps = 5;
  std::string results;
  bool quick = false;
};

inline options parse(int argc, char** argv, const char* name) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--quick") {
      o.quick = true;
      o.big_bytes = std::uint64_t{1} << 30;
      o.reps = 3;
    } else if (a == "--big-gib") {
      o.big_bytes = std::stoull(next()) << 30;
    } else if (a == "--big-mib") {  // for runs on the fake libraries (tests/cuda/fake_libs)
      o.big_bytes = std::stoull(next()) << 20;
    } else if (a == "--reps") {
      o.reps = std::stoi(next());
    } else if (a == "--results") {
      o.results = next();
    } else if (o.dir.empty() && !a.starts_with("--")) {
      o.dir = a;
    } else {
      throw std::invalid_argument("unknown argument " + a);
    }
  }
  if (o.dir.empty() || o.big_bytes == 0 || o.reps < 1)
    throw std::invalid_argument(std::string("usage: ") + name + " DIR [--quick] [--big-gib N | --big-mib N] [--reps N] [--results FILE]");
  return o;
}

/// The device count, or a reason there is none (the driver's error: no GPU, or a driver older
/// than the runtime this was built with).
inline int devices(std::string& why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    (void)cudaGetLastError();
    return 0;
  }
  if (n == 0) why = "no CUDA device";
  return n;
}

}  // namespace gpu_proof
