// Crash campaign: a child process saves checkpoint after checkpoint (sync or async, with
// retention) and is killed with SIGKILL at a random moment; after every kill the parent checks
// ckpt's promise on what the child left behind:
//   - `latest` names a committed tag that loads, verifies and holds exactly what was saved at
//     its iteration (the state is a pure function of the iteration);
//   - every committed tag does the same: none is partial;
//   - the next save cleans up what the killed one left (temporary files, uncommitted tags).
//
//   crash_campaign [--trials 200] [--seed 1] [--mode sync|async|both] [--max-delay-ms 60] [--dir /tmp]
//
// Prints a tally; exits non-zero on the first broken promise, saying what and after which kill.

#include <ckpt/ckpt.hpp>

#include "leftovers.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

/// The training state at iteration `it`: every byte derived from `it`, so any checkpoint can be
/// checked against what must have been saved.
struct state {
  std::vector<float> weights = std::vector<float>(64 * 1024);
  std::vector<std::int32_t> counts = std::vector<std::int32_t>(10000);
  std::vector<ckpt::bfloat16> half = std::vector<ckpt::bfloat16>(30000);
  std::mt19937_64 rng;
  std::uint64_t step = 0;

  void set(std::uint64_t it) {
    std::mt19937_64 g(it * 7919 + 1);
    for (auto& w : weights) w = static_cast<float>(g() % 100000) / 1000.f;
    for (auto& c : counts) c = static_cast<std::int32_t>(g());
    for (auto& h : half) h = ckpt::bfloat16(static_cast<float>(g() % 1000) / 10.f);
    rng.seed(it);
    step = it;
  }
  bool operator==(const state&) const = default;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("model.weights", ckpt::view(weights.data(), {256, 256}));
    v.tensor("model.half", half);
    v.group("optimizer", [&](auto& g) { g.tensor("counts", counts); });
    v.value("rng", rng);
    v.value("step", step);
  }
};

using checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::posix>;
constexpr std::size_t keep = 2;

/// The child: saves iterations first, first+1, ... until it is killed.
[[noreturn]] void child(const fs::path& dir, std::uint64_t first, bool async) {
  try {
    checkpointer cp{{}, dir, {.keep_last_n = keep, .chunk_bytes = 64 * 1024}};
    state s;
    for (std::uint64_t it = first;; ++it) {
      s.set(it);
      if (async)
        (void)cp.save_async(it, s);  // the next call waits for it
      else
        cp.save(it, s);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    _exit(3);
  }
}

struct tally {
  int trials = 0, no_commit_yet = 0, first_commit_without_latest = 0, leftovers_seen = 0, tags_verified = 0;
};

using crash::broken;
using crash::leftover;

/// Every committed tag loads exactly what was saved, and `latest` names one of them.
/// `latest_written` says whether an earlier save wrote latest: only the very first save can
/// leave committed tags without it, killed between its commit point (metadata.json) and its
/// write of latest (steps 3 and 4 of the commit protocol); once written, latest is only ever
/// replaced by a rename, never removed.
void verify(const fs::path& dir, int trial, tally& t, bool latest_written) {
  checkpointer cp{{}, dir, {.keep_last_n = keep, .chunk_bytes = 64 * 1024}};
  const auto tags = cp.tags();
  const auto last = cp.latest();
  bool latest_committed = false;
  for (const auto& tag : tags) {
    latest_committed |= last && tag.tag == *last;
    state got, want;
    want.set(tag.iteration);
    try {
      const auto r = cp.load(got, {.tag = tag.tag});
      if (r.iteration != tag.iteration) broken(trial, tag.tag + " loaded iteration " + std::to_string(r.iteration));
    } catch (const ckpt::error& e) {
      broken(trial, "committed tag " + tag.tag + " does not load: " + e.what());
    }
    if (!(got == want)) broken(trial, tag.tag + " does not hold what was saved at iteration " + std::to_string(tag.iteration));
    ++t.tags_verified;
  }
  if (!last) {
    if (tags.empty()) ++t.no_commit_yet;
    else if (latest_written) broken(trial, "committed tags exist but latest does not");
    else ++t.first_commit_without_latest;
    return;
  }
  if (!latest_committed) broken(trial, "latest names " + *last + ", which is not a committed tag");
  // Loading without a tag goes through latest.
  state got;
  if (cp.load(got).tag != *last) broken(trial, "load() did not load the tag latest names");
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 200, max_delay_ms = 60;
  std::uint64_t seed = 1;
  std::string mode = "both";
  fs::path base = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--trials") trials = std::stoi(v);
    else if (a == "--seed") seed = std::stoull(v);
    else if (a == "--mode") mode = v;
    else if (a == "--max-delay-ms") max_delay_ms = std::stoi(v);
    else if (a == "--dir") base = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const fs::path dir = base / ("ckpt-crash-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::mt19937_64 g(seed);
  tally t;
  std::uint64_t next_iteration = 1;
  for (int trial = 0; trial < trials; ++trial) {
    const bool async = mode == "async" || (mode == "both" && trial % 2 == 1);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) child(dir, next_iteration, async);
    // Kill after a random delay: early ones hit the first save's writes and fsyncs, later ones
    // any point of later saves, their commits and their retention.
    std::this_thread::sleep_for(std::chrono::microseconds(g() % (static_cast<std::uint64_t>(max_delay_ms) * 1000 + 1)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFEXITED(status)) broken(trial, "the child exited with status " + std::to_string(WEXITSTATUS(status)));
    ++t.trials;
    if (!leftover(dir).empty()) ++t.leftovers_seen;
    verify(dir, trial, t, trial > 0);
    // The next save (here, of the parent) must clean up what the killed one left behind.
    {
      checkpointer cp{{}, dir, {.keep_last_n = keep, .chunk_bytes = 64 * 1024}};
      const auto tags = cp.tags();
      next_iteration = (tags.empty() ? 0 : tags.back().iteration) + 1000;
      state s;
      s.set(next_iteration);
      cp.save(next_iteration, s);
      ++next_iteration;
    }
    if (const auto left = leftover(dir); !left.empty())
      broken(trial, "the next save did not clean up the killed save's leftovers: " + left);
    verify(dir, trial, t, true);
  }
  std::printf("crash campaign: %d SIGKILLs (%s saves), %d left a partial save behind, %d before any commit, "
              "%d between the first commit and its latest, %d committed tags verified, 0 broken promises\n",
              t.trials, mode.c_str(), t.leftovers_seen, t.no_commit_yet, t.first_commit_without_latest, t.tags_verified);
  fs::remove_all(dir);
  return 0;
}
