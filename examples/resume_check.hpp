#pragma once
// The crash-and-resume proof both training examples run with --check, by running the same
// program three times:
//   1. an uninterrupted run to N steps                  (DIR/uninterrupted)
//   2. a run killed with SIGKILL at step S              (DIR/crashed)
//   3. a run that resumes DIR/crashed from `latest` to N
// and comparing the `result:` lines of 1 and 3 bit for bit. A program taking part prints
//   resumed: ... iteration=I                  when it resumes from a checkpoint of step I
//   result: iteration=N eval_loss=L eval_loss_bits=0x... weights_xxh3=0x... state_xxh3=0x...
// and understands --save DIR, --resume and --crash-at S.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;  // what posix_spawn passes on

namespace resume_check {

namespace fs = std::filesystem;
using ull = unsigned long long;  // what printf's %llu takes

/// One proof: the program's own flags (those all three runs share), its step counts, and
/// where the runs keep their checkpoints and logs.
struct proof {
  const char* program;             ///< its name, for argv[0]
  std::vector<std::string> flags;  ///< passed to every run (hyper-parameters, --steps, ...)
  std::uint64_t steps = 0, save_interval = 0;
  std::optional<std::uint64_t> crash_at;
  fs::path dir;
};

// Starts this program again with `flags` plus `extra`, its output going to `log`.
// /proc/self/exe is Linux's name for the running binary; elsewhere, use argv[0].
inline pid_t spawn(const proof& p, const std::vector<std::string>& extra, const fs::path& log) {
  std::vector<std::string> args = {p.program};
  args.insert(args.end(), p.flags.begin(), p.flags.end());
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error(std::string("posix_spawn /proc/self/exe: ") + std::strerror(rc));
  return pid;
}

inline int wait_for(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  return status;
}

// The key=value pairs of the last line of `log` that starts with `prefix`.
inline std::map<std::string, std::string> parse_line(const fs::path& log, std::string_view prefix) {
  std::ifstream in(log);
  std::map<std::string, std::string> kv;
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(prefix)) continue;
    kv.clear();
    std::istringstream words(line.substr(prefix.size()));
    for (std::string w; words >> w;)
      if (auto eq = w.find('='); eq != std::string::npos) kv[w.substr(0, eq)] = w.substr(eq + 1);
  }
  return kv;
}

inline std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

// Removes a directory this check made earlier, refusing anything that holds other files.
inline void clear_run_dir(const fs::path& dir) {
  if (!fs::exists(dir)) return;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (name != "latest" && name != ".ckpt_lock" && !name.starts_with("latest.tmp.") && !name.starts_with("global_step"))
      throw std::runtime_error(dir.string() + " holds " + name +
                               ", which no checkpoint wrote; remove it or pick another --check directory");
  }
  fs::remove_all(dir);
}

/// Runs the proof; prints `resume check: PASS` and returns 0 only when both runs end with
/// bit-identical results.
inline int run(const proof& p) {
  const fs::path root = p.dir;
  const fs::path a = root / "uninterrupted", b = root / "crashed";
  const std::uint64_t n = p.steps, k = p.save_interval;
  // Default crash point: past the middle, between two saves, so work since the last save is lost.
  const std::uint64_t s = p.crash_at.value_or(std::min(n - 1, n / 2 + k / 3 + 1));
  if (s == 0 || s >= n) throw std::runtime_error("--crash-at must lie in (0, --steps)");
  const std::uint64_t expect_resume = (s - 1) / k * k;  // the crash comes before the save at step s
  clear_run_dir(a);
  clear_run_dir(b);
  fs::create_directories(root);
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto fail = [&](const std::string& why, const fs::path& log) {
    std::printf("resume check: FAIL - %s (log: %s)\n", why.c_str(), log.c_str());
    return 1;
  };

  // Runs 1 and 2 are independent, so they run side by side.
  std::printf("[1/3] uninterrupted run to step %llu, saving every %llu  (%s)\n", ull(n), ull(k), a.c_str());
  std::printf("[2/3] run killed with SIGKILL at step %llu                (%s)\n", ull(s), b.c_str());
  std::fflush(stdout);
  const pid_t p1 = spawn(p, {"--save", a.string()}, root / "uninterrupted.log");
  const pid_t p2 = spawn(p, {"--save", b.string(), "--crash-at", std::to_string(s)}, root / "crashed.log");
  const int st1 = wait_for(p1), st2 = wait_for(p2);
  if (!WIFEXITED(st1) || WEXITSTATUS(st1) != 0)
    return fail("the uninterrupted run " + describe(st1), root / "uninterrupted.log");
  if (!WIFSIGNALED(st2) || WTERMSIG(st2) != SIGKILL)
    return fail("the crashing run should have been killed by SIGKILL but " + describe(st2), root / "crashed.log");
  std::string latest = "(none)";
  std::ifstream(b / "latest") >> latest;
  std::printf("      both done in %.2f s; the crashed run left latest = %s\n", seconds(), latest.c_str());

  std::printf("[3/3] resumed run from %s to step %llu\n", b.c_str(), ull(n));
  std::fflush(stdout);
  const int st3 = wait_for(spawn(p, {"--save", b.string(), "--resume"}, root / "resumed.log"));
  if (!WIFEXITED(st3) || WEXITSTATUS(st3) != 0) return fail("the resumed run " + describe(st3), root / "resumed.log");
  std::printf("      done at %.2f s\n", seconds());

  auto r1 = parse_line(root / "uninterrupted.log", "result:");
  auto r3 = parse_line(root / "resumed.log", "result:");
  auto resumed = parse_line(root / "resumed.log", "resumed:");
  if (r1.empty()) return fail("no result line", root / "uninterrupted.log");
  if (r3.empty()) return fail("no result line", root / "resumed.log");
  const std::string from = resumed.count("iteration") ? resumed["iteration"] : "0";
  if (from != std::to_string(expect_resume))
    return fail("the resumed run restarted from iteration " + from + ", not " + std::to_string(expect_resume),
                root / "resumed.log");
  std::printf("      uninterrupted: %s loss %s weights %s state %s\n", r1["iteration"].c_str(), r1["eval_loss"].c_str(),
              r1["weights_xxh3"].c_str(), r1["state_xxh3"].c_str());
  std::printf("      resumed:       %s loss %s weights %s state %s\n", r3["iteration"].c_str(), r3["eval_loss"].c_str(),
              r3["weights_xxh3"].c_str(), r3["state_xxh3"].c_str());
  for (const char* key : {"iteration", "eval_loss_bits", "weights_xxh3", "state_xxh3"})
    if (r1[key] != r3[key])
      return fail(std::string(key) + " differs: uninterrupted " + r1[key] + ", resumed " + r3[key],
                  root / "resumed.log");
  std::printf("resume check: PASS - final loss %s and weight hash %s identical (state hash %s; crashed at step %llu, "
              "resumed from step %llu; %.2f s)\n",
              r1["eval_loss"].c_str(), r1["weights_xxh3"].c_str(), r1["state_xxh3"].c_str(), ull(s), ull(expect_resume),
              seconds());
  return 0;
}

}  // namespace resume_check
