// memory_tier: the fast tier's figures (issue "memory tier"), under mpirun -np 4 with two
// emulated nodes (ranks 0-1 and 2-3), each with its own directory on /dev/shm:
//
//   save      the tier's save (write + replicate + commit on both nodes) / a memcpy of the same
//             state into buffers already touched; and save_async's blocked time / that memcpy
//   replicate replica bytes the ranks received per second / the Transport's peak: MPI
//             send/recv of the same bytes between the same pairs of ranks at once, in the same
//             pieces (1 MiB), measured in the same run; and / the slower of that and writing
//             the same bytes into new files on /dev/shm (what landing a replica costs)
//   recover   a load from memory with every node intact, and with node 1's memory wiped (its
//             ranks take their files from node 0's replicas) / a load of the same state from the
//             durable tier (posix on --disk, read with O_DIRECT, the page cache dropped first
//             when run as root)
//
// Each figure is the median of --runs runs (5), each ratio taken within a run.
//
//   mpirun -np 4 build/bench/memory_tier --disk /var/tmp/ckpt-bench --mib 64 [--runs 5]

#include <ckpt/mpi.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ckpt/ckpt.hpp>
#include <ckpt/memory_tier.hpp>

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// One rank's state at tp = 2, dp = 2: its half of three [rows, 4096] fp32 tensors (a weight
/// and its Adam moments) and its RNG; `mib` MiB in all on each rank.
struct state {
  std::vector<float> w, m, v;
  std::mt19937_64 rng{1};
  std::size_t rows;
  std::uint32_t tp;
  state(std::size_t mib, int rank) : rows(mib * (1u << 20) / 3 / 4 / 4096), tp(static_cast<std::uint32_t>(rank % 2)) {
    for (auto* t : {&w, &m, &v}) {
      t->resize(rows * 4096);
      for (std::size_t i = 0; i < t->size(); ++i) (*t)[i] = static_cast<float>(i % 1013) * 0.5f + static_cast<float>(rank % 2);
    }
  }
  template <class V>
  void checkpoint(V& vis) {
    const ckpt::shard_spec s{.global_shape = {rows * 2, 4096}, .offset = {tp * rows, 0}};
    vis.tensor("w", ckpt::view(w, {rows, 4096}).sharded(s));
    vis.group("optimizer", [&](auto& g) {
      g.tensor("m", ckpt::view(m, {rows, 4096}).sharded(s));
      g.tensor("v", ckpt::view(v, {rows, 4096}).sharded(s));
    });
    vis.value("rng", rng);
  }
  std::uint64_t bytes() const { return 3 * w.size() * sizeof(float); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// The slowest rank's time of `f` (every rank starts together).
template <class F>
double timed(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = clock_type::now();
  f();
  double t = since(t0);
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

void drop_page_cache() {
  ::sync();
  std::ofstream("/proc/sys/vm/drop_caches") << "1\n";  // root only; otherwise O_DIRECT alone
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  std::string disk = "/var/tmp/ckpt-bench-memory-tier";
  std::size_t mib = 64;
  int runs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--disk") disk = argv[i + 1];
    else if (a == "--mib") mib = std::stoull(argv[i + 1]);
    else if (a == "--runs") runs = std::stoi(argv[i + 1]);
  }
  const int rank = rank_of();
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) {
    if (rank == 0) std::fprintf(stderr, "memory_tier: run it on 4 ranks (mpirun -np 4)\n");
    MPI_Finalize();
    return 2;
  }
  const std::string node = rank < 2 ? "node0" : "node1";
  const std::string mem = "/dev/shm/ckpt-bench-memory-tier";
  if (rank == 0) {
    fs::remove_all(mem);
    fs::remove_all(disk);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  using policy = ckpt::megatron<ckpt::mpi>;
  const ckpt::posix_options in_memory{.direct_writes = false, .direct_reads = false};
  ckpt::memory_tier<policy> fast{{.tp = 2}, ckpt::posix(mem + "/" + node, in_memory), {.keep = 2, .replicas = 1, .node = node}};
  ckpt::checkpointer<policy, ckpt::posix> durable{{.tp = 2}, disk, {.keep_last_n = 1}};
  state s(mib, rank);

  // memcpy of the state into buffers already touched (as the tier's own buffers are after the
  // first save).
  std::vector<float> cw(s.w.size()), cm(s.m.size()), cv(s.v.size());
  std::vector<double> save_ratio, async_ratio, repl_gbs, peak_gbs, repl_ratio, land_gbs, land_ratio, mem_ratio, peer_ratio;
  std::vector<double> t_save, t_memcpy, t_mem, t_peer, t_disk;
  std::uint64_t step = 0;
  fast.save(++step, s);  // first saves allocate; not timed
  durable.save(step, s);
  for (int run = 0; run < runs; ++run) {
    const double copy = timed([&] {
      std::memcpy(cw.data(), s.w.data(), s.w.size() * 4);
      std::memcpy(cm.data(), s.m.data(), s.m.size() * 4);
      std::memcpy(cv.data(), s.v.data(), s.v.size() * 4);
    });
    const double save = timed([&] { fast.save(++step, s); });
    // Bytes this node received per second of replication, summed over the ranks.
    double received = static_cast<double>(fast.last_save().bytes_received), repl = fast.last_save().replicate_seconds;
    MPI_Allreduce(MPI_IN_PLACE, &received, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &repl, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const double blocked = timed([&] { fast.save_async(++step, s); });
    fast.wait();
    // The Transport's peak for the same pattern: every rank sends its file's bytes to its
    // receiver on the other node and receives the other's, in 1 MiB pieces, all pairs at once.
    const auto per_rank = static_cast<std::uint64_t>(received / 4);
    std::vector<std::byte> buf(1 << 20), in(1 << 20);
    const int peer = (rank + 2) % 4;
    const double peak = timed([&] {
      for (std::uint64_t at = 0; at < per_rank; at += buf.size()) {
        const int n = static_cast<int>(std::min<std::uint64_t>(buf.size(), per_rank - at));
        MPI_Sendrecv(buf.data(), n, MPI_BYTE, peer, 7, in.data(), n, MPI_BYTE, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      }
    });
    // What landing those bytes in memory costs: every rank writes as many into a new file on
    // /dev/shm, in 1 MiB writes, all at once (a tmpfs allocates and zeroes each page it fills).
    const auto scratch = mem + "/landing." + std::to_string(rank);
    const double landing = timed([&] {
      std::FILE* f = std::fopen(scratch.c_str(), "wb");
      if (!f) return;
      std::setvbuf(f, nullptr, _IONBF, 0);
      for (std::uint64_t at = 0; at < per_rank; at += buf.size())
        std::fwrite(buf.data(), 1, static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), per_rank - at)), f);
      std::fclose(f);
    });
    fs::remove(scratch);
    // Recovery: all nodes intact; node 1 wiped; the durable tier, cold.
    durable.save(step, s);
    durable.wait();  // retention's deletion of the tag before ends here, not inside the timed durable load
    const double from_memory = timed([&] { fast.load(s); });
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 2) fs::remove_all(mem + "/node1");
    MPI_Barrier(MPI_COMM_WORLD);
    const double from_peer = timed([&] { fast.load(s); });
    if (rank == 0) drop_page_cache();
    const double from_disk = timed([&] { durable.load(s); });
    t_save.push_back(save);
    t_memcpy.push_back(copy);
    t_mem.push_back(from_memory);
    t_peer.push_back(from_peer);
    t_disk.push_back(from_disk);
    save_ratio.push_back(save / copy);
    async_ratio.push_back(blocked / copy);
    repl_gbs.push_back(received / repl / 1e9);
    peak_gbs.push_back(received / peak / 1e9);
    repl_ratio.push_back(peak / repl);
    land_gbs.push_back(received / landing / 1e9);
    land_ratio.push_back(std::max(peak, landing) / repl);
    mem_ratio.push_back(from_disk / from_memory);
    peer_ratio.push_back(from_disk / from_peer);
    if (rank == 0)
      std::printf("run %d: memcpy %.3f s, save %.3f s, save_async blocked %.3f s, replication %.3f s for %.0f MB (peak %.3f s, landing %.3f s), "
                  "recovery memory %.3f s, peer %.3f s, disk %.3f s\n",
                  run + 1, copy, save, blocked, repl, received / 1e6, peak, landing, from_memory, from_peer, from_disk);
  }
  if (rank == 0) {
    std::printf("\nstate: %.0f MiB per rank, %.0f MiB in all; medians of %d runs\n", s.bytes() / 1048576.0, 4 * s.bytes() / 1048576.0, runs);
    std::printf("| figure | median | |\n|---|---:|---|\n");
    std::printf("| save to memory (write, replicate, commit) / memcpy of the state | %.2f | %.3f s / %.3f s |\n", median(save_ratio),
                median(t_save), median(t_memcpy));
    std::printf("| save_async to memory, time blocked / memcpy of the state | %.2f | |\n", median(async_ratio));
    std::printf("| replication throughput / MPI send+recv of the same bytes | %.2f | %.2f GB/s / %.2f GB/s |\n", median(repl_ratio),
                median(repl_gbs), median(peak_gbs));
    std::printf("| replication throughput / the slower of MPI and writing the same bytes to /dev/shm | %.2f | /dev/shm: %.2f GB/s |\n",
                median(land_ratio), median(land_gbs));
    std::printf("| load from the durable tier (cold) / recovery from memory, nodes intact | %.2f | %.3f s / %.3f s |\n",
                median(mem_ratio), median(t_disk), median(t_mem));
    std::printf("| load from the durable tier (cold) / recovery with node 1 lost (from peers) | %.2f | %.3f s / %.3f s |\n",
                median(peer_ratio), median(t_disk), median(t_peer));
    fs::remove_all(mem);
    fs::remove_all(disk);
  }
  MPI_Finalize();
  return 0;
}
