// The GPU proof (issue 8): correctness of ckpt::cuda::device_copy and ckpt::cuda::nccl on real
// GPUs (NCCL at one rank per GPU present, ranks as threads), then throughput against the limits
// measured in the same run. bench/gpu/run.sh builds and runs it.
//
//   gpu_proof DIR [--big-gib 4]
//
// DIR is a directory on local disk for the checkpoints. Prints a line per check and one table;
// exits non-zero if any correctness check fails.

#include <fcntl.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/cuda/device_copy.hpp>
#include <ckpt/cuda/nccl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kernels.hpp"

namespace fs = std::filesystem;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

/// One device buffer viewed as a tensor of `type`.
struct gpu_tensor {
  ckpt::dtype type;
  std::uint64_t bytes;
  void* p = nullptr;
  int gpu = 0;
  gpu_tensor(ckpt::dtype t, std::uint64_t n, int on = 0) : type(t), bytes(n / ckpt::size_of(t) * ckpt::size_of(t)), gpu(on) {
    cuda(cudaSetDevice(gpu), "cudaSetDevice");
    cuda(cudaMalloc(&p, std::max<std::uint64_t>(bytes, 1)), "cudaMalloc");
  }
  ~gpu_tensor() { cudaFree(p); }
  gpu_tensor(const gpu_tensor&) = delete;
  ckpt::tensor_ref ref() const {
    return ckpt::tensor_ref(type, {bytes / ckpt::size_of(type)}, p, ckpt::device::cuda(gpu));
  }
  bool boolean() const { return type == ckpt::dtype::boolean; }
};

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

