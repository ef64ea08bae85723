// Aggregate save throughput of a tensor-parallel job, as a ratio to one process writing the
// same bytes raw (write + fsync) in the same run. Run under mpirun at several -np:
//
//   mpirun -np 4 bench/save_scaling [--mib 512] [--runs 5] [--dir /tmp]
//
// Every rank holds 1/np of 64 f32 tensors (split along dim 0); a save writes and fsyncs every
// rank's file and commits. The baseline is rank 0 alone writing a file of the same total size
// with write() and fsync(), timed in the same run. Prints medians and their ratio.

#define OMPI_SKIP_MPICXX 1
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/mpi.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct shard {
  std::vector<std::vector<float>> tensors;
  std::uint64_t rows = 0, cols = 0, rank = 0, world = 1;
  void checkpoint(ckpt::visitor& v) {
    for (std::size_t i = 0; i < tensors.size(); ++i)
      v.tensor("w" + std::to_string(i),
               ckpt::view(tensors[i], {rows, cols}).sharded({.global_shape = {rows * world, cols}, .offset = {rows * rank, 0}}));
  }
};

/// Writes `bytes` from `buf` (reused) to a new file and fsyncs it; returns seconds.
double raw_write(const std::filesystem::path& p, const std::vector<char>& buf, std::uint64_t bytes) {
  const double t0 = now();
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("open " + p.string());
  for (std::uint64_t done = 0; done < bytes;) {
    const auto n = ::write(fd, buf.data(), std::min<std::uint64_t>(buf.size(), bytes - done));
    if (n <= 0) throw std::runtime_error("write");
    done += static_cast<std::uint64_t>(n);
  }
  if (::fsync(fd) != 0) throw std::runtime_error("fsync");
  ::close(fd);
  const double t = now() - t0;
  std::filesystem::remove(p);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::uint64_t mib = 512;
  int runs = 5;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--mib") mib = std::stoull(v);
    else if (a == "--runs") runs = std::stoi(v);
    else if (a == "--dir") dir = v;
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::uint64_t tensors = 64, cols = 1024;
  const std::uint64_t total_rows = mib * (1 << 20) / 4 / cols / tensors;
  shard s;
  s.world = static_cast<std::uint64_t>(world);
  s.rank = static_cast<std::uint64_t>(rank);
  s.rows = total_rows / s.world;
  s.cols = cols;
  for (std::uint64_t i = 0; i < tensors; ++i) s.tensors.emplace_back(s.rows * cols, static_cast<float>(i) * 0.5f);
  const std::uint64_t total_bytes = s.rows * s.world * cols * 4 * tensors;

  const auto root = std::filesystem::path(dir) / "ckpt-save-scaling";
  if (rank == 0) std::filesystem::remove_all(root);
  MPI_Barrier(MPI_COMM_WORLD);
  ckpt::checkpointer<ckpt::megatron<ckpt::mpi>, ckpt::posix> cp{{.tp = static_cast<std::uint32_t>(world)}, root,
                                                              {.keep_last_n = 1}};
  std::vector<char> buf(8 << 20, 1);
  std::vector<double> save_s, raw_s;
  // The baseline and the save alternate in order from run to run, so that neither always
  // follows the other's deletes and writeback.
  const auto raw = [&] {
    if (rank == 0) raw_s.push_back(raw_write(std::filesystem::path(dir) / "ckpt-save-scaling.raw", buf, total_bytes));
    MPI_Barrier(MPI_COMM_WORLD);
  };
  for (int r = 0; r < runs; ++r) {
    if (r % 2 == 0) raw();
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    cp.save(static_cast<std::uint64_t>(r + 1), s);
    MPI_Barrier(MPI_COMM_WORLD);
    save_s.push_back(now() - t0);
    cp.wait();  // retention's deletion of the tag before, on rank 0's own thread: not in the raw write's way
    if (r % 2 == 1) raw();
  }
  if (rank == 0) {
    const double save = median(save_s), raw = median(raw_s);
    std::printf("np=%d bytes=%llu save_s=%.3f raw_write_fsync_s=%.3f save_MiBps=%.0f raw_MiBps=%.0f ratio=%.2f\n", world,
                static_cast<unsigned long long>(total_bytes), save, raw, total_bytes / save / (1 << 20),
                total_bytes / raw / (1 << 20), raw / save);
    std::filesystem::remove_all(root);
  }
  MPI_Finalize();
}
