// The GPU proof of ckpt::cuda::nccl on real GPUs and real NCCL (issues 8 and 20), with one rank
// per GPU present as threads of this process (NCCL does not support two ranks on one GPU).
// Every row says at which world size it ran; the parts that need two ranks (point-to-point
// transfers, the streamed gather to rank 0, the scattered load) are reported as not run on a
// machine with one GPU, never as passed. Bounded joining (a world of two whose second rank
// never comes, and one whose second rank gives up) runs on one GPU too.
//
//   gpu_proof_nccl DIR [--quick] [--results FILE]   (it takes gpu_proof's other options, and ignores them)
//
// Exit status as gpu_proof's (proof.hpp): 0 passed, 1 a check failed, 77 no usable GPU.
// bench/gpu/device_run.sh runs it with NCCL_DEBUG=WARN, after finding NCCL's library.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/cuda/device_copy.hpp>
#include <ckpt/cuda/nccl.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "proof.hpp"

namespace fs = std::filesystem;
using gpu_proof::cuda;
using gpu_proof::gpu_tensor;

namespace {

using nccl_checkpointer = ckpt::checkpointer<ckpt::gather_to_root<ckpt::cuda::nccl>, ckpt::posix, ckpt::raw, ckpt::cuda::device_copy>;

/// One rank's rows of a GPU weight split over `world` ranks, and a per-rank value.
struct rank_state {
  static constexpr std::uint64_t rows = 4099, cols = 1024;  // 16 MiB of f32, uneven split
  std::uint64_t lo, hi, seen;
  gpu_tensor w;
  rank_state(int r, int world, int gpu)
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

/// Results of one rank, merged into rows by the main thread.
struct rank_result {
  std::string error;
  std::vector<std::pair<std::string, std::uint64_t>> bad;  // (check, mismatches)
  std::uint64_t bytes_read = 0;
  int device_after = -2;
  bool clean_after = false;
};

/// Runs body(rank, comm, stream, result) on one thread per rank, each on its own GPU. A rank
/// that fails before its communicator exists gives up, so the others do not wait for it.
template <class Body>
std::vector<rank_result> on_ranks(int world, const ckpt::cuda::nccl_options& options, Body body) {
  const auto id = ckpt::cuda::nccl_api{}.make_unique_id();
  std::vector<rank_result> results(static_cast<std::size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      auto& res = results[static_cast<std::size_t>(r)];
      bool joined = false;
      cudaStream_t stream = nullptr;
      try {
        cuda(cudaSetDevice(r), "cudaSetDevice");
        cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
        ckpt::cuda::nccl comm{r, world, r, id, stream, options};
        joined = true;
        body(r, comm, stream, res);
        int d = -1;
        cudaGetDevice(&d);
        res.device_after = d;
        res.clean_after = cudaPeekAtLastError() == cudaSuccess;
      } catch (const std::exception& e) {
        res.error = e.what();
        if (!joined) ckpt::cuda::nccl::give_up(id, r, e.what());
      }
      if (stream) cudaStreamDestroy(stream);
    });
  for (auto& t : ranks) t.join();
  return results;
}

std::string first_error(const std::vector<rank_result>& rs) {
  for (std::size_t r = 0; r < rs.size(); ++r)
    if (!rs[r].error.empty()) return "rank " + std::to_string(r) + ": " + rs[r].error;
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  gpu_proof::options opt;
  try {
    opt = gpu_proof::parse(argc, argv, "gpu_proof_nccl");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  gpu_proof::report out(opt.results);
  std::string why;
  const int devices = gpu_proof::devices(why);
  if (devices == 0) {
    out.not_run("every section", why);
    return 77;
  }
  int version = 0;
  ncclGetVersion(&version);
  out.row("info", "NCCL", std::to_string(version), "built against " + std::to_string(NCCL_VERSION_CODE) + "; " + std::to_string(devices) + " GPU(s)");
  const fs::path dir = opt.dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const int world = devices;
  const std::string at = " (world " + std::to_string(world) + ")";
  // Well under device_run.sh's limit for this program, so that a stall is reported by ckpt.
  const ckpt::cuda::nccl_options options{.timeout = std::chrono::seconds{opt.quick ? 15 : 60}};

  out.section("collectives", [&] {
    const auto rs = on_ranks(world, options, [&](int r, ckpt::cuda::nccl& comm, cudaStream_t, rank_result& res) {
      comm.barrier();
      std::vector<std::byte> msg((std::size_t{3} << 20) + 5, std::byte{0});  // crosses pieces of transfer_bytes
      if (r == 0) std::fill(msg.begin(), msg.end(), std::byte{42});
      comm.broadcast(msg, 0);
      res.bad.emplace_back("broadcast of 3 MiB + 5 bytes", static_cast<std::uint64_t>(msg.size() - static_cast<std::size_t>(std::count(msg.begin(), msg.end(), std::byte{42}))));
      const auto all = comm.all_gather(std::as_bytes(std::span(&r, 1)));
      std::uint64_t wrong = all.size() != static_cast<std::size_t>(world);
      for (std::size_t k = 0; k < all.size(); ++k) {
        int v = -1;
        if (all[k].size() == sizeof v) std::memcpy(&v, all[k].data(), sizeof v);
        wrong += v != static_cast<int>(k);
      }
      res.bad.emplace_back("all_gather", wrong);
      res.bad.emplace_back("all_reduce_max", comm.all_reduce_max(static_cast<std::uint64_t>(r)) != static_cast<std::uint64_t>(world - 1));
      const auto g = comm.gather(std::as_bytes(std::span(&r, 1)), 0);
      res.bad.emplace_back("gather to rank 0", r == 0 ? g.size() != static_cast<std::size_t>(world) : !g.empty());
    });
    const auto err = first_error(rs);
    out.check(err.empty(), "barrier, broadcast, all_gather, all_reduce_max, gather" + at, err);
    for (std::size_t k = 0; err.empty() && k < rs[0].bad.size(); ++k) {
      std::uint64_t bad = 0;
      for (const auto& r : rs) bad += r.bad[k].second;
      out.check(bad == 0, rs[0].bad[k].first + at, bad ? std::to_string(bad) + " wrong" : "");
    }
    const std::string slot = "no call left an error in the caller's last-error slot (the watchdog polls cudaStreamQuery)" + at;
    const std::string current = "every call left the caller's current device current" + at;
    if (!err.empty()) {
      out.not_run(slot, "the calls above failed");
      out.not_run(current, "the calls above failed");
    } else {
      bool kept = true, device_kept = true;
      for (std::size_t r = 0; r < rs.size(); ++r) {
        kept = kept && rs[r].clean_after;
        device_kept = device_kept && rs[r].device_after == static_cast<int>(r);
      }
      out.check(kept, slot);
      out.check(device_kept, current);
    }
  });

  out.section("point to point", [&] {
    if (world < 2) {
      out.not_run("send_tensor / recv_tensor between GPUs, send_host / recv_host", "needs two GPUs; this machine has one (tested on the fakes)");
      return;
    }
    const auto rs = on_ranks(world, options, [&](int r, ckpt::cuda::nccl& comm, cudaStream_t stream, rank_result& res) {
      gpu_tensor t(ckpt::dtype::f32, (std::uint64_t{20} << 20) + 12, r);
      if (r == 0) {
        t.fill(11, stream);
        comm.send_tensor(t.ref(), 0, t.bytes, 1);
      } else if (r == 1) {
        comm.recv_tensor(t.ref(), 0, t.bytes, 0);
        cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        res.bad.emplace_back("recv_tensor", t.mismatches(11));
      }
      comm.barrier();
    });
    const auto err = first_error(rs);
    std::uint64_t bad = 0;
    for (const auto& r : rs)
      for (const auto& b : r.bad) bad += b.second;
    out.check(err.empty() && bad == 0, "20 MiB GPU tensor from rank 0 to rank 1, straight from and into device memory" + at,
              err.empty() ? (bad ? std::to_string(bad) + " bytes differ" : "") : err);
  });

  out.section("gather_to_root", [&] {
    const auto root = dir / "nccl";
    fs::remove_all(root);
    const auto rs = on_ranks(world, options, [&](int r, ckpt::cuda::nccl& comm, cudaStream_t stream, rank_result& res) {
      nccl_checkpointer cp{{.comm = comm}, root, {}, {}, ckpt::cuda::device_copy{{}, stream}};
      rank_state s(r, world, r);
      const auto seed = static_cast<std::uint32_t>(100 + r);
      s.w.fill(seed, stream);
      cp.save(1, s);
      cuda(cudaMemsetAsync(s.w.p, 0, s.w.bytes, stream), "cudaMemsetAsync");
      s.seen = 0;
      const auto loaded = cp.load(s);
      cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      res.bad.emplace_back("save and load", s.w.mismatches(seed) + (s.seen != 1000 + static_cast<std::uint64_t>(r)));
      res.bytes_read = loaded.bytes_read;
      s.w.fill(seed + 50, stream);
      auto h = cp.save_async(2, s);
      s.w.fill(seed + 60, stream);
      h.wait();
      cp.load(s);
      cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      res.bad.emplace_back("save_async", s.w.mismatches(seed + 50));
    });
    const auto err = first_error(rs);
    std::uint64_t bad_sync = 0, bad_async = 0;
    for (const auto& r : rs) {
      if (r.bad.size() > 0) bad_sync += r.bad[0].second;
      if (r.bad.size() > 1) bad_async += r.bad[1].second;
    }
    const std::string how = world < 2 ? " at one rank (rank 0 writes its own shard: nothing crosses NCCL)" : ": every rank's rows streamed to rank 0";
    out.check(err.empty() && bad_sync == 0, "gather_to_root save and load of GPU shards" + how + at, err);
    out.check(err.empty() && bad_async == 0, "save_async over NCCL, the tensors overwritten as soon as it returned" + at);
    if (world < 2) {
      out.not_run("the streamed gather and the scattered load between ranks", "needs two GPUs; this machine has one (tested on the fakes)");
    } else {
      bool only_root = err.empty() && rs[0].bytes_read > 0;
      for (std::size_t r = 1; r < rs.size(); ++r) only_root = only_root && rs[r].bytes_read == 0;
      out.check(only_root, "only rank 0 read storage; the others received their rows over NCCL" + at);
    }
    fs::remove_all(root);
  });

  // Joining is bounded: a world of two on one GPU where the second rank never joins (only one
  // rank ever touches the GPU, so NCCL's one-rank-per-GPU rule holds).
  out.section("bounded join", [&] {
    const auto id = ckpt::cuda::nccl_api{}.make_unique_id();
    cudaStream_t stream = nullptr;
    cuda(cudaSetDevice(0), "cudaSetDevice");
    cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    auto attempt = [&](std::chrono::milliseconds timeout, auto&& meanwhile) {
      std::string error;
      const double took = gpu_proof::seconds_of([&] {
        std::thread other(meanwhile);
        try {
          ckpt::cuda::nccl comm{0, 2, 0, id, stream, {.timeout = timeout}};
          error = "joined a world of two alone";
        } catch (const ckpt::error& e) {
          error = e.what();
        }
        other.join();
      });
      return std::pair{error, took};
    };
    const auto [timed_out, took] = attempt(std::chrono::seconds{3}, [] {});
    out.check(timed_out.find("no answer within 3 s") != std::string::npos && took < 20,
              "ncclCommInitRank for a world of two whose second rank never comes ends after the timeout (3 s)",
              timed_out + " (" + std::to_string(took) + " s)");
    const auto id2 = ckpt::cuda::nccl_api{}.make_unique_id();
    std::string gave_up;
    double took2 = gpu_proof::seconds_of([&] {
      std::thread other([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        ckpt::cuda::nccl::give_up(id2, 1, "rank 1 failed before joining (planted)");
      });
      try {
        ckpt::cuda::nccl comm{0, 2, 0, id2, stream, {.timeout = std::chrono::seconds{60}}};
        gave_up = "joined a world of two alone";
      } catch (const ckpt::error& e) {
        gave_up = e.what();
      }
      other.join();
    });
    out.check(gave_up.find("rank 1 failed before joining") != std::string::npos && took2 < 10,
              "a rank that gives up ends its peer's join at once, not after the 60 s timeout",
              gave_up + " (" + std::to_string(took2) + " s)");
    out.check(cudaPeekAtLastError() == cudaSuccess, "nothing left in the last-error slot after the aborted joins");
    cudaStreamDestroy(stream);
  });

  const int failed = out.failures();
  out.begin("summary");
  out.row("done", "gpu_proof_nccl", failed ? "FAILED" : "passed", std::to_string(failed) + " failed check(s)");
  return failed ? 1 : 0;
}
