#pragma once
/// @file save_handle.hpp
/// `ckpt::save_handle`: a save running in the background, as `checkpointer::save_async` returns it.

#if defined(__linux__)
#include <sys/resource.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace ckpt {

namespace detail {
/// Raises the calling thread's nice value by `nice` (Linux keeps one per thread, and threads it
/// starts inherit it). Best effort: a failure leaves the priority as it was.
inline void lower_thread_priority(int nice) noexcept {
#if defined(__linux__)
  if (nice > 0) {
    errno = 0;
    const int now = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
    if (errno == 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), std::min(19, now + nice));
  }
#else
  (void)nice;
#endif
}

/// Shared by the background thread, the checkpointer and every handle to one save.
struct async_save_state {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  bool observed = false;  // someone has been given the error (or the success)
  std::exception_ptr failure;

  void finish(std::exception_ptr e) {
    std::lock_guard lock(mu);
    failure = std::move(e);
    finished = true;
    cv.notify_all();
  }
  /// Blocks until finished; rethrows the failure when `rethrow`.
  void wait(bool rethrow) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return finished; });
    observed = true;
    if (rethrow && failure) std::rethrow_exception(failure);
  }
};

/// The async save in flight: its thread and its shared state. A save's thread first joins the
/// thread of the save before it, whose work has ended by then (save_async settles that save
/// first): joining a thread frees its stack, and glibc then unmaps the stacks its cache holds
/// past 40 MiB (those of the workers each save starts and ends). On a virtual machine each such
/// unmap waits for the other CPUs to drop the mapping, and joining in save_async had added
/// 45-77 ms to the time it blocks for (docs/performance.md, "Async save").
class background_save {
 public:
  /// Starts `body`, the work of the save whose shared state is `state`, on a new thread, which
  /// first joins the one started before it.
  template <class F>
  void start(std::shared_ptr<async_save_state> state, F body) {
    // jthread: should the new thread not start, the lambda's copy of the old one joins it.
    thread_ = std::jthread([previous = std::move(thread_), previous_state = std::exchange(state_, std::move(state)),
                            body = std::move(body)]() mutable {
      if (previous.joinable()) previous.join();
      previous_state.reset();  // after the join: see state_
      body();
    });
  }

  /// Waits until the last save started, if any, has ended; throws its error when `rethrow` and
  /// no handle's `wait()` has thrown it already (an error is reported once). Its thread may
  /// still be exiting: the next save's thread joins it.
  void settle(bool rethrow) {
    if (!state_) return;
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->finished; });
    const bool unseen = !state_->observed;
    state_->observed = true;
    if (rethrow && unseen && state_->failure) std::rethrow_exception(state_->failure);
  }

  /// Joins the last thread started (which joined those before it), then settles its save and
  /// forgets it.
  void finish(bool rethrow) {
    if (thread_.joinable()) thread_.join();
    settle(rethrow);
    state_.reset();
  }

 private:
  std::jthread thread_;
  // The state of the last save started, released only once its thread is joined. A failed save's
  // error is freed with the state's last reference, and the caller may be reading that error
  // (rethrown by settle) while the thread exits: the reference count is atomic, but inside
  // libstdc++, where ThreadSanitizer cannot see it, and it reported the free on the exiting
  // thread as a race. Joined first, the free is ordered after the thread's end.
  std::shared_ptr<async_save_state> state_;
};
}  // namespace detail

/// A save that `checkpointer::save_async` started: the state was already snapshotted into host
/// buffers when it returned; writing and committing go on in the background.
///
/// The save's error, if any, is thrown by `wait()`, or else by the checkpointer's next save,
/// save_async or load (which first wait for the save in flight). Destroying the handle does not
/// cancel or wait for the save; destroying the checkpointer waits for it.
///
/// @code
/// auto pending = cp.save_async(step, model);  // returns once the state is snapshotted
/// train_more(model);                          // safe: the save writes its own copy
/// pending.wait();                             // committed here, or throws ckpt::error
/// @endcode
class save_handle {
 public:
  save_handle() = default;
  explicit save_handle(std::shared_ptr<detail::async_save_state> s) : state_(std::move(s)) {}

  /// Blocks until the save is committed (returns) or has failed (throws its `ckpt::error`).
  void wait() const {
    if (state_) state_->wait(true);
  }
  /// Whether the save has finished, successfully or not (never blocks).
  bool done() const {
    if (!state_) return true;
    std::lock_guard lock(state_->mu);
    return state_->finished;
  }
  /// Whether this handle refers to a save at all (a default-constructed one does not).
  bool valid() const noexcept { return state_ != nullptr; }

 private:
  std::shared_ptr<detail::async_save_state> state_;
};

}  // namespace ckpt
