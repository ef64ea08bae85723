#pragma once
/// @file cuda/basic_device_copy.hpp
/// The DevicePolicy for tensors in GPU memory, written against a `Runtime` (the few CUDA
/// runtime calls it makes), so that its scheduling, ordering and error handling are tested on
/// machines without a GPU with a fake runtime. Programs use `ckpt::cuda::device_copy`
/// (`<ckpt/cuda/device_copy.hpp>`), which is this on the real CUDA runtime.
///
/// This header includes no CUDA header.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../impl/checkpointer.ipp"  // its users make checkpointers other than impl/instances.hpp's
#include "../lent_buffer.hpp"
#include "../tensor.hpp"
#include "device_guard.hpp"

namespace ckpt::cuda {

/// How device_copy stages bytes. Pinned host memory is what makes a copy between host and GPU
/// asynchronous (and about twice as fast as from pageable memory); it is a scarce resource, so
/// it is bounded: `slots` buffers of `slot_bytes` per GPU, allocated once and reused by every
/// save and load.
///
/// Beyond the ring, device_copy lends pinned buffers to ckpt's pipelines (`lend`): the save
/// pipeline's staging buffers, the load pipeline's read buffers and save_async's snapshot. A
/// chunk staged into one crosses PCIe in one copy, straight into the buffer that is hashed and
/// written, with no bounce through the ring. `lend_bytes` bounds the pinned memory lent in all;
/// what is given back is kept for the next save. Past the bound, buffers are ordinary memory and
/// copies go through the ring. For save_async to return after little more than the time of the
/// device-to-host copy, lend at least the state's size plus the pipeline's buffers.
struct device_copy_options {
  std::size_t slot_bytes = std::size_t{8} << 20;
  unsigned slots = 3;  ///< pieces in flight: one being copied over PCIe while others are drained
  std::size_t lend_bytes = std::size_t{256} << 20;  ///< pinned memory lent to the pipelines, at most (0: none)
};

/// Tensors in GPU memory (`ckpt::device::cuda(n)`), and host tensors too.
///
/// Saving: a chunk staged into a buffer this policy lent is one copy, and the save pipeline
/// leaves it in flight (`start_to_host`) while it enqueues the next chunk's; the worker that
/// hashes the chunk waits for it. Into other memory, each chunk is copied device → host in
/// pieces of `slot_bytes` through a ring of pinned buffers on ckpt's own stream; while piece k
/// is copied out of its pinned buffer, pieces k+1... are already crossing PCIe.
///
/// Loading: host bytes go into the pinned ring and host → device on ckpt's stream, straight
/// into the tensor; `from_host` returns once they have landed.
///
/// Ordering with your work: before its first copy from or to a GPU, each call makes ckpt's
/// stream wait for everything already enqueued on `user_stream` (default: the legacy default
/// stream), so kernels that produced a tensor before `save` are observed, and your kernels
/// enqueued after `load` returns see the loaded bytes. `user_stream` may belong to another GPU
/// than a tensor: ckpt's stream on the tensor's GPU then waits for an event recorded on your
/// stream's GPU (CUDA orders streams across devices through events). The legacy and the
/// per-thread default streams stand for the default stream of each tensor's own GPU.
///
/// The CUDA contract a host engine relies on: every call leaves the calling thread's current
/// device (its current context) as it found it, and leaves nothing in the thread's last-error
/// slot (a failure ckpt reports as a `ckpt::error`, or recovers from, is cleared there).
///
/// Errors from the runtime become `ckpt::error` naming the call, the runtime's error string
/// and the tensor (its device, dtype, shape and the byte range).
template <class Runtime>
class basic_device_copy {
 public:
  using stream_type = typename Runtime::stream;

  /// Orders copies after the legacy default stream, with the default ring.
  basic_device_copy() : basic_device_copy(Runtime{}) {}
  explicit basic_device_copy(Runtime rt, stream_type user_stream = {}, device_copy_options options = {})
      : rt_(std::make_shared<Runtime>(std::move(rt))), user_(user_stream), options_(options),
        lent_(std::make_shared<lending>(rt_, options.lend_bytes)) {
    if (options_.slot_bytes == 0 || options_.slots < 2)
      throw error(error_kind::invalid_argument, "cuda::device_copy: needs slot_bytes > 0 and at least 2 slots");
  }

