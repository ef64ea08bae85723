#pragma once
// A stand-in for the CUDA runtime, so that device_copy's scheduling, ordering and error paths
// are tested on machines without a GPU. It keeps CUDA's semantics where they matter:
//
// - every stream is a thread that runs its operations in order, each copy after a small delay,
//   so a copy's bytes are not there until the stream got to it: reading a pinned buffer before
//   synchronising shows up as wrong data, not as luck;
// - an event completes when its stream reaches the point where it was recorded; waiting on
//   an event waits for its most recent record, and an event never recorded is complete;
// - "kernels" (launch) run on a stream like copies, so work enqueued before a save is
//   observed only if ckpt orders its stream after the user's;
// - any call can be made to fail on its n-th use with a CUDA error string;
// - query(stream) says whether the stream has run everything enqueued on it, as
//   cudaStreamQuery does, so a watchdog that polls instead of blocking can be tested;
// - the rules a host engine relies on: the current device is per thread (none until the
//   thread sets one); streams and events belong to the device current when they were made,
//   and recording an event on another device's stream fails as cudaEventRecord does; every
//   failure, and a not-ready query, is left in the calling thread's last-error slot until
//   clear_error (cudaGetLastError) takes it, so a test sees what ckpt leaves for the engine's
//   next launch check.
//
// "Device memory" is host memory the fake hands out (device_alloc, tracked like the pinned
// buffers so tests can check nothing leaks); copies are memcpy.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fake {

struct event_impl {
  int device = 0;  // the device current when it was made
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0, completed = 0;
  void complete(std::uint64_t gen) {
    std::lock_guard lock(mu);
    completed = std::max(completed, gen);
    cv.notify_all();
  }
  void wait_for(std::uint64_t gen) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return completed >= gen; });
  }
};

class stream_impl {
 public:
  /// device -1: the legacy default stream, which stands for every device's.
  explicit stream_impl(std::string name, int device = -1) : name_(std::move(name)), device_(device), worker_([this] { run(); }) {}
  ~stream_impl() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void enqueue(std::function<void()> op) {
    {
      std::lock_guard lock(mu_);
      ops_.push_back(std::move(op));
    }
    cv_.notify_all();
  }
  const std::string& name() const { return name_; }
  int device() const { return device_; }
  /// Whether every operation enqueued so far has run (cudaStreamQuery).
  bool idle() {
    std::lock_guard lock(mu_);
    return ops_.empty() && !running_;
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !ops_.empty(); });
        if (ops_.empty()) return;
        op = std::move(ops_.front());
        ops_.pop_front();
        running_ = true;
      }
      op();
      std::lock_guard lock(mu_);
      running_ = false;
    }
  }
  std::string name_;
  int device_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
  bool stop_ = false;
  bool running_ = false;
  std::thread worker_;
};

/// What the fake remembers across copies of the runtime (the policy holds one copy).
struct state {
  /// Names this runtime in each thread's current-device table (an address could be reused).
  const std::uint64_t serial = [] {
    static std::atomic<std::uint64_t> next{0};
    return ++next;
  }();
  std::mutex mu;
  std::chrono::microseconds copy_delay{200};
  std::map<std::string, std::pair<int, std::string>> fail_on;  // call -> (n-th use, error)
  std::map<std::string, int> uses;
  std::vector<std::string> calls;  // in order, for ordering checks
  std::size_t pinned_now = 0, pinned_peak = 0, pinned_allocs = 0, streams_alive = 0, events_alive = 0;
  std::map<void*, std::size_t> pinned_sizes;
  // "Device memory" from device_alloc, tracked the same way.
  std::size_t device_now = 0, device_allocs = 0;
  std::map<void*, std::size_t> device_sizes;
  std::atomic<std::uint64_t> queries{0};
  // Calls made on a thread that never chose a device with set_device: on a real GPU they would
  // run in (and, the first time, create) a context on GPU 0.
  std::atomic<std::uint64_t> calls_without_device{0};
  // Each thread's last-error slot (cudaGetLastError's), by thread; under mu.
  std::map<std::thread::id, std::string> last_error;
  std::atomic<std::uint64_t> not_ready_answers{0};
  // Events outlive destroy() while operations still refer to them, as CUDA's do.
  std::map<event_impl*, std::shared_ptr<event_impl>> events;
  std::atomic<int> copies_in_flight{0}, max_copies_in_flight{0};
  std::unique_ptr<stream_impl> legacy = std::make_unique<stream_impl>("legacy");  // stream 0
};

struct runtime {
  using stream = stream_impl*;
  using event = event_impl*;
  struct failure : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  std::shared_ptr<state> st = std::make_shared<state>();

  /// The calling thread's current device on this runtime, -1 before it set one (CUDA's
  /// current device is per thread).
  static int& current(const state* s) {
    thread_local std::map<std::uint64_t, int> devices;
    return devices.try_emplace(s->serial, -1).first->second;
  }
  int current_device_now() const { return current(st.get()); }

  /// A failure, as the runtime reports one: thrown, and left in the thread's last-error slot.
  [[noreturn]] void fail(const std::string& what) {
    {
      std::lock_guard lock(st->mu);
      st->last_error[std::this_thread::get_id()] = what;
    }
    throw failure(what);
  }
  void enter(const std::string& call) {
    if (call != "set_device" && current(st.get()) < 0) ++st->calls_without_device;
    std::string error;
    {
      std::lock_guard lock(st->mu);
      st->calls.push_back(call);
      const int n = ++st->uses[call];
      if (auto it = st->fail_on.find(call); it != st->fail_on.end() && it->second.first == n) error = it->second.second;
    }
    if (!error.empty()) fail(error);
  }
  stream_impl* resolve(stream s) { return s ? s : st->legacy.get(); }
  /// The device new streams and events belong to: the current one (GPU 0 where none was set,
  /// as CUDA would make its context there).
  int here() const { return std::max(current(st.get()), 0); }