double seconds(auto&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

using gpu_checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::raw, ckpt::cuda::device_copy>;
using nccl_checkpointer = ckpt::checkpointer<ckpt::gather_to_root<ckpt::cuda::nccl>, ckpt::posix, ckpt::raw, ckpt::cuda::device_copy>;

/// One rank's rows of a GPU weight split over `world` ranks, and a per-rank value.
struct nccl_rank_state {
  static constexpr std::uint64_t rows = 4099, cols = 1024;  // 16 MiB of f32, uneven split
  std::uint64_t lo, hi, seen;
  gpu_tensor w;
  nccl_rank_state(int r, int world, int gpu)
      : lo(rows * static_cast<std::uint64_t>(r) / static_cast<std::uint64_t>(world)),
        hi(rows * static_cast<std::uint64_t>(r + 1) / static_cast<std::uint64_t>(world)),
        seen(1000 + static_cast<std::uint64_t>(r)),
        w(ckpt::dtype::f32, (hi - lo) * cols * 4, gpu) {}
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::tensor_ref(ckpt::dtype::f32, {hi - lo, cols}, w.p, ckpt::device::cuda(w.gpu))
                      .sharded({.global_shape = {rows, cols}, .offset = {lo, 0}}));
    v.value("seen", seen);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpu_proof DIR [--big-gib N]\n");
    return 2;
  }
  const fs::path dir = argv[1];
  std::uint64_t big_gib = 4;
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--big-gib") big_gib = std::stoull(argv[i + 1]);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to prove here\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device 0: %s, %.0f GiB\n", prop.name, static_cast<double>(prop.totalGlobalMem) / (1ull << 30));
  cudaStream_t user = nullptr;
  cuda(cudaStreamCreate(&user), "cudaStreamCreate");

  // (a) Round trips of every dtype and sizes from 1 byte to big_gib GiB: device -> disk -> device,
  //     and device -> disk -> host memory with no GPU policy.
  const ckpt::dtype types[] = {ckpt::dtype::f64, ckpt::dtype::f32, ckpt::dtype::f16, ckpt::dtype::bf16, ckpt::dtype::i64,
                               ckpt::dtype::i32, ckpt::dtype::i16, ckpt::dtype::i8,  ckpt::dtype::u8,   ckpt::dtype::boolean};
  for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{1000}, (std::uint64_t{1} << 20) + 8, std::uint64_t{64} << 20}) {
    std::vector<std::unique_ptr<gpu_tensor>> owned;
    gpu_state s;
    for (auto t : types) {
      if (size < ckpt::size_of(t)) continue;
      owned.push_back(std::make_unique<gpu_tensor>(t, size));
      s.tensors.push_back(owned.back().get());
    }
    for (std::size_t i = 0; i < s.tensors.size(); ++i)
      gpu_proof::fill_pattern(s.tensors[i]->p, s.tensors[i]->bytes, static_cast<std::uint32_t>(i), s.tensors[i]->boolean(), user);
    const auto root = dir / ("roundtrip-" + std::to_string(size));
    fs::remove_all(root);
    gpu_checkpointer cp{{}, root, {}, {}, ckpt::cuda::device_copy{{}, user}};
    cp.save(1, s);
    for (auto* t : s.tensors) cuda(cudaMemset(t->p, 0xAB, t->bytes), "cudaMemset");
    cudaDeviceSynchronize();
    cp.load(s);
    std::uint64_t bad = 0;
    for (std::size_t i = 0; i < s.tensors.size(); ++i)
      bad += gpu_proof::mismatches(s.tensors[i]->p, s.tensors[i]->bytes, static_cast<std::uint32_t>(i), s.tensors[i]->boolean());
    check(bad == 0, "round trip device -> disk -> device, " + std::to_string(s.tensors.size()) + " dtypes of " + std::to_string(size) + " bytes");
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
        bad += static_cast<unsigned char>(h.bufs[i][k]) != gpu_proof::host_pattern_byte(k, static_cast<std::uint32_t>(i), h.types[i] == ckpt::dtype::boolean);
    check(bad == 0, "device -> disk -> host-only load, " + std::to_string(size) + " bytes");
    fs::remove_all(root);
  }
  {  // One big tensor.
    gpu_tensor big(ckpt::dtype::f32, big_gib << 30);
    gpu_state s{{&big}};
    gpu_proof::fill_pattern(big.p, big.bytes, 99, false, user);
    const auto root = dir / "big";
    fs::remove_all(root);
    gpu_checkpointer cp{{}, root, {}, {}, ckpt::cuda::device_copy{{}, user}};
    cp.save(1, s);
    cuda(cudaMemset(big.p, 0, big.bytes), "cudaMemset");
    cudaDeviceSynchronize();
    cp.load(s);
    check(gpu_proof::mismatches(big.p, big.bytes, 99, false) == 0, "round trip of one " + std::to_string(big_gib) + " GiB tensor");
    fs::remove_all(root);
  }

  // Stream ordering: a slow kernel writes the tensor just before save; save must see its bytes.
  {
    gpu_tensor t(ckpt::dtype::f32, 64 << 20);
    gpu_state s{{&t}};
    gpu_proof::fill_pattern(t.p, t.bytes, 1, false, user);
    cudaStreamSynchronize(user);
    gpu_proof::fill_pattern(t.p, t.bytes, 2, false, user, 200'000'000);  // ~0.1 s of spinning first
    const auto root = dir / "ordering";
    fs::remove_all(root);
    gpu_checkpointer cp{{}, root, {}, {}, ckpt::cuda::device_copy{{}, user}};
    cp.save(1, s);
    cuda(cudaMemsetAsync(t.p, 0, t.bytes, user), "cudaMemsetAsync");
    cp.load(s);
    cudaStreamSynchronize(user);
    check(gpu_proof::mismatches(t.p, t.bytes, 2, false) == 0, "save observes the kernel enqueued just before it on the user's stream");

    // save_async: the tensor overwritten right after it returns.
    gpu_proof::fill_pattern(t.p, t.bytes, 3, false, user);
    auto h = cp.save_async(2, s);
    gpu_proof::fill_pattern(t.p, t.bytes, 4, false, user);
    cudaStreamSynchronize(user);
    h.wait();
    cp.load(s);
    cudaStreamSynchronize(user);
    check(gpu_proof::mismatches(t.p, t.bytes, 3, false) == 0, "save_async keeps the bytes of its call, not those written after it returned");
    fs::remove_all(root);
  }

  // (b) NCCL at one rank per GPU (ranks as threads): collectives, then gather_to_root over NCCL:
  //     every rank's GPU rows stream to rank 0, which writes one file; the load scatters them
  //     back from rank 0 straight into each rank's GPU memory; save_async with the tensors
  //     overwritten at once.
  {
    const int world = devices;
    const auto id = ckpt::cuda::nccl_api{}.make_unique_id();
    const auto root = dir / "nccl";
    fs::remove_all(root);
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    std::vector<std::uint64_t> bad(static_cast<std::size_t>(world), 0), received(static_cast<std::size_t>(world), 0);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r)
      ranks.emplace_back([&, r] {
        try {
          cuda(cudaSetDevice(r), "cudaSetDevice");
          cudaStream_t stream = nullptr;
          cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
          ckpt::cuda::nccl comm{r, world, r, id, stream};
          comm.barrier();
          std::vector<std::byte> msg(3 << 20, std::byte{0});
          if (r == 0) std::fill(msg.begin(), msg.end(), std::byte{42});
          comm.broadcast(msg, 0);
          bad[static_cast<std::size_t>(r)] += static_cast<std::uint64_t>(std::count(msg.begin(), msg.end(), std::byte{42}) != static_cast<std::ptrdiff_t>(msg.size()));
          const auto all = comm.all_gather(std::as_bytes(std::span(&r, 1)));
          for (int k = 0; k < world; ++k) {
            int v = -1;
            std::memcpy(&v, all[static_cast<std::size_t>(k)].data(), sizeof v);
            bad[static_cast<std::size_t>(r)] += v != k;
          }
          bad[static_cast<std::size_t>(r)] += comm.all_reduce_max(static_cast<std::uint64_t>(r)) != static_cast<std::uint64_t>(world - 1);
          nccl_checkpointer cp{{.comm = comm}, root, {}, {}, ckpt::cuda::device_copy{{}, stream}};
          nccl_rank_state s(r, world, r);
          const auto seed = static_cast<std::uint32_t>(100 + r);
          gpu_proof::fill_pattern(s.w.p, s.w.bytes, seed, false, stream);
          cp.save(1, s);
          cuda(cudaMemsetAsync(s.w.p, 0, s.w.bytes, stream), "cudaMemsetAsync");
          s.seen = 0;
          const auto res = cp.load(s);
          cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          bad[static_cast<std::size_t>(r)] += gpu_proof::mismatches(s.w.p, s.w.bytes, seed, false) + (s.seen != 1000 + static_cast<std::uint64_t>(r));
          received[static_cast<std::size_t>(r)] = res.bytes_read;
          // save_async: overwritten right after it returns.
          gpu_proof::fill_pattern(s.w.p, s.w.bytes, seed + 50, false, stream);
          auto h = cp.save_async(2, s);
          gpu_proof::fill_pattern(s.w.p, s.w.bytes, seed + 60, false, stream);
          h.wait();
          cp.load(s);
          cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          bad[static_cast<std::size_t>(r)] += gpu_proof::mismatches(s.w.p, s.w.bytes, seed + 50, false);
          cudaStreamDestroy(stream);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
    cuda(cudaSetDevice(0), "cudaSetDevice");
    std::uint64_t total_bad = 0;
    std::string first_error;
    for (int r = 0; r < world; ++r) {
      total_bad += bad[static_cast<std::size_t>(r)];
      if (first_error.empty() && !errors[static_cast<std::size_t>(r)].empty()) first_error = errors[static_cast<std::size_t>(r)];
    }
    check(first_error.empty() && total_bad == 0,
          "NCCL at " + std::to_string(world) + " rank(s): collectives, gather_to_root save, scattered load, save_async" +
              (first_error.empty() ? std::string() : ": " + first_error) + (total_bad ? ", " + std::to_string(total_bad) + " mismatches" : ""));
    bool only_root_read = received[0] > 0;
    for (int r = 1; r < world; ++r) only_root_read = only_root_read && received[static_cast<std::size_t>(r)] == 0;
    check(only_root_read, "only rank 0 read storage (the others received their rows over NCCL)");
    fs::remove_all(root);
  }

  // (c) Throughput, each against its limit measured here, medians of 5.
  const std::uint64_t bytes = big_gib << 30;
  gpu_tensor t(ckpt::dtype::f32, bytes);
  gpu_proof::fill_pattern(t.p, t.bytes, 5, false, user);
  cudaDeviceSynchronize();
  void* pinned = nullptr;
  cuda(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  std::vector<std::byte> pageable(bytes);
  std::vector<double> d2h, staged, staged16, ring, raw_write, save, async_block;
  ckpt::cuda::device_copy dev{{}, user};
  // The save pipeline's staging: chunk after chunk into the pinned buffers device_copy lends
  // it (4 in flight), as write_shard stages them.
  auto stage_chunks = [&](std::uint64_t chunk) {
    std::vector<ckpt::lent_buffer> slots;
    for (int k = 0; k < 4; ++k) slots.push_back(dev.lend(chunk));
    return seconds([&] {
      std::uint64_t k = 0;
      for (std::uint64_t at = 0; at < bytes; at += chunk, ++k) {
        const auto n = std::min(chunk, bytes - at);
        dev.to_host(t.ref(), at, {slots[k % slots.size()].data(), n});
      }
    });
  };
  // One checkpointer each for the sync and the async saves, warmed up by a first save outside
  // the timing: their pinned buffers are allocated once and reused, as in a training run.
  // Each timed save writes a new tag; the previous one is deleted outside the timing.
  const auto root = dir / "throughput", async_root = dir / "throughput-async";
  fs::remove_all(root);
  fs::remove_all(async_root);
  gpu_state s{{&t}};
  gpu_checkpointer cp{{}, root, {}, {}, ckpt::cuda::device_copy{{}, user}};
  // Lent pinned memory for the whole snapshot (and the pipeline): the snapshot is one copy.
  gpu_checkpointer acp{{}, async_root, {}, {}, ckpt::cuda::device_copy{{}, user, {.lend_bytes = static_cast<std::size_t>(bytes) + (std::size_t{512} << 20)}}};
  cp.save(1, s);
  acp.save_async(1, s).wait();
  auto drop = [](const fs::path& r, std::uint64_t iteration) { fs::remove_all(r / ckpt::default_tag(iteration)); };
  for (int r = 0; r < 5; ++r) {
    const auto it = static_cast<std::uint64_t>(r) + 2;
    d2h.push_back(seconds([&] { cuda(cudaMemcpy(pinned, t.p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy"); }));
    staged.push_back(stage_chunks(std::uint64_t{4} << 20));
    staged16.push_back(stage_chunks(std::uint64_t{16} << 20));
    ring.push_back(seconds([&] { dev.to_host(t.ref(), 0, pageable); }));
    raw_write.push_back(seconds([&] {
      const auto f = dir / "raw.bin";
      const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (std::uint64_t at = 0; at < bytes;) {
        const auto n = ::write(fd, static_cast<const char*>(pinned) + at, std::min<std::uint64_t>(bytes - at, 1 << 30));
        if (n <= 0) std::exit(3);
        at += static_cast<std::uint64_t>(n);
      }
      ::fsync(fd);
      ::close(fd);
    }));
    fs::remove(dir / "raw.bin");
    drop(root, it - 1);
    save.push_back(seconds([&] { cp.save(it, s); }));
    drop(async_root, it - 1);
    ckpt::save_handle h;
    async_block.push_back(seconds([&] { h = acp.save_async(it, s); }));
    h.wait();
  }
  fs::remove_all(root);
  fs::remove_all(async_root);
  cudaFreeHost(pinned);
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("\n| figure (%llu GiB, medians of 5) | measured | limit | ratio | target |\n|---|---|---|---|---|\n",
              static_cast<unsigned long long>(big_gib));
  std::printf("| device -> host staging (4 MiB chunks into lent pinned buffers) / cudaMemcpy D2H into pinned | %.1f GB/s | %.1f GB/s | %.2f | >= 0.90 |\n",
              gb / median(staged), gb / median(d2h), median(d2h) / median(staged));
  std::printf("| the same, 16 MiB chunks (chunk_bytes = 16 MiB) | %.1f GB/s | %.1f GB/s | %.2f | |\n", gb / median(staged16), gb / median(d2h),
              median(d2h) / median(staged16));
  std::printf("| through the pinned ring into pageable memory (no lending) | %.1f GB/s | %.1f GB/s | %.2f | |\n", gb / median(ring),
              gb / median(d2h), median(d2h) / median(ring));
  std::printf("| GPU state -> file / raw write+fsync of the same bytes | %.1f GB/s | %.1f GB/s | %.2f | >= 0.85 |\n", gb / median(save),
              gb / median(raw_write), median(raw_write) / median(save));
  std::printf("| save_async blocking time / D2H copy time | %.3f s | %.3f s | %.2f | <= 1.2 |\n", median(async_block), median(d2h),
              median(async_block) / median(d2h));
  std::printf("\n%s: %d correctness check(s) failed\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