  bool accepts(device d) const noexcept { return d.type == device::kind::host || d.type == device::kind::cuda; }

  /// Copies bytes [offset, offset + dst.size()) of `t` into `dst` (pageable host memory).
  void to_host(const tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst) {
    check(t, offset, dst.size());
    if (dst.empty()) return;
    if (t.where().type == device::kind::host) {
      std::memcpy(dst.data(), t.data() + offset, dst.size());
      return;
    }
    detail::device_guard<Runtime> guard(*rt_);
    auto& ctx = context(t.where().id, t);
    drained_on_failure(ctx, [&] {
      order_after_user(ctx, t);
      const auto n = dst.size();
      if (lent_->holds(dst.data(), n)) {  // pinned already: one copy, no bounce
        call(t, offset, n, "cudaMemcpyAsync (device to host)", [&] { rt_->copy_async(dst.data(), t.data() + offset, n, ctx.stream); });
        call(t, offset, n, "cudaStreamSynchronize", [&] { rt_->sync(ctx.stream); });
        return;
      }
      const auto pieces = (n + options_.slot_bytes - 1) / options_.slot_bytes;
      // Piece k is bytes [k * slot_bytes, + piece_len(k)) of dst. (Plain values, not structured
      // bindings: clang 14 cannot capture those in the lambdas below.)
      auto piece_len = [&](std::size_t k) { return std::min(options_.slot_bytes, n - k * options_.slot_bytes); };
      // Keep up to `slots` pieces in flight; drain the oldest into dst while the rest copy.
      std::size_t issued = 0;
      auto issue = [&] {
        const std::size_t at = issued * options_.slot_bytes, len = piece_len(issued);
        auto& s = ctx.slots[issued % ctx.slots.size()];
        call(t, offset + at, len, "cudaMemcpyAsync (device to host)",
             [&] { rt_->copy_async(s.host, t.data() + offset + at, len, ctx.stream); });
        call(t, offset + at, len, "cudaEventRecord", [&] { rt_->record(s.done, ctx.stream); });
        ++issued;
      };
      for (std::size_t k = 0; k < pieces; ++k) {
        while (issued < pieces && issued < k + ctx.slots.size()) issue();
        const std::size_t at = k * options_.slot_bytes, len = piece_len(k);
        auto& s = ctx.slots[k % ctx.slots.size()];
        call(t, offset + at, len, "cudaEventSynchronize", [&] { rt_->sync(s.done); });
        std::memcpy(dst.data() + at, s.host, len);
      }
    });
  }

 private:
  struct gpu_context;

 public:
  /// A copy `start_to_host` left in flight. `wait()` returns once its bytes are in host memory,
  /// or throws the runtime's error as a `ckpt::error` naming the tensor and the byte range. A
  /// handle destroyed unwaited waits (ignoring errors), so the buffer is never written after it
  /// is gone. A handle must not outlive the device_copy that started it.
  class host_copy {
   public:
    host_copy() = default;
    host_copy(host_copy&& o) noexcept
        : ctx_(std::exchange(o.ctx_, nullptr)), event_(o.event_), t_(std::move(o.t_)), at_(o.at_), len_(o.len_) {}
    host_copy& operator=(host_copy&& o) noexcept {
      if (this != &o) {
        settle();
        ctx_ = std::exchange(o.ctx_, nullptr);
        event_ = o.event_;
        t_ = std::move(o.t_);
        at_ = o.at_;
        len_ = o.len_;
      }
      return *this;
    }
    host_copy(const host_copy&) = delete;
    host_copy& operator=(const host_copy&) = delete;
    ~host_copy() { settle(); }

    void wait() {
      if (!ctx_) return;
      auto* ctx = std::exchange(ctx_, nullptr);
      // On the tensor's GPU: a worker thread that never chose one would otherwise make a
      // context on GPU 0 for the wait.
      detail::device_guard<Runtime> guard(*ctx->rt);
      const char* what = "cudaSetDevice";
      try {
        ctx->rt->set_device(ctx->device);
        what = "cudaEventSynchronize (device to host)";
        ctx->rt->sync(event_);
      } catch (const typename Runtime::failure& e) {
        ctx->rt->clear_error();  // reported here, as a ckpt::error
        // The copy may still be under way: the caller's buffer must not be reused or given back
        // before ckpt's stream has drained, as for a failure in any other call.
        ctx->drain();
        ctx->give_back(event_);
        throw failed(what, e, *t_, at_, len_);
      }
      ctx->give_back(event_);
    }

