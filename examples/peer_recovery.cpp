// peer_recovery: a job of four ranks on two nodes loses a whole node and resumes from the
// copies its peers hold in memory; and a SIGTERM turns into one consistent checkpoint.
//
// The model is a tensor-parallel linear layer learning a fixed "teacher" from random inputs
// with Adam: tp = 2, dp = 2, so ranks 0 and 1 hold the two halves of the weight for data-
// parallel group 0, and ranks 2 and 3 the same halves for group 1. Each group draws its own
// batches from its own RNG; gradients are summed over the data-parallel pair. Every rank's
// state (its slice of the weight, the Adam moments, its RNG, the step) is checkpointed:
//
//   to memory  every --mem-every steps (5), with ckpt::memory_tier: each node's ranks write
//              into the node's own memory directory (a tmpfs), and each rank's file is copied
//              to the other node (replicas = 1) before the tag is committed on both;
//   to disk    every --disk-every steps (20), with a plain checkpointer (the durable tier),
//              and whenever a rank is told to stop (SIGTERM or SIGUSR1, ckpt::preemption).
//
// The nodes are emulated: ranks 0-1 say they are on "node0", ranks 2-3 on "node1"
// (memory_tier_options::node), and each node has its own memory directory.
//
//   peer_recovery --check DIR [--mpirun PATH]
//       1. trains 60 steps without interruption (the reference);
//       2. trains again, and at step 40, just after the memory save of that step started, both
//          ranks of node1 kill themselves (SIGKILL) while it replicates, which ends the job;
//          node1's memory directory is then wiped (a replaced node);
//       3. restarts all four ranks: the memory tier finds global_step35 complete in memory (step
//          40 never committed: its replicas were not all in place), ranks 2 and 3 take their
//          files from node0's replicas, every byte is verified, and training goes on to step 60;
//       prints "recovery check: PASS" only if the final loss and every rank's weights, moments
//       and RNG are bit-identical to the reference's, and reports the time of the recovery
//       against loading the same state from disk.
//   peer_recovery --check-preemption DIR [--mpirun PATH]
//       trains with a SIGTERM sent to rank 3 at step 23; every rank agrees to save at the same
//       step, saves it to disk and exits 0; a restart resumes from it. Prints "preemption check:
//       PASS" only if all ranks saved the same step, exited 0, and the resumed run ends
//       bit-identical to the reference.
//
// Both modes start mpirun themselves (with --oversubscribe, and --allow-run-as-root as root),
// so the test suite runs them with no shell. Under mpirun, one run is:
//   mpirun -np 4 peer_recovery --run DIR --mem MEMDIR [--steps N] [--resume] [--die-at S]
//          [--sigterm-at S --sigterm-rank R]

// ckpt/mpi.hpp comes first: it includes <mpi.h> without the deprecated MPI C++ bindings.
#include <ckpt/mpi.hpp>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ckpt/ckpt.hpp>
#include <ckpt/memory_tier.hpp>
#include <ckpt/preemption.hpp>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using ull = unsigned long long;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

struct options {
  std::string run_dir, mem_dir, check_dir, preemption_dir;
  std::string mpirun = "mpirun";
  std::uint64_t steps = 60, mem_every = 5, disk_every = 20;
  std::uint64_t die_at = 0, sigterm_at = 0;
  int sigterm_rank = 3;
  bool resume = false;
  std::size_t rows = 256, cols = 512, batch = 16;  // the global weight is [rows, cols]
};

// ---------------------------------------------------------------------------------------------
// The model: this rank's rows of the weight, Adam's moments, the data RNG, the step
// ---------------------------------------------------------------------------------------------

struct model {
  std::size_t rows, cols, h;  // h: rows on this rank
  std::uint32_t tp, dp;
  std::vector<float> w, m, v, teacher;
  std::mt19937_64 data_rng;
  std::uint64_t step = 0;

