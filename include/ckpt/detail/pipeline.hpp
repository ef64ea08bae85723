#pragma once
// A bounded, ordered pipeline: the shape of every save and of every parallel load.
//
// Items 0..n-1 pass through three stages. `stage(i, slot)` runs on the calling thread, in order
// (it copies a chunk into the slot's buffer: a device copy must stay on the caller's thread);
// `work(i, slot)` runs on one of `workers` threads in any order (encode, hash, verify); `finish(i,
// slot)` runs on one finishing thread, in order (append to the file). An item holds its slot
// from stage to finish, and there are only `slots` slots, so the memory in flight is bounded by
// what the slots own, whatever n is. Staging, working and finishing overlap.

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt::detail {

/// Worker threads for `requested` (0: one per core, at most 8).
inline unsigned worker_count(unsigned requested) noexcept {
  if (requested) return requested;
  return std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
}

/// Runs the three stages over n items (see the file comment). The first failure (lowest item
/// number among those that failed) stops every stage and is rethrown here, after every thread
/// has stopped, so no stage touches a buffer after this returns.
template <class Stage, class Work, class Finish>
void run_pipeline(std::size_t n, std::size_t slots, unsigned workers, Stage&& stage, Work&& work, Finish&& finish) {
  if (n == 0) return;
  slots = std::max<std::size_t>(1, std::min(slots, n));
  workers = std::max(1u, workers);
  std::mutex mu;
  std::condition_variable cv;
  std::size_t staged = 0, taken = 0, finished = 0;
  std::vector<std::size_t> worked(slots, SIZE_MAX);  // item whose work is done, by slot
  bool failed = false;
  std::size_t failed_at = SIZE_MAX;
  std::exception_ptr failure;
  auto fail = [&](std::size_t i) {
    std::lock_guard lock(mu);
    if (i < failed_at) {
      failed_at = i;
      failure = std::current_exception();
    }
    failed = true;
    cv.notify_all();
  };
  auto work_loop = [&] {
    for (;;) {
      std::size_t i;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return failed || taken < staged || taken == n; });
        if (failed || taken == n) return;
        i = taken++;
      }
      try {
        work(i, i % slots);
      } catch (...) {
        return fail(i);
      }
      std::lock_guard lock(mu);
      worked[i % slots] = i;
      cv.notify_all();
    }
  };
  auto finish_loop = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return failed || worked[i % slots] == i; });
        if (failed) return;
      }
      try {
        finish(i, i % slots);
      } catch (...) {
        return fail(i);
      }
      std::lock_guard lock(mu);
      worked[i % slots] = SIZE_MAX;
      finished = i + 1;
      cv.notify_all();
    }
  };
  {
    std::vector<std::jthread> threads;
    threads.reserve(workers + 1);
    try {
      for (unsigned w = 0; w < workers; ++w) threads.emplace_back(work_loop);
      threads.emplace_back(finish_loop);
    } catch (...) {  // could not start a thread: stop the ones that did start
      fail(0);
      throw;
    }
    for (std::size_t i = 0; i < n; ++i) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return failed || i - finished < slots; });
        if (failed) break;
      }
      try {
        stage(i, i % slots);
      } catch (...) {
        fail(i);
        break;
      }
      std::lock_guard lock(mu);
      staged = i + 1;
      cv.notify_all();
    }
  }  // joins every thread
  if (failure) std::rethrow_exception(failure);
}

}  // namespace ckpt::detail
