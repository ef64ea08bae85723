// Crash campaign with two MPI ranks: a tensor-parallel job (tp = 2, megatron layout) saves
// checkpoint after checkpoint, and one of its ranks, chosen at random, is killed with SIGKILL
// at a random moment: in its shard write, in the commit's gathers, while rank 0 writes
// metadata.json or `latest`, or during retention. mpirun then ends the other rank. After every
// kill the campaign checks, from a single process, that `latest` and every committed tag load
// (resharded to one process), verify and hold exactly what was saved at their iteration, then
// saves once and checks that the killed save's leftovers are gone.
//
//   mpi_crash [--trials 20] [--seed 1] [--max-delay-ms 400] [--dir /tmp]
//   (it runs itself under mpirun as `mpi_crash --rank DIR PIDS FIRST`)

#include <ckpt/ckpt.hpp>
#include <ckpt/mpi.hpp>

#include "leftovers.hpp"

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using crash::broken;
using crash::leftover;

namespace {

constexpr std::uint64_t rows = 512, cols = 64;
constexpr std::size_t keep = 2;

/// Element (r, c) of the weights at iteration `it`: every checkpoint can be checked exactly.
float weight(std::uint64_t it, std::uint64_t r, std::uint64_t c) {
  return static_cast<float>((it * 131 + r * cols + c) % 100003) * 0.25f;
}

/// What one rank of the tp = 2 job holds: its half of the rows of a weight matrix (a shard of
/// the global tensor), a replicated bias, and its iteration. `tp` = 1 is the whole model.
struct state {
  std::uint32_t tp = 1, rank = 0;
  std::vector<float> w, bias = std::vector<float>(cols);
  std::uint64_t step = 0;