  model(const options& o, int rank)
      : rows(o.rows), cols(o.cols), h(o.rows / 2), tp(static_cast<std::uint32_t>(rank % 2)),
        dp(static_cast<std::uint32_t>(rank / 2)), w(h * cols), m(h * cols), v(h * cols), teacher(h * cols),
        data_rng(1000 + dp) {
    std::mt19937_64 init(7 + tp), goal(99 + tp);  // the same halves in both data-parallel groups
    std::normal_distribution<float> n(0.0F, 0.05F);
    for (auto& x : w) x = n(init);
    for (auto& x : teacher) x = n(goal);
  }

  template <class V>
  void checkpoint(V& vis) {
    const ckpt::shard_spec s{.global_shape = {rows, cols}, .offset = {tp * h, 0}};
    vis.tensor("linear.weight", ckpt::view(w, {h, cols}).sharded(s));
    vis.group("optimizer", [&](auto& g) {
      g.tensor("linear.weight.exp_avg", ckpt::view(m, {h, cols}).sharded(s));
      g.tensor("linear.weight.exp_avg_sq", ckpt::view(v, {h, cols}).sharded(s));
    });
    vis.value("data_rng", data_rng);
    vis.value("step", step);
  }
};

/// One step: a batch from this group's RNG, this rank's rows of the prediction and gradient,
/// the gradient summed over the data-parallel pair, Adam. Returns the loss of the whole job.
double train_step(model& mdl, MPI_Comm dp_pair, const options& o) {
  std::normal_distribution<float> n(0.0F, 1.0F);
  std::vector<float> x(o.batch * mdl.cols);
  for (auto& e : x) e = n(mdl.data_rng);
  std::vector<float> grad(mdl.w.size(), 0.0F);
  double loss = 0;
  for (std::size_t b = 0; b < o.batch; ++b) {
    const float* xb = &x[b * mdl.cols];
    for (std::size_t i = 0; i < mdl.h; ++i) {
      float pred = 0, want = 0;
      for (std::size_t k = 0; k < mdl.cols; ++k) {
        pred += mdl.w[i * mdl.cols + k] * xb[k];
        want += mdl.teacher[i * mdl.cols + k] * xb[k];
      }
      const float err = pred - want;
      loss += double(err) * err;
      for (std::size_t k = 0; k < mdl.cols; ++k) grad[i * mdl.cols + k] += 2.0F * err * xb[k] / float(o.batch);
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, grad.data(), static_cast<int>(grad.size()), MPI_FLOAT, MPI_SUM, dp_pair);
  ++mdl.step;
  const float lr = 1e-3F, b1 = 0.9F, b2 = 0.999F, eps = 1e-8F;
  const float c1 = 1.0F - std::pow(b1, float(mdl.step)), c2 = 1.0F - std::pow(b2, float(mdl.step));
  for (std::size_t i = 0; i < mdl.w.size(); ++i) {
    mdl.m[i] = b1 * mdl.m[i] + (1 - b1) * grad[i];
    mdl.v[i] = b2 * mdl.v[i] + (1 - b2) * grad[i] * grad[i];
    mdl.w[i] -= lr * (mdl.m[i] / c1) / (std::sqrt(mdl.v[i] / c2) + eps);
  }
  MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return loss / double(o.batch * mdl.rows * 2);
}

std::string hex_bytes(const std::vector<float>& v) {
  return std::to_string(ckpt::detail::xxh3(std::as_bytes(std::span(v.data(), v.size()))));
}

// ---------------------------------------------------------------------------------------------
// One run under mpirun
// ---------------------------------------------------------------------------------------------

int run(const options& o) {
  const int rank = [] {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }();
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) throw std::runtime_error("peer_recovery runs on 4 ranks (mpirun -np 4)");
  MPI_Comm dp_pair;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &dp_pair);
  ckpt::preemption::install();

  const std::string node = "node" + std::to_string(rank / 2);
  using policy = ckpt::megatron<ckpt::mpi>;
  ckpt::memory_tier<policy> fast{{.tp = 2}, ckpt::posix(o.mem_dir + "/" + node, {.direct_writes = false, .direct_reads = false}),
                                 {.keep = 2, .replicas = 1, .node = node}};
  ckpt::checkpointer<policy, ckpt::posix> disk{{.tp = 2}, o.run_dir + "/disk", {.keep_last_n = 2}};

  model mdl(o, rank);
  if (o.resume) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = clock_type::now();
    const auto r = fast.load_or(disk, mdl);
    const double recovery = seconds_since(t0);
    // The same state read from the durable tier, for comparison: saved there (with O_DIRECT,
    // so not left in the page cache) and loaded into a scratch model.
    ckpt::checkpointer<policy, ckpt::posix> compare{{.tp = 2}, o.run_dir + "/disk-compare", {.keep_last_n = 1}};
    compare.save(r.iteration, mdl, {.overwrite = true});
    model scratch(o, rank);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t1 = clock_type::now();
    const auto d = compare.load(scratch);
    const double from_disk = seconds_since(t1);
    if (rank == 0) {
      std::printf("resumed at step %llu from %s (%s)\n", ull(r.iteration), r.tag.c_str(), r.tier.c_str());
      for (const auto& line : r.recovery) std::printf("  %s\n", line.c_str());
      const auto& l = fast.last_load();
      if (r.tier == "memory")
        std::printf("recovery took %.3f s (survey %.3f, from peers %.3f, load %.3f); loading the same state (%s) from disk took %.3f s\n",
                    recovery, l.survey_seconds, l.transfer_seconds, l.load_seconds, d.tag.c_str(), from_disk);
      else
        std::printf("recovery took %.3f s; loading the same state (%s) from disk again took %.3f s\n", recovery, d.tag.c_str(), from_disk);
      std::ofstream(o.run_dir + "/recovered.txt") << r.tier << ' ' << r.iteration << ' ' << recovery << ' ' << from_disk << '\n';
    }
  }
  std::optional<ckpt::save_handle> in_memory;
  double loss = 0;
  while (mdl.step < o.steps) {
    loss = train_step(mdl, dp_pair, o);
    const auto step = mdl.step;
    if (o.sigterm_at == step && rank == o.sigterm_rank) ::kill(::getpid(), SIGTERM);  // the scheduler's notice
    if (step % o.mem_every == 0) {
      if (in_memory) in_memory->wait();
      in_memory = fast.save_async(step, mdl);
    }
    if (o.die_at == step && rank / 2 == 1) {
      std::fflush(stdout);
      ::raise(SIGKILL);  // node1 is gone, mid-run: while the memory save of this step replicates
    }
    // The two tiers agree and write through their own duplicates of the communicator, so the
    // disk's save may run while the memory save replicates in the background.
    if (disk.should_save(step, o.disk_every)) disk.save(step, mdl);
    if (disk.preempted()) {
      std::ofstream(o.run_dir + "/preempted_rank" + std::to_string(rank) + ".txt") << step << '\n';
      if (rank == 0) std::printf("preempted: every rank saved step %llu to disk\n", ull(step));
      fast.wait();
      MPI_Comm_free(&dp_pair);
      return 0;
    }
  }
  if (in_memory) in_memory->wait();
  std::ofstream out(o.run_dir + "/result_rank" + std::to_string(rank) + ".txt");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", loss);
  out << "step " << mdl.step << " loss " << buf << " w " << hex_bytes(mdl.w) << " m " << hex_bytes(mdl.m) << " v "
      << hex_bytes(mdl.v) << " rng " << mdl.data_rng() << '\n';
  if (rank == 0) std::printf("step %llu: loss %.6g\n", ull(mdl.step), loss);
  MPI_Comm_free(&dp_pair);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The checks: mpirun started from here
