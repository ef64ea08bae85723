#pragma once
/// @file preemption.hpp
/// `ckpt::preemption`: turns a scheduler's SIGTERM (or SIGUSR1) into a request to save, which
/// `checkpointer::should_save` then agrees on across ranks. Opt-in: nothing is installed until
/// `install` is called.

#include <atomic>
#include <csignal>
#include <cstring>
#include <initializer_list>
#include <string>

#include "error.hpp"

namespace ckpt {

/// The process's preemption flag and the signal handlers that set it.
///
/// A handler does nothing but record the signal (an atomic store, which is async-signal-safe),
/// so a signal that arrives in the middle of a save does not disturb it: the save finishes, and
/// the next `should_save` says to save again and stop. The handlers replace the default action
/// (termination), so a program that installs them must stop by itself, as the example does.
///
/// @code
/// ckpt::preemption::install();              // SIGTERM and SIGUSR1
/// for (;; ++step) {
///   train_step();
///   if (cp.should_save(step, 500)) cp.save(step, model);   // every 500 steps, or when told to stop
///   if (cp.preempted()) return 0;                          // every rank leaves at the same step
/// }
/// @endcode
class preemption {
 public:
  /// Installs the handlers (again replacing whatever handler those signals had). Throws
  /// `invalid_argument` naming the signal the system refuses.
  static void install(std::initializer_list<int> signals = {SIGTERM, SIGUSR1}) {
    for (int s : signals) {
      struct sigaction sa;
      std::memset(&sa, 0, sizeof sa);
      sa.sa_handler = &preemption::record;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;  // interrupted reads and writes of a save resume
      if (sigaction(s, &sa, nullptr) != 0)
        throw error(error_kind::invalid_argument, "preemption: cannot install a handler for signal " + std::to_string(s) + ": " +
                                                      std::strerror(errno));
    }
  }

  /// Whether one of the signals arrived in this process (since the last `clear`).
  static bool requested() noexcept { return flag().load(std::memory_order_relaxed) != 0; }
  /// The last signal that arrived, or 0.
  static int signal_number() noexcept { return flag().load(std::memory_order_relaxed); }
  /// Forgets a request (for tests, or a job that chose to carry on).
  static void clear() noexcept { flag().store(0, std::memory_order_relaxed); }
  /// Records a request as the handler does (for tests and for programs that learn of a
  /// preemption another way, e.g. from a scheduler's notice file).
  static void request(int signal_number = SIGTERM) noexcept { flag().store(signal_number, std::memory_order_relaxed); }

 private:
  static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");
  static std::atomic<int>& flag() noexcept {
    static std::atomic<int> f{0};
    return f;
  }
  static void record(int s) noexcept { flag().store(s, std::memory_order_relaxed); }
};

}  // namespace ckpt
