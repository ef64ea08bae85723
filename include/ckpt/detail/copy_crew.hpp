#pragma once
// Host-to-host copies split over the caller's thread and helper threads kept between calls: the
// copy of an async save's snapshot, which training waits for.
//
// One thread's memcpy does not saturate a machine's memory bandwidth: on the 2-core VM of
// docs/performance.md, two threads copied 1 GiB in 0.043-0.049 s against 0.070 s for one. The
// helpers are started once and parked between copies: a thread started and joined per copy
// would cost its start, and its join frees its stack, which glibc may unmap (a TLB shootdown
// across the cores, 10-18 ms each on that VM: "save_async waited for the thread of the save
// before it" there).

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

namespace ckpt::detail {

/// One copy of `bytes` bytes from `from` to `to` (the two do not overlap).
struct copy_job {
  std::byte* to = nullptr;
  const std::byte* from = nullptr;
  std::size_t bytes = 0;
};

class copy_crew {
 public:
  /// Each thread's share is at least this many bytes by default: below it, waking a helper costs
  /// more than the copy it would take over.
  static constexpr std::size_t default_min_share = std::size_t{32} << 20;

  /// Copies with at most `threads` threads, the caller's included (1: the caller alone), each
  /// taking at least `min_share` bytes.
  explicit copy_crew(unsigned threads, std::size_t min_share = default_min_share) noexcept
      : threads_(std::max(1u, threads)), min_share_(std::max<std::size_t>(1, min_share)) {}
  copy_crew(const copy_crew&) = delete;
  copy_crew& operator=(const copy_crew&) = delete;
  ~copy_crew() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& t : helpers_) t.join();
  }

  /// Makes every copy in `jobs` and returns when all have been made. The bytes, taken end to end
  /// across the copies, are cut into equal shares (share_begin), one per thread.
  void copy(std::span<const copy_job> jobs) {
    std::size_t total = 0;
    for (const auto& j : jobs) total += j.bytes;
    const auto n = static_cast<unsigned>(std::min<std::size_t>(threads_, std::max<std::size_t>(1, total / min_share_)));
    const auto started = start_helpers(n - 1);
    if (started == 0) return copy_share(jobs, total, 0, 1);  // the caller alone
    {
      std::lock_guard lock(mu_);
      jobs_ = jobs;
      total_ = total;
      shares_ = started + 1;
      unfinished_ = started;
      ++round_;
    }
    start_.notify_all();
    copy_share(jobs, total, 0, started + 1);
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return unfinished_ == 0; });
  }

  /// Where share `k` of `n` begins in `total` bytes (`total` for k = n): equal shares, the last
  /// taking the remainder. Cut at any byte: two threads then share at most one cache line at a
  /// cut, which costs nothing that can be measured against megabytes.
  static std::size_t share_begin(std::size_t total, unsigned k, unsigned n) noexcept {
    return k >= n ? total : total / n * k;
  }

  /// Helper threads started so far (for tests).
  std::size_t helpers() const noexcept { return helpers_.size(); }
  /// Shares the helpers have copied, over all rounds (for tests).
  std::size_t helper_shares() {
    std::lock_guard lock(mu_);
    return helper_shares_;
  }

 private:
  /// Starts helpers until `wanted` run; returns how many do (fewer where the system refuses a
  /// thread: the copy then runs with those it has).
  unsigned start_helpers(unsigned wanted) {
    try {
      helpers_.reserve(wanted);
      while (helpers_.size() < wanted) {
        const auto index = static_cast<unsigned>(helpers_.size()) + 1;  // share 0 is the caller's
        helpers_.emplace_back([this, index] { help(index); });
      }
    } catch (const std::system_error&) {
    } catch (const std::bad_alloc&) {
    }
    return std::min(wanted, static_cast<unsigned>(helpers_.size()));
  }

  void help(unsigned index) {
    std::uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      start_.wait(lock, [&] { return stop_ || round_ != seen; });
      if (stop_) return;
      seen = round_;
      if (index >= shares_) continue;  // this round needs fewer helpers
      const auto jobs = jobs_;
      const auto total = total_;
      const auto shares = shares_;
      lock.unlock();
      copy_share(jobs, total, index, shares);
      lock.lock();
      ++helper_shares_;
      if (--unfinished_ == 0) done_.notify_one();
    }
  }

  /// Copies share `k` of `n`: the bytes [share_begin(k), share_begin(k + 1)) of the jobs taken
  /// end to end.
  static void copy_share(std::span<const copy_job> jobs, std::size_t total, unsigned k, unsigned n) {
    const auto from = share_begin(total, k, n), to = share_begin(total, k + 1, n);
    std::size_t at = 0;  // where the current job starts, in the bytes taken end to end
    for (const auto& j : jobs) {
      const auto lo = std::max(from, at), hi = std::min(to, at + j.bytes);
      if (lo < hi) std::memcpy(j.to + (lo - at), j.from + (lo - at), hi - lo);
      at += j.bytes;
      if (at >= to) break;
    }
  }

  unsigned threads_;
  std::size_t min_share_;
  std::vector<std::thread> helpers_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  std::uint64_t round_ = 0;
  std::span<const copy_job> jobs_;
  std::size_t total_ = 0;
  unsigned shares_ = 0;
  unsigned unfinished_ = 0;
  std::size_t helper_shares_ = 0;
  bool stop_ = false;
};

}  // namespace ckpt::detail