// ---------------------------------------------------------------------------------------------

int run_job(const options& o, const std::string& dir, std::vector<std::string> extra) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> args = {o.mpirun};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  for (const auto& a : {std::string("--oversubscribe"), std::string("-np"), std::string("4"), self, std::string("--run"), dir,
                        std::string("--mem"), o.mem_dir, std::string("--steps"), std::to_string(o.steps), std::string("--rows"),
                        std::to_string(o.rows), std::string("--cols"), std::to_string(o.cols)})
    args.push_back(a);
  args.insert(args.end(), extra.begin(), extra.end());
  std::string shown;
  for (const auto& a : args) shown += (shown.empty() ? "" : " ") + a;
  std::printf("$ %s\n", shown.c_str());
  std::fflush(stdout);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (const int rc = posix_spawnp(&pid, o.mpirun.c_str(), nullptr, nullptr, argv.data(), environ); rc != 0)
    throw std::runtime_error("cannot start " + o.mpirun + ": " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// Whether every rank's result in `dir` equals the reference's; prints the first difference.
bool same_results(const std::string& ref, const std::string& dir) {
  for (int r = 0; r < 4; ++r) {
    const auto name = "result_rank" + std::to_string(r) + ".txt";
    const auto a = read_file(fs::path(ref) / name), b = read_file(fs::path(dir) / name);
    if (a.empty() || a != b) {
      std::printf("rank %d differs:\n  reference: %s  resumed:   %s", r, a.c_str(), b.empty() ? "(no result)\n" : b.c_str());
      return false;
    }
  }
  return true;
}

/// A fresh memory root on a tmpfs when the machine has one.
std::string memory_root(const std::string& fallback) {
  if (fs::is_directory("/dev/shm")) return "/dev/shm/ckpt-peer-recovery-" + std::to_string(::getpid());
  return fallback;
}

void refuse_nesting() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_RANK"))
    throw std::runtime_error("--check and --check-preemption start mpirun themselves: run them directly, not under mpirun");
}