  // ----- the CUDA contract ----------------------------------------------------------------------

  /// cudaGetLastError: takes the thread's slot.
  void clear_error() noexcept {
    std::lock_guard lock(st->mu);
    st->last_error.erase(std::this_thread::get_id());
  }
  /// What is left in any thread's slot (for tests): each entry "error".
  std::vector<std::string> errors_left() const {
    std::lock_guard lock(st->mu);
    std::vector<std::string> left;
    for (const auto& [_, e] : st->last_error) left.push_back(e);
    return left;
  }
  using device_state = int;
  device_state current_device() noexcept { return current(st.get()); }
  void restore_device(device_state d) noexcept { current(st.get()) = d; }
  int stream_device(stream s) { return s ? s->device() : -1; }

  void set_device(int d) {
    enter("set_device");
    current(st.get()) = d;
  }
  void* host_alloc(std::size_t n) {
    enter("host_alloc");
    std::lock_guard lock(st->mu);
    st->pinned_now += n;
    st->pinned_peak = std::max(st->pinned_peak, st->pinned_now);
    ++st->pinned_allocs;
    // Page-aligned, as cudaHostAlloc's memory is (O_DIRECT writes straight from it).
    void* p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096 + 4096);
    st->pinned_sizes[p] = n;
    return p;
  }
  void host_free(void* p) noexcept {
    std::lock_guard lock(st->mu);
    st->pinned_now -= st->pinned_sizes[p];
    st->pinned_sizes.erase(p);
    std::free(p);
  }
  void* device_alloc(std::size_t n) {
    enter("device_alloc");
    std::lock_guard lock(st->mu);
    st->device_now += n;
    ++st->device_allocs;
    void* p = std::malloc(n ? n : 1);
    st->device_sizes[p] = n;
    return p;
  }
  void device_free(void* p) noexcept {
    if (!p) return;
    std::lock_guard lock(st->mu);
    st->device_now -= st->device_sizes[p];
    st->device_sizes.erase(p);
    std::free(p);
  }
  /// Polled by watchdogs, so not recorded in `calls` (it would drown the ordering checks).
  bool query(stream s) {
    if (current(st.get()) < 0) ++st->calls_without_device;
    ++st->queries;
    if (resolve(s)->idle()) return true;
    ++st->not_ready_answers;
    std::lock_guard lock(st->mu);
    st->last_error[std::this_thread::get_id()] = "cudaErrorNotReady: device not ready";
    return false;
  }
  stream make_stream() {
    enter("make_stream");
    std::lock_guard lock(st->mu);
    ++st->streams_alive;
    return new stream_impl("ckpt", here());
  }
  /// A stream of the user's, on the calling thread's current device (cudaStreamCreate).
  stream user_stream(std::string name) { return new stream_impl(std::move(name), here()); }
  event make_event() {
    enter("make_event");
    auto e = std::make_shared<event_impl>();
    e->device = here();
    std::lock_guard lock(st->mu);
    ++st->events_alive;
    st->events[e.get()] = e;
    return e.get();
  }
  std::shared_ptr<event_impl> hold(event e) {
    std::lock_guard lock(st->mu);
    return st->events.at(e);
  }
  void destroy(stream s) noexcept {
    if (!s) return;
    delete s;
    std::lock_guard lock(st->mu);
    --st->streams_alive;
  }
  void destroy(event e) noexcept {
    if (!e) return;
    std::lock_guard lock(st->mu);
    st->events.erase(e);
    --st->events_alive;
  }
  void copy_async(void* dst, const void* src, std::size_t n, stream s) {
    enter("copy_async");
    auto shared = st;
    const int now = ++shared->copies_in_flight;
    for (int seen = shared->max_copies_in_flight; now > seen && !shared->max_copies_in_flight.compare_exchange_weak(seen, now);) {
    }
    resolve(s)->enqueue([dst, src, n, shared] {
      std::this_thread::sleep_for(shared->copy_delay);
      std::memcpy(dst, src, n);
      --shared->copies_in_flight;
    });
  }
  void record(event e, stream s) {
    enter("record " + resolve(s)->name());
    if (const int d = resolve(s)->device(); d >= 0 && d != e->device)
      fail("cudaErrorInvalidResourceHandle: invalid resource handle (an event of cuda:" + std::to_string(e->device) +
           " recorded on a stream of cuda:" + std::to_string(d) + ")");
    std::uint64_t gen;
    {
      std::lock_guard lock(e->mu);
      gen = ++e->recorded;
    }
    resolve(s)->enqueue([e = hold(e), gen] { e->complete(gen); });
  }
  void wait(stream s, event e) {
    enter("wait " + resolve(s)->name());
    std::uint64_t gen;
    {
      std::lock_guard lock(e->mu);
      gen = e->recorded;
    }
    resolve(s)->enqueue([e = hold(e), gen] { e->wait_for(gen); });
  }
  void sync(event e) {
    enter("sync event");
    std::uint64_t gen;
    {
      std::lock_guard lock(e->mu);
      gen = e->recorded;
    }
    e->wait_for(gen);
  }
  void sync(stream s) {
    enter("sync stream");
    finish(s);
  }

  /// The user's side: a "kernel" on a stream (nullptr: the legacy default stream).
  void launch(stream s, std::function<void()> kernel) { resolve(s)->enqueue(std::move(kernel)); }
  /// Waits until everything enqueued on `s` so far has run.
  void finish(stream s) {
    auto done = std::make_shared<event_impl>();
    resolve(s)->enqueue([done] { done->complete(1); });
    done->wait_for(1);
  }
};

}  // namespace fake
