#pragma once
// The retention rule's deletions, run on a thread of their own so that a save returns once it
// has committed. Unlinking a file of a gigabyte waits on the disk for a quarter of a second or
// more (ext4 mounted with `discard` trims its blocks as it frees them), and a save with
// keep_last_n deleted one such tag before returning (docs/performance.md, "Retention's
// deletion"). The old tags' metadata.json goes first, on the caller's thread (tag_store::uncommit):
// by the time the save returns they are no longer committed, and what is left on disk is what a
// crashed save would leave, which the next save's retention removes again should this thread
// never finish.

#include <exception>
#include <system_error>
#include <thread>
#include <utility>

namespace ckpt::detail {

/// One deletion in flight at most. Not thread-safe: the checkpointer calls it from one thread
/// at a time (the caller's, or the save_async thread, which the caller joins first).
class background_removal {
 public:
  background_removal() = default;
  background_removal(const background_removal&) = delete;
  background_removal& operator=(const background_removal&) = delete;
  ~background_removal() { join(); }

  /// Runs `body` on a new thread once the deletion before it has ended; where no thread can
  /// start, runs it here (and its error is thrown here).
  template <class F>
  void start(F body) {
    join();
    try {
      thread_ = std::thread([this, body]() mutable {
        try {
          body();
        } catch (...) {
          failure_ = std::current_exception();  // read only after the join
        }
      });
    } catch (const std::system_error&) {
      body();
    }
  }

  /// Waits for the deletion in flight, if any.
  void join() {
    if (thread_.joinable()) thread_.join();
  }

  /// The error of the last deletion that failed, handed over once (joins first).
  std::exception_ptr take_failure() {
    join();
    return std::exchange(failure_, nullptr);
  }

 private:
  std::thread thread_;
  std::exception_ptr failure_;
};

}  // namespace ckpt::detail
