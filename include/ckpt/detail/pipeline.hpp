#pragma once
// A bounded, ordered pipeline: the shape of every save and of every parallel load.
//
// Items 0..n-1 pass through three stages. `stage(i, slot)` runs on the calling thread, in order
// (it copies a chunk into the slot's buffer, or starts the copy: a device copy is enqueued on the
// caller's thread, and a worker may wait for it);
// `work(i, slot)` runs on one of `workers` threads in any order (encode, hash, verify); `finish(i,
// slot)` runs on one finishing thread, in order (append to the file). An item holds its slot
// from stage to finish, and there are only `slots` slots, so the memory in flight is bounded by
// what the slots own, whatever n is. Staging, working and finishing overlap.
//
// Work that needs neither order nor buffers (a load's chunks read straight into host tensors)
// runs on `parallel_for` instead: no hand-offs between threads per item.

#include <algorithm>
#include <atomic>
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
  // One condition per kind of waiter, each told only when what it waits for may have
  // happened: with one condition and notify_all, every event woke every thread, and a state of
  // 10 000 small tensors spent two thirds of its save or load switching between threads.
  std::condition_variable can_work, can_finish, can_stage;
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
    can_work.notify_all();
    can_finish.notify_all();
    can_stage.notify_all();
  };
  auto work_loop = [&] {
    for (;;) {
      std::size_t i;
      {
        std::unique_lock lock(mu);
        can_work.wait(lock, [&] { return failed || taken < staged || taken == n; });
        if (failed || taken == n) return;
        i = taken++;
        if (taken == n) can_work.notify_all();  // the last item: idle workers may leave
      }
      try {
        work(i, i % slots);
      } catch (...) {
        return fail(i);
      }
      std::lock_guard lock(mu);
      worked[i % slots] = i;
      if (i == finished) can_finish.notify_one();  // the item the finisher waits for
    }
  };
  auto finish_loop = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      {
        std::unique_lock lock(mu);
        can_finish.wait(lock, [&] { return failed || worked[i % slots] == i; });
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
      can_stage.notify_one();
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
        can_stage.wait(lock, [&] { return failed || i - finished < slots; });
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
      can_work.notify_one();
    }
  }  // joins every thread
  if (failure) std::rethrow_exception(failure);
}

/// Runs work(i, w) for every i in [0, n) on `workers` threads, the caller's among them, in no
/// particular order; w (0 to workers - 1) numbers the thread, for state it keeps between items.
/// The first failure (lowest i among those that failed) stops the threads from starting more
/// items and is rethrown here, after every thread has stopped.
template <class Work>
void parallel_for(std::size_t n, unsigned workers, Work&& work) {
  if (n == 0) return;
  workers = static_cast<unsigned>(std::clamp<std::size_t>(workers, 1, n));
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::size_t failed_at = SIZE_MAX;
  std::exception_ptr failure;
  auto loop = [&](unsigned w) {
    while (!failed.load(std::memory_order_relaxed)) {
      const auto i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      try {
        work(i, w);
      } catch (...) {
        std::lock_guard lock(mu);
        if (i < failed_at) {
          failed_at = i;
          failure = std::current_exception();
        }
        failed = true;
        return;
      }
    }
  };
  {
    std::vector<std::jthread> threads;
    threads.reserve(workers - 1);
    try {
      for (unsigned w = 1; w < workers; ++w) threads.emplace_back(loop, w);
    } catch (...) {  // could not start a thread: stop the ones that did start (joined on the way out)
      failed = true;
      throw;
    }
    loop(0);
  }  // joins every thread
  if (failure) std::rethrow_exception(failure);
}

}  // namespace ckpt::detail