int check_recovery(options o) {
  refuse_nesting();
  const fs::path dir = o.check_dir;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto t0 = clock_type::now();
  o.mem_dir = memory_root((dir / "mem-ref").string());
  std::printf("[1/3] reference: 4 ranks train %llu steps without interruption\n", ull(o.steps));
  if (run_job(o, (dir / "ref").string(), {}) != 0) return std::printf("recovery check: FAIL - the reference run failed\n"), 1;
  fs::remove_all(o.mem_dir);
  o.mem_dir = memory_root((dir / "mem").string()) + "-crash";
  std::printf("[2/3] the same run; at step 40, while the memory save of that step replicates, both ranks of node1 are\n"
              "      killed, and node1's memory is wiped\n");
  const int died = run_job(o, (dir / "crash").string(), {"--die-at", "40"});
  if (died == 0) return std::printf("recovery check: FAIL - the run with a lost node exited 0\n"), 1;
  fs::remove_all(fs::path(o.mem_dir) / "node1");
  std::printf("[3/3] restart on four ranks: recover from memory, train to step %llu\n", ull(o.steps));
  const int rc = run_job(o, (dir / "crash").string(), {"--resume"});
  fs::remove_all(o.mem_dir);
  if (rc != 0) return std::printf("recovery check: FAIL - the resumed run exited with status %d\n", rc), 1;
  std::istringstream rec(read_file(dir / "crash" / "recovered.txt"));
  std::string tier;
  std::uint64_t it = 0;
  double from_memory = 0, from_disk = 0;
  rec >> tier >> it >> from_memory >> from_disk;
  // Step 40's save was cut short by the node's death, unless it committed first: 35 (or 40).
  if (tier != "memory" || (it != 35 && it != 40))
    return std::printf("recovery check: FAIL - resumed from the %s tier at step %llu, not from memory at 35 (or 40)\n", tier.c_str(),
                       ull(it)), 1;
  if (!same_results((dir / "ref").string(), (dir / "crash").string())) return std::printf("recovery check: FAIL\n"), 1;
  std::printf("resumed from memory at step %llu; recovery from memory and the peers' replicas took %.3f s, loading the same\n"
              "state from disk %.3f s (%.1fx)\n", ull(it), from_memory, from_disk, from_disk / from_memory);
  std::printf("recovery check: PASS (%.1f s)\n", seconds_since(t0));
  return 0;
}