   private:
    friend class basic_device_copy;
    void settle() noexcept {
      try {
        wait();
      } catch (...) {  // a destructor cannot report it; the bytes are not used
      }
    }
    gpu_context* ctx_ = nullptr;
    typename Runtime::event event_{};
    std::optional<tensor_ref> t_;  // for the error's text
    std::uint64_t at_ = 0, len_ = 0;
  };

  /// Starts copying bytes [offset, offset + dst.size()) of `t` into `dst` and returns without
  /// waiting for them, where `dst` lies in a buffer this policy lent: the caller enqueues the
  /// next copy while this one crosses PCIe, and waits on the handle before it reads `dst`. Into
  /// other memory (and for host tensors) the copy is done before this returns, as `to_host`
  /// does it, and the handle is already complete. The save pipeline stages chunks this way.
  ///
  /// @code
  /// auto first = dev.start_to_host(t, 0, {buf.data(), n});
  /// auto second = dev.start_to_host(t, n, {buf.data() + n, n});  // enqueued behind the first
  /// first.wait();                                                 // buf's first n bytes are in
  /// @endcode
  host_copy start_to_host(const tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst) {
    check(t, offset, dst.size());
    if (dst.empty() || t.where().type == device::kind::host || !lent_->holds(dst.data(), dst.size())) {
      to_host(t, offset, dst);
      return {};
    }
    detail::device_guard<Runtime> guard(*rt_);
    auto& ctx = context(t.where().id, t);
    host_copy h;
    drained_on_failure(ctx, [&] {
      order_after_user(ctx, t);
      const auto n = dst.size();
      h.t_.emplace(t);
      h.at_ = offset;
      h.len_ = n;
      const auto e = ctx.take_event([&] {
        typename Runtime::event fresh{};
        call(t, 0, 0, "cudaEventCreateWithFlags", [&] { fresh = rt_->make_event(); });
        return fresh;
      });
      h.ctx_ = &ctx;  // from here on the handle gives the event back, whatever happens
      h.event_ = e;
      call(t, offset, n, "cudaMemcpyAsync (device to host)", [&] { rt_->copy_async(dst.data(), t.data() + offset, n, ctx.stream); });
      call(t, offset, n, "cudaEventRecord", [&] { rt_->record(e, ctx.stream); });
    });
    return h;
  }

  /// Copies `src` into `t` at byte `offset`; returns once the bytes are on the device.
  void from_host(std::span<const std::byte> src, const tensor_ref& t, std::uint64_t offset) {
    check(t, offset, src.size());
    if (src.empty()) return;
    if (t.where().type == device::kind::host) {
      std::memcpy(t.data() + offset, src.data(), src.size());
      return;
    }
    detail::device_guard<Runtime> guard(*rt_);
    auto& ctx = context(t.where().id, t);
    drained_on_failure(ctx, [&] {
      order_after_user(ctx, t);
      const auto n = src.size();
      const bool direct = lent_->holds(src.data(), n);  // pinned already: one copy, no bounce
      if (direct)
        call(t, offset, n, "cudaMemcpyAsync (host to device)", [&] { rt_->copy_async(t.data() + offset, src.data(), n, ctx.stream); });
      std::size_t k = 0;
      for (std::size_t at = 0; !direct && at < n; at += options_.slot_bytes, ++k) {
        const auto len = std::min(options_.slot_bytes, n - at);
        auto& s = ctx.slots[k % ctx.slots.size()];
        // The slot's previous copy must have left it before it is refilled.
        if (k >= ctx.slots.size()) call(t, offset + at, len, "cudaEventSynchronize", [&] { rt_->sync(s.done); });
        std::memcpy(s.host, src.data() + at, len);
        call(t, offset + at, len, "cudaMemcpyAsync (host to device)",
             [&] { rt_->copy_async(t.data() + offset + at, s.host, len, ctx.stream); });
        call(t, offset + at, len, "cudaEventRecord", [&] { rt_->record(s.done, ctx.stream); });
      }
      call(t, offset, n, "cudaStreamSynchronize", [&] { rt_->sync(ctx.stream); });
      // Work the user enqueues from now on follows the copies (they are complete already; the
      // event makes the order explicit for streams that do not synchronise with the host).
      call(t, offset, n, "cudaEventRecord", [&] { rt_->record(ctx.after, ctx.stream); });
      call(t, offset, n, "cudaStreamWaitEvent", [&] { rt_->wait(user_, ctx.after); });
    });
  }