  state(std::uint32_t tp_size, std::uint32_t r) : tp(tp_size), rank(r), w(rows / tp_size * cols) {}
  void set(std::uint64_t it) {
    for (std::uint64_t i = 0; i < rows / tp; ++i)
      for (std::uint64_t c = 0; c < cols; ++c) w[i * cols + c] = weight(it, rank * (rows / tp) + i, c);
    for (std::uint64_t c = 0; c < cols; ++c) bias[c] = weight(it, rows, c);
    step = it;
  }
  bool holds(std::uint64_t it) const {
    state want(tp, rank);
    want.set(it);
    return w == want.w && bias == want.bias && step == it;
  }
  void checkpoint(ckpt::visitor& v) {
    ckpt::tensor_ref ref(ckpt::dtype::f32, {rows / tp, cols}, w.data());
    if (tp > 1) ref.sharded({.global_shape = {rows, cols}, .offset = {rank * (rows / tp), 0}});
    v.tensor("layer.weight", ref);
    ckpt::tensor_ref b(ckpt::dtype::f32, {cols}, bias.data());
    if (tp > 1) b.sharded(ckpt::shard_spec::replica());
    v.tensor("layer.bias", b);
    v.value("step", step);
  }
};

/// One rank of the job: saves iterations first, first + 1, ... until it is killed.
int rank_main(const fs::path& root, const fs::path& pids, std::uint64_t first) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  try {
    ckpt::checkpointer<ckpt::megatron<ckpt::mpi>, ckpt::posix> cp{{.tp = 2}, root, {.keep_last_n = keep, .chunk_bytes = 16 * 1024}};
    state s(2, static_cast<std::uint32_t>(r));
    std::ofstream(pids / ("rank" + std::to_string(r))) << ::getpid() << "\n";  // now the parent may kill
    for (std::uint64_t it = first;; ++it) {
      s.set(it);
      cp.save(it, s);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", r, e.what());
  }
  MPI_Abort(MPI_COMM_WORLD, 3);
  return 3;
}

using single = ckpt::checkpointer<ckpt::single_process, ckpt::posix>;

/// Every committed tag, and `latest`, loaded by one process: exactly what was saved.
/// `latest_written` says whether an earlier save wrote latest: only the very first save can
/// leave committed tags without it (killed between metadata.json and latest).
int verify(const fs::path& root, int trial, bool latest_written) {
  single cp{{}, root, {.keep_last_n = keep}};
  const auto tags = cp.tags();
  const auto last = cp.latest();
  bool latest_committed = false;
  for (const auto& tag : tags) {
    latest_committed |= last && tag.tag == *last;
    state got(1, 0);
    try {
      cp.load(got, {.tag = tag.tag, .on_topology_change = ckpt::topology_change::from_rank_0});
    } catch (const ckpt::error& e) {
      broken(trial, "committed tag " + tag.tag + " does not load: " + e.what());
    }
    if (!got.holds(tag.iteration)) broken(trial, tag.tag + " does not hold what was saved at iteration " + std::to_string(tag.iteration));
  }
  if (!last) {
    if (!tags.empty() && latest_written) broken(trial, "committed tags exist but latest does not");
    return static_cast<int>(tags.size());
  }
  if (!latest_committed) broken(trial, "latest names " + *last + ", which is not a committed tag");
  return static_cast<int>(tags.size());
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--rank") return rank_main(argv[2], argv[3], std::stoull(argv[4]));
  int trials = 20, max_delay_ms = 400;
  std::uint64_t seed = 1;
  fs::path base = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--trials") trials = std::stoi(v);
    else if (a == "--seed") seed = std::stoull(v);
    else if (a == "--max-delay-ms") max_delay_ms = std::stoi(v);
    else if (a == "--dir") base = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const fs::path work = base / ("ckpt-mpi-crash-" + std::to_string(::getpid()));
  const fs::path root = work / "root", pids = work / "pids", log = work / "mpirun.log";
  fs::create_directories(root);
  const auto self = fs::canonical("/proc/self/exe").string();
  std::mt19937_64 g(seed);
  int kills = 0, partial = 0, verified = 0, rank0_kills = 0;
  std::uint64_t next = 1;
  for (int trial = 0; trial < trials; ++trial) {
    fs::remove_all(pids);
    fs::create_directories(pids);
    std::fflush(nullptr);
    const pid_t job = ::fork();
    if (job < 0) return std::perror("fork"), 1;
    if (job == 0) {
      ::setpgid(0, 0);  // mpirun and its ranks in a group of their own, so a hang can be ended
      std::freopen(log.c_str(), "w", stdout);
      std::freopen(log.c_str(), "a", stderr);
      const std::string first = std::to_string(next);
      ::setenv("OMPI_MCA_btl", "self,vader", 1);
      ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
      ::execlp("mpirun", "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", self.c_str(), "--rank",
               root.c_str(), pids.c_str(), first.c_str(), static_cast<char*>(nullptr));
      std::perror("exec mpirun");
      ::_exit(127);
    }
    // Wait for both ranks to start saving, then kill one of them after a random delay.
    std::vector<pid_t> rank_pid(2, 0);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 2; ++r)
      while (true) {
        std::ifstream in(pids / ("rank" + std::to_string(r)));
        if (in >> rank_pid[static_cast<std::size_t>(r)]) break;
        int status;
        if (::waitpid(job, &status, WNOHANG) == job) broken(trial, "the job ended before it started saving; see " + log.string());
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) broken(trial, "the job did not start");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    std::this_thread::sleep_for(std::chrono::microseconds(g() % (static_cast<std::uint64_t>(max_delay_ms) * 1000 + 1)));
    const int victim = static_cast<int>(g() % 2);
    ::kill(rank_pid[static_cast<std::size_t>(victim)], SIGKILL);
    rank0_kills += victim == 0;
    // mpirun notices and ends the other rank; a job still there after 60 s is a hang.
    int status = 0;
    const auto t1 = std::chrono::steady_clock::now();
    while (::waitpid(job, &status, WNOHANG) != job) {
      if (std::chrono::steady_clock::now() - t1 > std::chrono::seconds(60)) {
        ::kill(-job, SIGKILL);
        broken(trial, "the job did not end after one of its ranks was killed");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (const auto pid : rank_pid)
      for (int i = 0; alive(pid); ++i) {
        if (i == 1000) ::kill(pid, SIGKILL);  // 5 s: make sure the survivor is gone
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    ++kills;
    if (!leftover(root).empty()) ++partial;
    verified += verify(root, trial, trial > 0);
    {  // the next save (here, by one process) cleans up what the killed job left
      single cp{{}, root, {.keep_last_n = keep}};
      const auto tags = cp.tags();
      next = (tags.empty() ? 0 : tags.back().iteration) + 1000;
      state s(1, 0);
      s.set(next);
      cp.save(next, s);
      ++next;
    }
    if (const auto left = leftover(root); !left.empty())
      broken(trial, "the next save did not clean up the killed job's leftovers: " + left);
    verified += verify(root, trial, true);
  }
  std::printf("mpi crash campaign: %d SIGKILLs of one rank of 2 (%d of rank 0), %d left a partial save behind, "
              "%d committed tags verified, 0 broken promises\n",
              kills, rank0_kills, partial, verified);
  fs::remove_all(work);
  return 0;
}