int check_preemption(options o) {
  refuse_nesting();
  const fs::path dir = o.preemption_dir;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto t0 = clock_type::now();
  o.mem_dir = memory_root((dir / "mem-ref").string());
  std::printf("[1/3] reference: 4 ranks train %llu steps without interruption\n", ull(o.steps));
  if (run_job(o, (dir / "ref").string(), {}) != 0) return std::printf("preemption check: FAIL - the reference run failed\n"), 1;
  fs::remove_all(o.mem_dir);
  o.mem_dir = memory_root((dir / "mem").string()) + "-pre";
  std::printf("[2/3] the same run; rank 3 gets SIGTERM at step 23\n");
  const int rc = run_job(o, (dir / "pre").string(), {"--sigterm-at", "23", "--sigterm-rank", "3"});
  if (rc != 0) return std::printf("preemption check: FAIL - the preempted run exited with status %d\n", rc), 1;
  std::string steps;
  for (int r = 0; r < 4; ++r) {
    const auto s = read_file(dir / "pre" / ("preempted_rank" + std::to_string(r) + ".txt"));
    if (s.empty()) return std::printf("preemption check: FAIL - rank %d did not save on preemption\n", r), 1;
    if (!steps.empty() && s != steps) return std::printf("preemption check: FAIL - ranks saved different steps\n"), 1;
    steps = s;
  }
  if (read_file(dir / "pre" / "disk" / "latest").find("global_step23") == std::string::npos)
    return std::printf("preemption check: FAIL - the disk's latest is not global_step23\n"), 1;
  fs::remove_all(o.mem_dir);  // the job ended: resume from disk
  std::printf("[3/3] restart: resume from the preemption's checkpoint, train to step %llu\n", ull(o.steps));
  if (run_job(o, (dir / "pre").string(), {"--resume"}) != 0) return std::printf("preemption check: FAIL - the resumed run failed\n"), 1;
  fs::remove_all(o.mem_dir);
  if (!same_results((dir / "ref").string(), (dir / "pre").string())) return std::printf("preemption check: FAIL\n"), 1;
  std::printf("preemption check: PASS (every rank saved step 23 and exited 0; %.1f s)\n", seconds_since(t0));
  return 0;
}

void usage() {
  std::fprintf(stderr,
               "usage: peer_recovery --check DIR [--mpirun PATH] [--rows R --cols C]\n"
               "       peer_recovery --check-preemption DIR [--mpirun PATH] [--rows R --cols C]\n"
               "       mpirun -np 4 peer_recovery --run DIR --mem MEMDIR [--steps N] [--resume] [--die-at S]\n"
               "                                  [--sigterm-at S --sigterm-rank R] [--rows R --cols C]\n");
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--check" && more) o.check_dir = argv[++i];
    else if (a == "--check-preemption" && more) o.preemption_dir = argv[++i];
    else if (a == "--run" && more) o.run_dir = argv[++i];
    else if (a == "--mem" && more) o.mem_dir = argv[++i];
    else if (a == "--mpirun" && more) o.mpirun = argv[++i];
    else if (a == "--steps" && more) o.steps = std::stoull(argv[++i]);
    else if (a == "--die-at" && more) o.die_at = std::stoull(argv[++i]);
    else if (a == "--sigterm-at" && more) o.sigterm_at = std::stoull(argv[++i]);
    else if (a == "--sigterm-rank" && more) o.sigterm_rank = std::stoi(argv[++i]);
    else if (a == "--rows" && more) o.rows = std::stoull(argv[++i]);
    else if (a == "--cols" && more) o.cols = std::stoull(argv[++i]);
    else if (a == "--resume") o.resume = true;
    else {
      usage();
      return 2;
    }
  }
  try {
    if (!o.check_dir.empty()) return check_recovery(o);
    if (!o.preemption_dir.empty()) return check_preemption(o);
    if (o.run_dir.empty() || o.mem_dir.empty()) {
      usage();
      return 2;
    }
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // save_async replicates in the background
    int rc = 1;
    try {
      rc = run(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "peer_recovery: %s\n", e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer_recovery: %s\n", e.what());
    return 1;
  }
}