  /// Requests below this are refused: a small buffer gains little from being pinned, and a
  /// snapshot of many small tensors would otherwise pin far more than it holds.
  static constexpr std::size_t min_lend_bytes = std::size_t{64} << 10;

  /// Lends a pinned buffer of at least `n` bytes to ckpt's pipelines, or an empty one (the
  /// borrower then uses ordinary memory) when `n` is under `min_lend_bytes`, when lending it
  /// would take the lent memory past `lend_bytes`, or when the system refuses to pin more
  /// (a locked-memory limit must not fail a save). Buffers given back are reused; idle ones are
  /// freed to make room for a bigger one. Pinned memory is allocated in the calling thread's
  /// current CUDA context (ckpt borrows on the thread that called save or load, which is
  /// normally the thread that runs your kernels); it is portable, so it serves every GPU.
  lent_buffer lend(std::size_t n) {
    if (n < min_lend_bytes) return {};
    try {
      return lent_->lend(n, lent_);
    } catch (const typename Runtime::failure&) {
      rt_->clear_error();  // recovered from: not the caller's error
      return {};
    }
  }

  /// Pinned bytes held now, the ring's and the lent buffers' (for tests and the documentation's bound).
  std::size_t pinned_bytes() const noexcept {
    std::size_t n = lent_->allocated();
    for (const auto& [_, c] : contexts_) n += c->slots.size() * options_.slot_bytes;
    return n;
  }

  const Runtime& runtime() const noexcept { return *rt_; }

 private:
  struct slot {
    void* host = nullptr;
    typename Runtime::event done{};
  };
  /// Per GPU: ckpt's stream, its events and its pinned ring.
  struct gpu_context {
    std::shared_ptr<Runtime> rt;
    int device = 0;
    typename Runtime::stream stream{};
    typename Runtime::event before{}, after{};
    std::vector<slot> slots;
    // Events for copies left in flight (host_copy): taken on the thread that starts a copy,
    // given back on the one that waits for it.
    std::mutex idle_mu;
    std::vector<typename Runtime::event> idle_events;
    template <class Make>
    typename Runtime::event take_event(Make&& make) {
      {
        std::lock_guard lock(idle_mu);
        if (!idle_events.empty()) {
          auto e = idle_events.back();
          idle_events.pop_back();
          return e;
        }
      }
      return make();
    }
    /// Waits for everything queued on ckpt's stream, ignoring its errors (the first one is the
    /// one to report), so that no copy outlives the buffer it reads or writes.
    void drain() noexcept {
      try {
        rt->sync(stream);
      } catch (...) {
        rt->clear_error();
      }
    }
    void give_back(typename Runtime::event e) noexcept {
      std::lock_guard lock(idle_mu);
      try {
        idle_events.push_back(e);
      } catch (...) {
        rt->destroy(e);
      }
    }
    ~gpu_context() {
      detail::device_guard<Runtime> guard(*rt);
      try {
        rt->set_device(device);
        // Copies still queued (a call that failed part-way) must not outlive the pinned
        // buffers they read or write.
        if (stream) drain();
      } catch (...) {
        rt->clear_error();  // releasing what can be released is all that is left to do
      }
      for (auto& s : slots) {
        if (s.host) rt->host_free(s.host);
        rt->destroy(s.done);
      }
      for (auto e : idle_events) rt->destroy(e);
      rt->destroy(before);
      rt->destroy(after);
      rt->destroy(stream);
    }
  };

