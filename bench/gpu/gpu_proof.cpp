// The GPU proof of ckpt::cuda::device_copy on a real GPU (issues 8 and 20): round trips of
// device tensors of every dtype from 1 byte to --big-gib GiB (to disk and back, and into host
// memory), ordering with the user's stream, save_async with the tensor overwritten at once, the
// CUDA contract (the caller's device and last-error slot left as they were; a user stream on
// another GPU where there are two), then throughput against cudaMemcpy and the fastest raw
// write of the same bytes, measured in the same run. The NCCL communicator has its own proof
// (gpu_proof_nccl.cpp), so that this one runs where NCCL's library is missing.
//
//   gpu_proof DIR [--quick] [--big-gib N | --big-mib N] [--reps N] [--results FILE]
//
// DIR is a directory on local disk for the checkpoints. --quick: 1 GiB, 3 repetitions. Every
// row is printed (and appended to FILE) as soon as it is measured; see proof.hpp. Exit status:
// 0 when every check passed, 1 when one failed, 77 when there is no usable GPU, 2 on bad
// arguments. bench/gpu/device_run.sh runs it from a prepared build.

#include <fcntl.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/cuda/device_copy.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "proof.hpp"

namespace fs = std::filesystem;
using gpu_proof::cuda;
using gpu_proof::gpu_tensor;
using gpu_proof::median;
using gpu_proof::seconds_of;

namespace {

struct gpu_state {
  std::vector<gpu_tensor*> tensors;
  template <class V>
  void checkpoint(V& v) {
    for (std::size_t i = 0; i < tensors.size(); ++i) v.tensor("t" + std::to_string(i), tensors[i]->ref());
  }
};

/// The same tensors' shapes in host memory, for a load with no GPU policy.
struct host_state {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ckpt::dtype> types;
  template <class V>
  void checkpoint(V& v) {
    for (std::size_t i = 0; i < bufs.size(); ++i)
      v.tensor("t" + std::to_string(i), ckpt::tensor_ref(types[i], {bufs[i].size() / ckpt::size_of(types[i])}, bufs[i].data()));
  }
};

using gpu_checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::raw, ckpt::cuda::device_copy>;

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GB/s", bytes);
  return b;
}

/// The thread's current device, and whether its last-error slot is clean.
struct caller_view {
  int device = -1;
  bool clean = true;
  static caller_view now() {
    caller_view v;
    if (cudaGetDevice(&v.device) != cudaSuccess) v.device = -1;
    v.clean = cudaPeekAtLastError() == cudaSuccess;
    return v;
  }
};

}  // namespace