  gpu_context& context(int device, const tensor_ref& t) {
    call(t, 0, 0, "cudaSetDevice", [&] { rt_->set_device(device); });
    auto& c = contexts_[device];
    if (c) return *c;
    auto fresh = std::make_unique<gpu_context>();
    fresh->rt = rt_;
    fresh->device = device;
    // Each resource is created into the context at once, so a failure part-way frees what
    // was made (the context's destructor releases whatever is set).
    call(t, 0, 0, "cudaStreamCreateWithFlags", [&] { fresh->stream = rt_->make_stream(); });
    call(t, 0, 0, "cudaEventCreateWithFlags", [&] { fresh->before = rt_->make_event(); });
    call(t, 0, 0, "cudaEventCreateWithFlags", [&] { fresh->after = rt_->make_event(); });
    fresh->slots.resize(options_.slots);
    for (auto& s : fresh->slots) {
      call(t, 0, 0, "cudaEventCreateWithFlags", [&] { s.done = rt_->make_event(); });
      call(t, 0, 0, "cudaHostAlloc (" + std::to_string(options_.slot_bytes) + " bytes)",
           [&] { s.host = rt_->host_alloc(options_.slot_bytes); });
    }
    c = std::move(fresh);
    return *c;
  }

  /// A call that fails part-way must not leave copies queued that read your tensor or write
  /// the caller's buffer after it returned: ckpt's stream is drained before the error leaves.
  template <class F>
  void drained_on_failure(gpu_context& ctx, F&& body) {
    try {
      body();
    } catch (...) {
      ctx.drain();
      throw;
    }
  }

  /// ckpt's stream waits for what the user enqueued so far. An event must be recorded on a
  /// stream of its own device: for a user stream on another GPU than the tensor, the event is
  /// one made on that GPU, recorded there; ckpt's stream may wait for it from any device.
  void order_after_user(gpu_context& ctx, const tensor_ref& t) {
    const int on = user_device(t);
    if (on < 0 || on == ctx.device) {
      call(t, 0, 0, "cudaEventRecord (user stream)", [&] { rt_->record(ctx.before, user_); });
      call(t, 0, 0, "cudaStreamWaitEvent", [&] { rt_->wait(ctx.stream, ctx.before); });
      return;
    }
    const std::string where = " (user stream, on cuda:" + std::to_string(on) + ")";
    call(t, 0, 0, "cudaSetDevice" + where, [&] { rt_->set_device(on); });
    auto& ev = user_events_[on];
    if (!ev) {
      auto fresh = std::make_unique<owned_event>(rt_);
      call(t, 0, 0, "cudaEventCreateWithFlags" + where, [&] { fresh->e = rt_->make_event(); });
      ev = std::move(fresh);
    }
    call(t, 0, 0, "cudaEventRecord" + where, [&] { rt_->record(ev->e, user_); });
    call(t, 0, 0, "cudaSetDevice", [&] { rt_->set_device(ctx.device); });
    call(t, 0, 0, "cudaStreamWaitEvent", [&] { rt_->wait(ctx.stream, ev->e); });
  }

  /// The GPU `user_stream` belongs to, asked once; -1 for the default streams, which stand for
  /// each tensor's own GPU.
  int user_device(const tensor_ref& t) {
    if (!user_device_) call(t, 0, 0, "cudaStreamGetDevice (user stream)", [&] { user_device_ = rt_->stream_device(user_); });
    return *user_device_;
  }

  /// An event made on the user stream's GPU, released with the policy.
  struct owned_event {
    explicit owned_event(std::shared_ptr<Runtime> r) : rt(std::move(r)) {}
    ~owned_event() { rt->destroy(e); }
    owned_event(const owned_event&) = delete;
    owned_event& operator=(const owned_event&) = delete;
    std::shared_ptr<Runtime> rt;
    typename Runtime::event e{};
  };

  /// Runs one runtime call; its failure becomes a ckpt::error naming the call and the tensor.
  template <class F>
  void call(const tensor_ref& t, std::uint64_t at, std::uint64_t len, const std::string& what, F&& f) {
    try {
      f();
    } catch (const typename Runtime::failure& e) {
      rt_->clear_error();  // reported here, as a ckpt::error: not left for the caller's next check
      throw failed(what, e, t, at, len);
    }
  }

  /// The ckpt::error for a runtime call `what` that failed with `e`, naming the tensor and the
  /// byte range (if any).
  static error failed(const std::string& what, const std::exception& e, const tensor_ref& t, std::uint64_t at, std::uint64_t len) {
    return error(error_kind::io, "cuda::device_copy: " + what + " failed: " + e.what() + " (tensor " + describe(t) +
                                     (len ? ", bytes [" + std::to_string(at) + ", " + std::to_string(at + len) + ")" : "") + ")");
  }