int main(int argc, char** argv) {
  gpu_proof::options opt;
  try {
    opt = gpu_proof::parse(argc, argv, "gpu_proof");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  gpu_proof::report out(opt.results);
  const fs::path dir = opt.dir;
  std::string why;
  const int devices = gpu_proof::devices(why);
  if (devices == 0) {
    out.not_run("every section", why);
    return 77;
  }
  cudaDeviceProp prop{};
  cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  out.row("info", "device 0", prop.name,
          std::to_string(prop.totalGlobalMem >> 30) + " GiB; " + std::to_string(devices) + " GPU(s); driver CUDA " +
              std::to_string(driver) + ", runtime " + std::to_string(runtime));
  cudaStream_t user = nullptr;
  cuda(cudaSetDevice(0), "cudaSetDevice");
  cuda(cudaStreamCreate(&user), "cudaStreamCreate");
  std::error_code ec;
  fs::create_directories(dir, ec);

  // (a) Round trips of every dtype and sizes from 1 byte: device -> disk -> device, and
  //     device -> disk -> host memory with no GPU policy.
  out.section("round trips", [&] {
    const ckpt::dtype types[] = {ckpt::dtype::f64, ckpt::dtype::f32, ckpt::dtype::f16, ckpt::dtype::bf16, ckpt::dtype::i64,
                                 ckpt::dtype::i32, ckpt::dtype::i16, ckpt::dtype::i8,  ckpt::dtype::u8,   ckpt::dtype::boolean};
    // The largest size is 64 MiB, or the big tensor's where that is smaller: --big-mib 32 on the
    // fakes, whose kernels and checks go a byte at a time on the CPU.
    const std::uint64_t largest = std::min(std::uint64_t{64} << 20, opt.big_bytes);
    for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{1000}, (std::uint64_t{1} << 20) + 8, largest}) {
      std::vector<std::unique_ptr<gpu_tensor>> owned;
      gpu_state s;
      for (auto t : types) {
        if (size < ckpt::size_of(t)) continue;
        owned.push_back(std::make_unique<gpu_tensor>(t, size));
        s.tensors.push_back(owned.back().get());
      }
      for (std::size_t i = 0; i < s.tensors.size(); ++i) s.tensors[i]->fill(static_cast<std::uint32_t>(i), user);
      const auto root = dir / ("roundtrip-" + std::to_string(size));
      fs::remove_all(root);
      gpu_checkpointer cp{{}, root, {}, {}, ckpt::cuda::device_copy{{}, user}};
      cp.save(1, s);
      for (auto* t : s.tensors) cuda(cudaMemset(t->p, 0xAB, t->bytes), "cudaMemset");
      cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      cp.load(s);
      std::uint64_t bad = 0;
      for (std::size_t i = 0; i < s.tensors.size(); ++i) bad += s.tensors[i]->mismatches(static_cast<std::uint32_t>(i));
      out.check(bad == 0, "device -> disk -> device, " + std::to_string(s.tensors.size()) + " dtypes of " + std::to_string(size) + " bytes",
                bad ? std::to_string(bad) + " bytes differ" : "");
      host_state h;
      for (auto* t : s.tensors) {
        h.bufs.emplace_back(t->bytes);
        h.types.push_back(t->type);
      }
      ckpt::checkpointer<ckpt::single_process, ckpt::posix> host_cp{{}, root};
      host_cp.load(h);
      bad = 0;
      for (std::size_t i = 0; i < h.bufs.size(); ++i)
        for (std::uint64_t k = 0; k < h.bufs[i].size(); ++k)
          bad += static_cast<unsigned char>(h.bufs[i][k]) !=
                 gpu_proof::host_pattern_byte(k, static_cast<std::uint32_t>(i), h.types[i] == ckpt::dtype::boolean);
      out.check(bad == 0, "device -> disk -> host-only load, " + std::to_string(size) + " bytes", bad ? std::to_string(bad) + " bytes differ" : "");
      fs::remove_all(root);
    }
  });

  out.section("big tensor", [&] {
    gpu_tensor big(ckpt::dtype::f32, opt.big_bytes);
    gpu_state s{{&big}};
    big.fill(99, user);
    const auto root = dir / "big";
    fs::remove_all(root);
    gpu_checkpointer cp{{}, root, {}, {}, ckpt::cuda::device_copy{{}, user}};
    cp.save(1, s);
    cuda(cudaMemset(big.p, 0, big.bytes), "cudaMemset");
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cp.load(s);
    out.check(big.mismatches(99) == 0, "round trip of one " + gpu_proof::size_name(opt.big_bytes) + " tensor");
    fs::remove_all(root);
  });

  // Stream ordering: a slow kernel writes the tensor just before save; save must see its bytes.
  out.section("ordering", [&] {
    gpu_tensor t(ckpt::dtype::f32, 64 << 20);
    gpu_state s{{&t}};
    t.fill(1, user);
    cuda(cudaStreamSynchronize(user), "cudaStreamSynchronize");
    t.fill(2, user, 200'000'000);  // ~0.1 s of spinning first
    const auto root = dir / "ordering";
    fs::remove_all(root);
    gpu_checkpointer cp{{}, root, {}, {}, ckpt::cuda::device_copy{{}, user}};
    cp.save(1, s);
    cuda(cudaMemsetAsync(t.p, 0, t.bytes, user), "cudaMemsetAsync");
    cp.load(s);
    cuda(cudaStreamSynchronize(user), "cudaStreamSynchronize");
    out.check(t.mismatches(2) == 0, "save observes the kernel enqueued just before it on the user's stream");

    t.fill(3, user);
    auto h = cp.save_async(2, s);
    t.fill(4, user);
    cuda(cudaStreamSynchronize(user), "cudaStreamSynchronize");
    h.wait();
    cp.load(s);
    cuda(cudaStreamSynchronize(user), "cudaStreamSynchronize");
    out.check(t.mismatches(3) == 0, "save_async keeps the bytes of its call, not those written after it returned");
    fs::remove_all(root);
  });

  // The CUDA contract a host engine relies on.
  out.section("contract", [&] {
    gpu_tensor t(ckpt::dtype::bf16, 24 << 20);
    gpu_state s{{&t}};
    const auto root = dir / "contract";
    fs::remove_all(root);
    gpu_checkpointer cp{{}, root, {}, {}, ckpt::cuda::device_copy{{}, user}};
    t.fill(7, user);
    cuda(cudaSetDevice(devices - 1), "cudaSetDevice");  // the engine's own device
    cp.save(1, s);
    auto v = caller_view::now();
    out.check(v.device == devices - 1, "save leaves the caller's current device (cuda:" + std::to_string(devices - 1) + ") current",
              "found cuda:" + std::to_string(v.device));
    out.check(v.clean, "save leaves nothing in the caller's last-error slot", cudaGetErrorName(cudaPeekAtLastError()));
    cp.load(s);
    v = caller_view::now();
    out.check(v.device == devices - 1 && v.clean, "load leaves the caller's device and last-error slot as they were");
    // A thread with no current context gets none from ckpt.
    int fresh_thread_device = -2;
    std::string thread_error;
    std::thread([&] {
      try {
        cp.save(2, s);
      } catch (const std::exception& e) {
        thread_error = e.what();
      }
      fresh_thread_device = caller_view::now().device;
    }).join();
    out.check(thread_error.empty(), "save from a thread that never chose a device", thread_error);
    cuda(cudaSetDevice(0), "cudaSetDevice");
    out.check(t.mismatches(7) == 0, "the contract section's bytes round-trip");
    out.row("info", "a fresh thread's device after a save (0 is CUDA's default)", std::to_string(fresh_thread_device));
    if (devices < 2) {
      out.not_run("a user stream on another GPU than the tensor", "needs two GPUs; this machine has one (tested on the fakes)");
    } else {
      cudaStream_t other = nullptr;
      cuda(cudaSetDevice(1), "cudaSetDevice");
      cuda(cudaStreamCreate(&other), "cudaStreamCreate");
      gpu_checkpointer cross{{}, dir / "contract-cross", {}, {}, ckpt::cuda::device_copy{{}, other}};
      cuda(cudaSetDevice(0), "cudaSetDevice");
      t.fill(8, user);
      cuda(cudaStreamSynchronize(user), "cudaStreamSynchronize");
      cross.save(1, s);
      cuda(cudaMemset(t.p, 0, t.bytes), "cudaMemset");
      cross.load(s);
      cuda(cudaStreamSynchronize(other), "cudaStreamSynchronize");
      out.check(t.mismatches(8) == 0, "a user stream on cuda:1, the tensor on cuda:0: save and load");
      cudaStreamDestroy(other);
      fs::remove_all(dir / "contract-cross");
    }
    fs::remove_all(root);
  });

  // (c) Throughput, each against its limit measured here, medians of --reps.
  out.section("throughput", [&] {
    const std::uint64_t bytes = opt.big_bytes;
    const std::string size = gpu_proof::size_name(bytes) + ", medians of " + std::to_string(opt.reps);
    gpu_tensor t(ckpt::dtype::f32, bytes);
    t.fill(5, user);
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    void* pinned = nullptr;
    cuda(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    std::unique_ptr<void, void (*)(void*)> pinned_owner(pinned, [](void* p) { cudaFreeHost(p); });
    std::vector<std::byte> pageable(bytes);
    std::vector<double> d2h, h2d, staged, staged_waited, staged16, ring, save, async_block, load;
    // The raw writers and readers: `depth` threads, each with one request of `piece` bytes in
    // flight. The fastest of them is the limit a save (or a load) is held to.
    struct raw_way {
      unsigned depth;
      std::uint64_t piece;
      const char* name;
      std::vector<double> write_s{}, read_s{};
    };
    raw_way raw_ways[] = {{1, 8 << 20, "one 8 MiB request at a time"},
                          {8, 8 << 20, "8 requests of 8 MiB in flight"},
                          {32, 1 << 20, "32 requests of 1 MiB in flight"}};
    ckpt::cuda::device_copy dev{{}, user};
    // The save pipeline's staging: chunk after chunk into the pinned buffers device_copy lends
    // it, 4 in flight, each enqueued (start_to_host) before the previous one has landed, and
    // waited for before its buffer is reused, as write_shard's stage and workers do.
    auto stage_chunks = [&](std::uint64_t chunk) {
      std::vector<ckpt::lent_buffer> slots;
      for (int k = 0; k < 4; ++k) slots.push_back(dev.lend(chunk));
      std::vector<ckpt::cuda::device_copy::host_copy> in_flight(slots.size());
      return seconds_of([&] {
        std::uint64_t k = 0;
        for (std::uint64_t at = 0; at < bytes; at += chunk, ++k) {
          const auto n = std::min(chunk, bytes - at);
          auto& h = in_flight[k % slots.size()];
          h.wait();
          h = dev.start_to_host(t.ref(), at, {slots[k % slots.size()].data(), n});
        }
        for (auto& h : in_flight) h.wait();
      });
    };
    // As the pipeline staged until 2026-12-05: each chunk's copy waited for (to_host) before
    // the next was enqueued.
    auto stage_chunks_waited = [&](std::uint64_t chunk) {
      std::vector<ckpt::lent_buffer> slots;
      for (int k = 0; k < 4; ++k) slots.push_back(dev.lend(chunk));
      return seconds_of([&] {
        std::uint64_t k = 0;
        for (std::uint64_t at = 0; at < bytes; at += chunk, ++k) {
          const auto n = std::min(chunk, bytes - at);
          dev.to_host(t.ref(), at, {slots[k % slots.size()].data(), n});
        }
      });
    };
    // A raw write: O_DIRECT from the pinned (page-aligned) buffer into a new file `f`, its space
    // allocated first where more than one request is in flight, then fsync. A raw read (`read`)
    // moves the file back into the pinned buffer the same way. Through the page cache where the
    // file system refuses O_DIRECT (and the figures say so).
    bool direct = true;
    const auto write_file = dir / "raw.bin", read_file = dir / "raw-read.bin";
    auto raw = [&](unsigned depth, std::uint64_t piece, const fs::path& f, bool read) {
      const int flags = read ? O_RDONLY : O_WRONLY | O_CREAT | O_TRUNC;
      int fd = direct ? ::open(f.c_str(), flags | O_DIRECT, 0644) : -1;
      if (fd < 0) {
        direct = false;
        fd = ::open(f.c_str(), flags, 0644);
      }
      if (fd < 0) throw std::runtime_error("cannot open " + f.string() + ": " + std::strerror(errno));
      if (!read && depth > 1 && ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
        ::close(fd);
        throw std::runtime_error("fallocate of " + f.string() + " failed: " + std::strerror(errno));
      }
      std::atomic<std::uint64_t> next{0};
      std::atomic<int> error{0};
      auto writer = [&] {
        for (std::uint64_t at; !error && (at = next.fetch_add(piece)) < bytes;) {
          const auto want = std::min(piece, bytes - at);
          for (std::uint64_t done = 0; done < want;) {
            auto* p = static_cast<char*>(pinned) + at + done;
            const auto n = read ? ::pread(fd, p, want - done, static_cast<off_t>(at + done))
                                : ::pwrite(fd, p, want - done, static_cast<off_t>(at + done));
            if (n <= 0) {
              error = n < 0 ? errno : EIO;
              return;
            }
            done += static_cast<std::uint64_t>(n);
          }
        }
      };
      {
        std::vector<std::jthread> pool;
        for (unsigned w = 1; w < depth; ++w) pool.emplace_back(writer);
        writer();
      }
      if (error == EINVAL && direct && depth == 1) {  // refused: the page cache from now on
        ::close(fd);
        direct = false;
        return;
      }
      if (error) {
        ::close(fd);
        throw std::runtime_error(std::string("raw ") + (read ? "read" : "write") + " of " + f.string() + " failed: " + std::strerror(error));
      }
      if (!read) ::fsync(fd);
      ::close(fd);
    };
    const auto root = dir / "throughput", async_root = dir / "throughput-async";
    fs::remove_all(root);
    fs::remove_all(async_root);
    // What this section writes is removed however it ends: a failure is one FAIL row, and the
    // next section runs on the same disk.
    struct removed_at_end {
      std::vector<fs::path> paths;
      ~removed_at_end() {
        std::error_code ec;
        for (const auto& p : paths) fs::remove_all(p, ec);
      }
    } cleanup{{root, async_root, read_file, write_file}};
    gpu_state s{{&t}};
    gpu_checkpointer cp{{}, root, {}, {}, ckpt::cuda::device_copy{{}, user}};
    // Lent pinned memory for the whole snapshot (and the pipeline): the snapshot is one copy.
    gpu_checkpointer acp{
        {}, async_root, {}, {}, ckpt::cuda::device_copy{{}, user, {.lend_bytes = static_cast<std::size_t>(bytes) + (std::size_t{512} << 20)}}};
    // Warm-ups: pinned buffers are allocated once and reused, as in training.
    (void)stage_chunks(std::uint64_t{4} << 20);
    (void)stage_chunks(std::uint64_t{16} << 20);
    cp.save(1, s);
    acp.save_async(1, s).wait();
    auto drop = [](const fs::path& r, std::uint64_t iteration) { fs::remove_all(r / ckpt::default_tag(iteration)); };
    // The file the raw reads read: the tensor's bytes. Its write also finds a refused O_DIRECT
    // (and then writes it again, through the page cache) before the timed writes.
    cuda(cudaMemcpy(pinned, t.p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    raw(1, 8 << 20, read_file, false);
    if (!direct) raw(1, 8 << 20, read_file, false);
    cp.load(s);  // the load's pinned read buffers, lent once, as the saves' were
    for (int r = 0; r < opt.reps; ++r) {
      const auto it = static_cast<std::uint64_t>(r) + 2;
      d2h.push_back(seconds_of([&] { cuda(cudaMemcpy(pinned, t.p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy"); }));
      staged.push_back(stage_chunks(std::uint64_t{4} << 20));
      staged_waited.push_back(stage_chunks_waited(std::uint64_t{4} << 20));
      staged16.push_back(stage_chunks(std::uint64_t{16} << 20));
      ring.push_back(seconds_of([&] { dev.to_host(t.ref(), 0, pageable); }));
      for (auto& w : raw_ways) {
        fs::remove(write_file);  // outside the time, as the save's old tag is dropped before it
        w.write_s.push_back(seconds_of([&] { raw(w.depth, w.piece, write_file, false); }));
      }
      drop(root, it - 1);
      save.push_back(seconds_of([&] { cp.save(it, s); }));
      drop(async_root, it - 1);
      ckpt::save_handle h;
      async_block.push_back(seconds_of([&] { h = acp.save_async(it, s); }));
      h.wait();
      // A restart's load: the file just saved back into the GPU tensor (zeroed first), against
      // the raw reads of the same bytes into pinned memory, which stop short of the GPU.
      for (auto& w : raw_ways) w.read_s.push_back(seconds_of([&] { raw(w.depth, w.piece, read_file, true); }));
      h2d.push_back(seconds_of([&] { cuda(cudaMemcpy(t.p, pinned, bytes, cudaMemcpyHostToDevice), "cudaMemcpy"); }));
      cuda(cudaMemset(t.p, 0, bytes), "cudaMemset");
      cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      load.push_back(seconds_of([&] { cp.load(s); }));
      out.row("time", "repetition " + std::to_string(r + 1) + " of " + std::to_string(opt.reps) + " measured");
    }
    out.check(t.mismatches(5) == 0, "the loads put back every byte of the " + gpu_proof::size_name(bytes) + " tensor");
    const double gb = static_cast<double>(bytes) / 1e9;
    out.figure("device -> host staging, 4 MiB chunks into lent pinned buffers, 4 in flight / cudaMemcpy D2H into pinned (target >= 0.90)",
               median(d2h) / median(staged), gib(gb / median(staged)) + " vs " + gib(gb / median(d2h)) + "; " + size);
    out.figure("the same, each chunk waited for before the next (to_host, the pipeline before 2026-12-05) / cudaMemcpy D2H",
               median(d2h) / median(staged_waited), gib(gb / median(staged_waited)) + " vs " + gib(gb / median(d2h)) + "; " + size);
    out.figure("the same, 16 MiB chunks, 4 in flight / cudaMemcpy D2H", median(d2h) / median(staged16),
               gib(gb / median(staged16)) + " vs " + gib(gb / median(d2h)) + "; " + size);
    out.figure("through the pinned ring into pageable memory (no lending) / cudaMemcpy D2H", median(d2h) / median(ring),
               gib(gb / median(ring)) + " vs " + gib(gb / median(d2h)) + "; " + size);
    const std::string how = direct ? "O_DIRECT" : "page-cache (O_DIRECT refused)";
    // Each raw way's GB/s, one row each; returns the fastest: its median seconds and its name.
    auto fastest = [&](const char* what, std::vector<double> raw_way::*times) {
      std::pair<double, const char*> best{std::numeric_limits<double>::infinity(), ""};
      for (const auto& w : raw_ways) {
        const double m = median(w.*times);
        out.figure(std::string("raw ") + how + " " + what + ", " + w.name + " (GB/s)", gb / m, size);
        if (m < best.first) best = {m, w.name};
      }
      return best;
    };
    const auto [write_s, write_way] = fastest("write+fsync", &raw_way::write_s);
    out.figure("GPU state -> file (sync save) / the fastest raw " + how + " write+fsync of the same bytes (target >= 0.85)",
               write_s / median(save), gib(gb / median(save)) + " vs " + gib(gb / write_s) + " (" + write_way + "); " + size);
    const auto [read_s, read_way] = fastest("read", &raw_way::read_s);
    out.figure("file -> GPU state (load) / the fastest raw " + how + " read of the same bytes into pinned memory (target >= 0.85)",
               read_s / median(load),
               gib(gb / median(load)) + " vs " + gib(gb / read_s) + " (" + read_way + "); cudaMemcpy H2D from pinned " +
                   gib(gb / median(h2d)) + "; " + size);
    char detail[96];
    std::snprintf(detail, sizeof detail, "%.3f s vs %.3f s; ", median(async_block), median(d2h));
    out.figure("save_async blocking time / cudaMemcpy D2H time (target <= 1.2)", median(async_block) / median(d2h), detail + size);
  });

  cudaStreamDestroy(user);
  const int failed = out.failures();
  out.begin("summary");
  out.row("done", "gpu_proof", failed ? "FAILED" : "passed", std::to_string(failed) + " failed check(s)");
  return failed ? 1 : 0;
}