  static std::string describe(const tensor_ref& t) {
    std::string s = std::string(to_string(t.type())) + "[";
    for (std::size_t i = 0; i < t.shape().size(); ++i) s += (i ? "," : "") + std::to_string(t.shape()[i]);
    s += "] on ";
    s += t.where().type == device::kind::cuda ? "cuda:" + std::to_string(t.where().id) : std::string("host");
    return s;
  }

  static void check(const tensor_ref& t, std::uint64_t offset, std::size_t n) {
    if (offset > t.nbytes() || n > t.nbytes() - offset)
      throw error(error_kind::invalid_argument, "cuda::device_copy: bytes [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                                    ") outside a tensor of " + std::to_string(t.nbytes()) + " bytes");
  }

  /// The pinned buffers lent to the pipelines: shared with every buffer out on loan, so one given
  /// back after the policy is gone is still freed.
  class lending {
   public:
    lending(std::shared_ptr<Runtime> rt, std::size_t limit) : rt_(std::move(rt)), limit_(limit) {}
    lending(const lending&) = delete;
    lending& operator=(const lending&) = delete;
    ~lending() {
      for (const auto& [_, b] : all_) rt_->host_free(b.first);
    }

    /// `self` is this object's owner: each buffer lent keeps it alive until given back.
    lent_buffer lend(std::size_t n, const std::shared_ptr<lending>& self) {
      constexpr std::size_t grain = std::size_t{64} << 10;  // sizes vary a little from save to save
      n = (n + grain - 1) / grain * grain;
      std::lock_guard lock(mu_);
      std::byte* p = nullptr;
      auto it = idle_.lower_bound(n);  // the smallest idle buffer that fits
      std::size_t idle_bytes = 0;
      for (const auto& [size, _] : idle_) idle_bytes += size;
      const bool room = n <= limit_ && total_ - idle_bytes + n <= limit_;
      // An idle buffer much bigger than asked is kept for a bigger request, if a fresh one fits.
      if (it != idle_.end() && (it->first <= 2 * n || !room)) {
        n = it->first;
        p = it->second;
        idle_.erase(it);
      } else {
        if (!room) return {};
        // Free idle buffers (smallest first) until the new one fits the bound.
        while (total_ + n > limit_) free_locked(idle_.begin());
        p = static_cast<std::byte*>(rt_->host_alloc(n));
        all_.emplace(reinterpret_cast<std::uintptr_t>(p), std::pair{p, n});
        total_ += n;
      }
      return lent_buffer(p, n, [owner = self](std::byte* q, std::size_t size) { owner->give_back(q, size); });
    }

    /// Whether [p, p + n) lies inside one lent buffer.
    bool holds(const std::byte* p, std::size_t n) const {
      const auto at = reinterpret_cast<std::uintptr_t>(p);
      std::lock_guard lock(mu_);
      auto it = all_.upper_bound(at);
      if (it == all_.begin()) return false;
      --it;
      return n <= it->second.second && at - it->first <= it->second.second - n;
    }

    std::size_t allocated() const {
      std::lock_guard lock(mu_);
      return total_;
    }

   private:
    void give_back(std::byte* p, std::size_t n) {
      std::lock_guard lock(mu_);
      idle_.emplace(n, p);
    }
    void free_locked(typename std::multimap<std::size_t, std::byte*>::iterator it) {
      rt_->host_free(it->second);
      all_.erase(reinterpret_cast<std::uintptr_t>(it->second));
      total_ -= it->first;
      idle_.erase(it);
    }

    std::shared_ptr<Runtime> rt_;
    std::size_t limit_;
    mutable std::mutex mu_;
    std::map<std::uintptr_t, std::pair<std::byte*, std::size_t>> all_;  // every pinned buffer, lent or idle, by address
    std::multimap<std::size_t, std::byte*> idle_;  // given back, by size
    std::size_t total_ = 0;
  };

  std::shared_ptr<Runtime> rt_;
  stream_type user_;
  device_copy_options options_;
  std::shared_ptr<lending> lent_;
  std::map<int, std::unique_ptr<gpu_context>> contexts_;
  std::map<int, std::unique_ptr<owned_event>> user_events_;  // by GPU, for a user stream on another GPU
  std::optional<int> user_device_;  // asked on first use
};

}  // namespace ckpt::cuda
