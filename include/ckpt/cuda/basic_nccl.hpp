#pragma once
/// @file cuda/basic_nccl.hpp
/// The NCCL Communicator and Transport, written against a `Runtime` (the CUDA runtime calls it
/// makes, as for basic_device_copy) and an `Api` (the NCCL calls), so that its staging,
/// ordering, watchdog and error handling are tested on machines without a GPU with fakes.
/// Programs use `ckpt::cuda::nccl` (`<ckpt/cuda/nccl.hpp>`), which is this on real CUDA and NCCL.
///
/// This header includes no CUDA or NCCL header.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../impl/checkpointer.ipp"  // its users make checkpointers other than impl/instances.hpp's
#include "../tensor.hpp"
#include "device_guard.hpp"

namespace ckpt::cuda {

/// Where an NCCL communicator stands, as `ncclCommGetAsyncError` reports it: `in_progress`
/// while a non-blocking initialisation or a connection to a peer is still being made (no NCCL
/// call may be made on it meanwhile), `failed` once it hit an error.
enum class nccl_status { ready, in_progress, failed };

/// How a `basic_nccl` communicator moves bytes, and how long it waits for its peers.
///
/// @code
/// ckpt::cuda::nccl comm{rank, size, gpu, id, stream, {.transfer_bytes = 4 << 20, .timeout = std::chrono::minutes{2}}};
/// @endcode
struct nccl_options {
  /// Size of the communicator's device scratch buffer and of its pinned host buffer (one of
  /// each per communicator, allocated once). Every transfer moves in pieces of at most this many
  /// bytes, so the two sides of a send and its receive make the same NCCL calls. **Every rank
  /// must use the same value** (the constructor checks it). At least 16 bytes, and 8 bytes per rank.
  std::size_t transfer_bytes{std::size_t{8} << 20};
  /// How long one call waits for its bytes, and the constructor for every rank to join
  /// (ncclCommInitRank), before it decides that a peer is gone, aborts the NCCL communicator
  /// and throws. Generous: a peer may be busy writing a checkpoint. A job with its own
  /// watchdog (a launcher's, or a test harness's) sets it below that watchdog's, so that the
  /// stall is reported by ckpt, naming the operation and the peer, rather than killed silently.
  std::chrono::milliseconds timeout{std::chrono::minutes{10}};
};

/// A `ckpt::Transport` (and so a `Communicator`) over NCCL: collectives for the checkpointer's
/// agreement and commit, and point-to-point transfers straight from and into GPU tensors, so
/// that `gather_to_root` streams every rank's shards to rank 0 over NVLink or InfiniBand.
///
/// Memory: one device scratch buffer and one pinned host buffer of `transfer_bytes` each.
/// Host bytes (the collectives' messages, host tensors) are staged through them piece by piece;
/// bytes of GPU tensors on the communicator's device go to and from NCCL directly.
///
/// Ordering with your work: before reading or writing a GPU tensor, ckpt's own stream waits for
/// what is already enqueued on `user_stream`; after writing one, `user_stream` waits for ckpt's
/// stream, so your next kernels see the bytes.
///
/// Every call blocks until its bytes have left or arrived. It waits by polling the stream and
/// NCCL's asynchronous error state; when NCCL reports an error, or nothing happens within
/// `nccl_options::timeout`, the NCCL communicator is aborted and the call throws a
/// `ckpt::error` (`error_kind::communication`) naming the operation, the peer and the bytes.
/// After that, and after any failed CUDA or NCCL call, every call on the communicator throws at
/// once: the ranks no longer agree on which transfer comes next, so make a new one on every rank.
///
/// Joining is bounded too: the constructor initialises the NCCL communicator without blocking
/// and waits at most `timeout` for every rank to join. Ranks that are threads of one process
/// (one GPU each) learn of each other's failures at once: a rank whose constructor fails, or
/// whose communicator is aborted, aborts its peers' in this process at their next wait, and a
/// thread that fails before it could construct its communicator calls `give_up(id, rank, why)`
/// so its peers stop waiting for it. Ranks in other processes see NCCL's error or the timeout.
///
/// Copies share one NCCL communicator (the checkpointer holds its policy by value); calls are
/// serialised by a mutex, so it may be used from the checkpointer's background thread
/// (`save_async`). As with every Communicator, all ranks make the same calls in the same order.
///
/// The CUDA contract a host engine relies on: each call makes the communicator's GPU current
/// while it works and puts the calling thread's current device back before it returns, and
/// leaves nothing in the thread's last-error slot. `user_stream` may belong to another GPU
/// than the communicator's: the ordering events are then recorded on that GPU.
///
/// @code
/// // rank 0 makes the id; any bootstrap can carry its bytes (nccl_over_mpi uses MPI_Bcast)
/// ckpt::cuda::nccl comm{rank, size, /*device*/ local_rank,
///                       [&](std::span<std::byte> id) { my_broadcast_from_rank0(id); }, my_stream};
/// ckpt::checkpointer<ckpt::gather_to_root<ckpt::cuda::nccl>, ckpt::posix, ckpt::raw, ckpt::cuda::device_copy> cp{
///     {.comm = comm}, "/ckpt/run1", {}, {}, ckpt::cuda::device_copy{{}, my_stream}};
/// @endcode
template <class Runtime, class Api>
class basic_nccl {
  static_assert(std::is_same_v<typename Runtime::stream, typename Api::stream>,
                "ckpt: basic_nccl's Runtime and Api must use the same stream type");

 public:
  using runtime_type = Runtime;  ///< the CUDA runtime calls (ckpt::cuda::runtime, or a fake)
  using api_type = Api;          ///< the NCCL calls (ckpt::cuda::nccl_api, or a fake)
  using stream_type = typename Runtime::stream;  ///< cudaStream_t on the real runtime
  /// Names one NCCL communicator: made once on rank 0, the same bytes passed to every rank.
  using unique_id = typename Api::unique_id;
  /// Carries rank 0's unique id to every rank: called on every rank with the id's bytes (made
  /// on rank 0, zero elsewhere); on return every rank's bytes must be rank 0's.
  using share_function = std::function<void(std::span<std::byte>)>;

  /// An unbound communicator: every call throws until one made with a unique id is assigned.
  basic_nccl() = default;

  /// Tells the ranks of communicator `id` in this process that rank `rank` will never join or
  /// make another call (it failed before it could construct its communicator, say): their
  /// constructors and calls then abort and throw at once, naming the rank and `why`, instead
  /// of waiting out the timeout. Ranks in other processes are not reached; they time out.
  ///
  /// @code
  /// try { /* set up this rank's GPU, then */ ckpt::cuda::nccl comm{rank, size, gpu, id, stream}; /* ... */ }
  /// catch (const std::exception& e) { ckpt::cuda::nccl::give_up(id, rank, e.what()); throw; }
  /// @endcode
  static void give_up(const unique_id& id, int rank, const std::string& why) {
    fail_world(*world_of(id), rank, why);
  }

  /// Joins the NCCL communicator `id` names as rank `rank` of `size`, on GPU `device`.
  /// Collective: every rank constructs its own at the same time, with the same id and options.
  basic_nccl(int rank, int size, int device, const unique_id& id, stream_type user_stream = {}, nccl_options options = {},
             Runtime rt = {}, Api api = {}) {
    connect(rank, size, device, id, user_stream, options, std::move(rt), std::move(api));
  }

  /// Same, with the unique id made on rank 0 and carried to the others by `share` (an
  /// MPI_Bcast, a store). If making the id fails on rank 0, rank 0 throws before calling
  /// `share`, so the others wait in their `share` until your bootstrap gives up.
  basic_nccl(int rank, int size, int device, const share_function& share, stream_type user_stream = {}, nccl_options options = {},
             Runtime rt = {}, Api api = {}) {
    check_world(rank, size, options);
    unique_id id{};
    if (rank == 0) {
      try {
        id = api.make_unique_id();
      } catch (const typename Api::failure& e) {
        throw error(error_kind::communication, std::string("cuda::nccl: ncclGetUniqueId failed: ") + e.what() + " (rank 0)");
      }
    }
    share(std::span<std::byte>(id.bytes.data(), id.bytes.size()));
    connect(rank, size, device, id, user_stream, options, std::move(rt), std::move(api));
  }

  /// This rank, from 0.
  int rank() const { return use().rank; }
  /// Number of ranks.
  int size() const { return use().size; }
  /// The GPU the NCCL communicator is bound to.
  int gpu() const { return use().device; }

  /// Which tensors `send_tensor`/`recv_tensor` take directly: host memory (staged through the
  /// pinned buffer) and this communicator's GPU. The checkpointer stages others (another GPU's)
  /// through its DevicePolicy.
  bool moves(const tensor_ref& t) const {
    const auto d = t.where();
    return d.type == device::kind::host || (d.type == device::kind::cuda && d.id == use().device);
  }
  /// Calls are serialised, so the checkpointer may use it from its background thread.
  bool thread_safe() const noexcept { return true; }

  /// Returns once every rank has called it.
  void barrier() {
    auto& s = use();
    session in(s);
    op o{"barrier"};
    std::uint64_t v[1] = {0};
    reduce_max(s, o, v);
  }

  /// The largest of every rank's `x`.
  std::uint64_t all_reduce_max(std::uint64_t x) {
    auto& s = use();
    session in(s);
    op o{"all_reduce_max"};
    std::uint64_t v[1] = {x};
    reduce_max(s, o, v);
    return v[0];
  }

  /// Root's `bytes` on every rank (resized on the others): the size first, then the bytes in
  /// pieces of `transfer_bytes`.
  void broadcast(std::vector<std::byte>& bytes, int root) {
    auto& s = use();
    session in(s);
    check_peer(s, root, "broadcast", true);
    op o{"broadcast", root, true};
    std::uint64_t n = s.rank == root ? bytes.size() : 0;
    broadcast_staged(s, o, reinterpret_cast<std::byte*>(&n), sizeof n, root);
    if (s.rank != root) bytes.resize(static_cast<std::size_t>(n));
    o.total = n;
    for (std::size_t at = 0; at < bytes.size(); at += s.options.transfer_bytes) {
      o.at = at;
      o.len = std::min(s.options.transfer_bytes, bytes.size() - at);
      broadcast_staged(s, o, bytes.data() + at, o.len, root);
    }
  }

  /// Every rank's bytes, in rank order, on every rank. Sizes may differ. Moves in rounds: in
  /// each, every rank contributes the next `transfer_bytes / size` bytes of its own (padded), so
  /// the scratch buffer is never exceeded.
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine) {
    auto& s = use();
    session in(s);
    op o{"all_gather"};
    const auto sizes = gather_sizes(s, o, mine.size());
    std::vector<std::vector<std::byte>> all(sizes.size());
    std::uint64_t longest = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      all[r].resize(static_cast<std::size_t>(sizes[r]));
      longest = std::max(longest, sizes[r]);
    }
    const std::size_t per = s.options.transfer_bytes / static_cast<std::size_t>(s.size);
    for (std::size_t at = 0; at < longest; at += per) {
      o.at = at;
      o.len = per;
      // This rank's next piece: what is left of its bytes, up to `per` (possibly nothing).
      const std::size_t from = std::min(at, mine.size());
      const std::byte* got = gather_round(s, o, mine.subspan(from, std::min(per, mine.size() - from)), per);
      for (std::size_t r = 0; r < all.size(); ++r)
        if (at < all[r].size()) std::memcpy(all[r].data() + at, got + r * per, std::min(per, all[r].size() - at));
    }
    return all;
  }

  /// Every rank's bytes, in rank order, on `root` (its own included); an empty vector on the
  /// others. The sizes go round first; then each rank sends its bytes to the root, point to
  /// point, and the root receives them rank after rank.
  std::vector<std::vector<std::byte>> gather(std::span<const std::byte> mine, int root) {
    auto& s = use();
    session in(s);
    check_peer(s, root, "gather", true);
    op o{"gather", root, true};
    const auto sizes = gather_sizes(s, o, mine.size());
    if (s.rank != root) {
      op to{"gather", root};
      to.total = mine.size();
      send_staged(s, to, mine.data(), mine.size(), root);
      return {};
    }
    std::vector<std::vector<std::byte>> all(sizes.size());
    for (int r = 0; r < s.size; ++r) {
      auto& into = all[static_cast<std::size_t>(r)];
      if (r == root) {
        into.assign(mine.begin(), mine.end());
        continue;
      }
      into.resize(static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)]));
      op from{"gather", r};
      from.total = into.size();
      recv_staged(s, from, into.data(), into.size(), r);
    }
    return all;
  }

  /// Sends bytes [offset, offset + bytes) of `t` to `peer`. A GPU tensor (on the
  /// communicator's device) is sent straight from its memory, after the kernels already on the
  /// user's stream; a host tensor is staged through pinned memory. Returns once the bytes have
  /// left.
  void send_tensor(const tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, int peer) {
    transfer_tensor(t, offset, bytes, peer, false);
  }

  /// Receives `bytes` bytes from `peer` into `t` at byte `offset`. Into a GPU tensor straight
  /// (after the user's stream's pending work, and the user's stream then waits for the bytes);
  /// into a host tensor through pinned memory. Returns once the bytes have landed.
  void recv_tensor(const tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, int peer) {
    transfer_tensor(t, offset, bytes, peer, true);
  }

  /// Sends host bytes to `peer`, through pinned memory; returns once they have left.
  void send_host(std::span<const std::byte> bytes, int peer) {
    auto& s = use();
    session in(s);
    check_peer(s, peer, "send_host", false);
    op o{"send_host", peer};
    o.total = bytes.size();
    send_staged(s, o, bytes.data(), bytes.size(), peer);
  }

  /// Receives `bytes.size()` bytes from `peer` into host memory; returns once they are there.
  void recv_host(std::span<std::byte> bytes, int peer) {
    auto& s = use();
    session in(s);
    check_peer(s, peer, "recv_host", false);
    op o{"recv_host", peer};
    o.total = bytes.size();
    recv_staged(s, o, bytes.data(), bytes.size(), peer);
  }

  /// The options the communicator was made with.
  const nccl_options& options() const { return use().options; }
  /// The runtime object it calls (tests inspect a fake through it).
  const Runtime& runtime() const { return use().rt; }
  /// The NCCL API object it calls (tests inspect a fake through it).
  const Api& api() const { return use().api; }

 private:
  /// What one call is doing, for messages: "send_tensor, peer 2, bytes [a, b), tensor ...".
  struct op {
    const char* name = "";
    int peer = -1;
    bool root = false;  // `peer` is the root of a collective
    std::uint64_t base = 0, at = 0, len = 0, total = 0;
    const tensor_ref* t = nullptr;
  };

  /// The ranks of one NCCL communicator (one unique id) that are threads of this process, and
  /// whether one of them failed: the others abort at their next wait instead of hanging.
  struct world {
    std::atomic<bool> failed{false};
    std::mutex mu;
    std::string why;  // the first failure: "rank R: ..."
  };

  /// The world of `id` in this process, made on first use.
  static std::shared_ptr<world> world_of(const unique_id& id) {
    static std::mutex mu;
    static std::map<decltype(unique_id{}.bytes), std::shared_ptr<world>> all;
    std::lock_guard lock(mu);
    // Worlds no communicator holds any more are forgotten; failed ones are kept (they are
    // small and rare), so a rank that joins after a peer gave up still learns of it.
    for (auto it = all.begin(); it != all.end();)
      it = it->second.use_count() == 1 && !it->second->failed ? all.erase(it) : std::next(it);
    auto& w = all[id.bytes];
    if (!w) w = std::make_shared<world>();
    return w;
  }

  static void fail_world(world& w, int rank, const std::string& why) {
    std::lock_guard lock(w.mu);
    if (w.failed) return;
    w.why = "rank " + std::to_string(rank) + ": " + why;
    w.failed = true;
  }

  struct state {
    state(Runtime r, Api a) : rt(std::move(r)), api(std::move(a)) {}
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      detail::device_guard<Runtime> guard(rt);
      try {
        rt.set_device(device);
        // Operations still queued (a call that failed part-way) must not outlive the buffers
        // they read or write. After an abort NCCL's kernels return, so this does not hang.
        if (stream) rt.sync(stream);
      } catch (...) {
        rt.clear_error();  // releasing what can be released is all that is left to do
      }
      rt.device_free(scratch);
      rt.host_free(pinned);
      rt.destroy(before);
      rt.destroy(after);
      rt.destroy(user_before);
      rt.destroy(stream);
      // An aborted communicator is already gone.
      if (has_comm && !aborted) api.destroy(comm);
    }

    Runtime rt;
    Api api;
    int rank = 0, size = 1, device = 0;
    int user_device = -1;  // the user stream's GPU, when it is not `device`; -1 otherwise
    nccl_options options;
    stream_type user{}, stream{};
    typename Runtime::event before{}, after{};
    typename Runtime::event user_before{};  // made on user_device, when there is one
    std::shared_ptr<world> peers;           // this communicator's ranks in this process
    typename Api::comm comm{};
    bool has_comm = false, aborted = false;
    std::byte* scratch = nullptr;  // device
    std::byte* pinned = nullptr;   // host
    std::string broken;            // why the communicator was aborted; empty while it is sound
    std::mutex mu;
  };

  /// send_tensor and recv_tensor: the tensor's bytes in pieces of transfer_bytes, straight from
  /// or into GPU memory (ordered with the user's stream both ways), or through pinned memory for
  /// a host tensor.
  void transfer_tensor(const tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, int peer, bool receive) {
    const char* name = receive ? "recv_tensor" : "send_tensor";
    auto& s = use();
    session in(s);
    check_peer(s, peer, name, false);
    check_tensor(s, t, offset, bytes, name, receive);
    op o{name, peer};
    o.t = &t;
    o.base = offset;
    o.total = bytes;
    if (bytes == 0) return;
    if (t.where().type == device::kind::host) {
      if (receive)
        recv_staged(s, o, t.data() + offset, static_cast<std::size_t>(bytes), peer);
      else
        send_staged(s, o, t.data() + offset, static_cast<std::size_t>(bytes), peer);
      return;
    }
    order_after_user(s, o);
    for (std::uint64_t at = 0; at < bytes; at += s.options.transfer_bytes) {
      o.at = at;
      o.len = std::min<std::uint64_t>(s.options.transfer_bytes, bytes - at);
      std::byte* piece = t.data() + offset + at;
      const auto n = static_cast<std::size_t>(o.len);
      if (receive)
        enqueue(s, o, "ncclRecv", [&] { s.api.recv(piece, n, peer, s.comm, s.stream); });
      else
        enqueue(s, o, "ncclSend", [&] { s.api.send(piece, n, peer, s.comm, s.stream); });
    }
    o.at = 0;
    o.len = bytes;
    watch(s, o);
    if (!receive) return;
    // The bytes are there already; the event makes the order explicit for a user stream that
    // does not synchronise with the host (the same as device_copy's from_host).
    call(s, o, "cudaEventRecord", [&] { s.rt.record(s.after, s.stream); });
    call(s, o, "cudaStreamWaitEvent (user stream)", [&] { s.rt.wait(s.user, s.after); });
  }

  // ----- setup --------------------------------------------------------------------------------

  static void check_world(int rank, int size, const nccl_options& options) {
    if (size < 1 || rank < 0 || rank >= size)
      throw error(error_kind::invalid_argument,
                  "cuda::nccl: rank " + std::to_string(rank) + " is not in a world of " + std::to_string(size) + " ranks");
    // One all-gather round carries every rank's 8-byte size, and the constructor's agreement
    // reduces two 8-byte words.
    const std::size_t least = std::max<std::size_t>(16, 8 * static_cast<std::size_t>(size));
    if (options.transfer_bytes < least)
      throw error(error_kind::invalid_argument, "cuda::nccl: nccl_options::transfer_bytes (" + std::to_string(options.transfer_bytes) +
                                                    ") must be at least 16 bytes and 8 bytes per rank (" + std::to_string(least) +
                                                    " for " + std::to_string(size) + " ranks)");
    if (options.timeout.count() <= 0)
      throw error(error_kind::invalid_argument, "cuda::nccl: nccl_options::timeout must be positive");
  }

  void connect(int rank, int size, int device, const unique_id& id, stream_type user_stream, nccl_options options, Runtime rt,
               Api api) {
    auto peers = world_of(id);
    try {
      check_world(rank, size, options);
    } catch (const error& e) {
      fail_world(*peers, rank, e.what());
      throw;
    }
    // Each resource goes into the state as soon as it exists, so a failure part-way releases
    // what was made (the state's destructor frees whatever is set).
    auto fresh = std::make_shared<state>(std::move(rt), std::move(api));
    auto& s = *fresh;
    s.rank = rank;
    s.size = size;
    s.device = device;
    s.options = options;
    s.user = user_stream;
    s.peers = std::move(peers);
    detail::device_guard<Runtime> guard(s.rt);
    try {
      join(s, id);
    } catch (const error& e) {
      // This rank will make no call: its peers in this process must not wait for it.
      fail_world(*s.peers, rank, e.what());
      throw;
    }
    s_ = std::move(fresh);
  }

  /// The constructor's work: resources, then the NCCL communicator, joined without blocking
  /// and waited for with the timeout, then the check that every rank has the same options.
  static void join(state& s, const unique_id& id) {
    const int rank = s.rank, size = s.size, device = s.device;
    const auto& options = s.options;
    op o{"constructor"};
    const auto tb = std::to_string(options.transfer_bytes);
    call(s, o, "cudaSetDevice", [&] { s.rt.set_device(device); });
    call(s, o, "cudaStreamGetDevice (user stream)", [&] {
      const int on = s.rt.stream_device(s.user);
      s.user_device = on == device ? -1 : on;
    });
    call(s, o, "cudaStreamCreateWithFlags", [&] { s.stream = s.rt.make_stream(); });
    call(s, o, "cudaEventCreateWithFlags", [&] { s.before = s.rt.make_event(); });
    call(s, o, "cudaEventCreateWithFlags", [&] { s.after = s.rt.make_event(); });
    if (s.user_device >= 0) {
      // An event is recorded on a stream of its own GPU: the one for the user's stream is made there.
      const std::string where = " (user stream, on cuda:" + std::to_string(s.user_device) + ")";
      call(s, o, "cudaSetDevice" + where, [&] { s.rt.set_device(s.user_device); });
      call(s, o, "cudaEventCreateWithFlags" + where, [&] { s.user_before = s.rt.make_event(); });
      call(s, o, "cudaSetDevice", [&] { s.rt.set_device(device); });
    }
    call(s, o, "cudaMalloc (" + tb + " bytes)",
         [&] { s.scratch = static_cast<std::byte*>(s.rt.device_alloc(options.transfer_bytes)); });
    call(s, o, "cudaHostAlloc (" + tb + " bytes)", [&] { s.pinned = static_cast<std::byte*>(s.rt.host_alloc(options.transfer_bytes)); });
    const std::string init = "ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(size) + ", cuda:" + std::to_string(device) + ")";
    call(s, o, init, [&] { s.comm = s.api.init_rank(size, id, rank); });
    s.has_comm = true;
    // Non-blocking: the communicator exists at once and is ready when every rank has joined.
    o.name = "constructor (ncclCommInitRank: waiting for every rank to join)";
    settle(s, o);
    // Pieces must split the same on both sides of every transfer: all ranks need the same
    // transfer_bytes. The max of x and of ~x give the largest and the smallest in one call.
    std::uint64_t v[2] = {options.transfer_bytes, ~std::uint64_t{options.transfer_bytes}};
    o.name = "constructor (checking that every rank has the same transfer_bytes)";
    reduce_max(s, o, v);
    const std::uint64_t largest = v[0], smallest = ~v[1];
    if (largest != smallest)
      throw error(error_kind::invalid_argument,
                  "cuda::nccl: the ranks disagree on nccl_options::transfer_bytes (this rank, " + std::to_string(rank) + ": " + tb +
                      "; smallest: " + std::to_string(smallest) + "; largest: " + std::to_string(largest) +
                      "): every rank must use the same value, since a send and its receive must split into the same pieces");
  }

  state& use() const {
    if (!s_)
      throw error(error_kind::invalid_argument,
                  "cuda::nccl: not initialised (a default-constructed communicator): construct it with rank, size, device "
                  "and a unique id (or a bootstrap function), or with ckpt::cuda::nccl_over_mpi");
    return *s_;
  }

  /// One public call: holds the communicator's lock, refuses a broken communicator, and makes
  /// its GPU current on the calling thread for the call's length. Calls come from whichever
  /// thread saves (save_async's background thread among them), and a thread with no current
  /// device would otherwise create a context on GPU 0; the caller's own device is put back.
  class session {
   public:
    explicit session(state& s) : lock_(s.mu), guard_(s.rt) {
      if (!s.broken.empty())
        throw error(error_kind::communication, "cuda::nccl: the communicator was aborted after " + s.broken +
                                                   "; every rank must make a new one");
      call(s, op{"set device"}, "cudaSetDevice", [&] { s.rt.set_device(s.device); });
    }

   private:
    std::lock_guard<std::mutex> lock_;
    detail::device_guard<Runtime> guard_;
  };

  static void check_peer(const state& s, int peer, const char* what, bool root) {
    if (peer < 0 || peer >= s.size || (!root && peer == s.rank))
      throw error(error_kind::invalid_argument, std::string("cuda::nccl: ") + what + ": rank " + std::to_string(s.rank) +
                                                    (root ? " cannot use root " : " cannot exchange bytes with rank ") +
                                                    std::to_string(peer) + " in a world of " + std::to_string(s.size));
  }

  static void check_tensor(const state& s, const tensor_ref& t, std::uint64_t offset, std::uint64_t n, const char* what,
                           bool into) {
    if (offset > t.nbytes() || n > t.nbytes() - offset)
      throw error(error_kind::invalid_argument, std::string("cuda::nccl: ") + what + ": bytes [" + std::to_string(offset) + ", +" +
                                                    std::to_string(n) + ") are outside tensor " + describe(t) + " of " +
                                                    std::to_string(t.nbytes()) + " bytes");
    if (into && !t.writable())
      throw error(error_kind::invalid_argument,
                  std::string("cuda::nccl: ") + what + ": cannot receive into read-only tensor " + describe(t));
    if (t.where().type == device::kind::cuda && t.where().id != s.device)
      throw error(error_kind::invalid_argument,
                  std::string("cuda::nccl: ") + what + ": tensor " + describe(t) + " is not on cuda:" + std::to_string(s.device) +
                      ", the GPU this NCCL communicator is bound to (an NCCL communicator moves bytes of one GPU only)");
  }

  // ----- messages and failures ----------------------------------------------------------------

  static std::string describe(const tensor_ref& t) {
    std::string d = std::string(to_string(t.type())) + "[";
    for (std::size_t i = 0; i < t.shape().size(); ++i) d += (i ? "," : "") + std::to_string(t.shape()[i]);
    d += "] on ";
    d += t.where().type == device::kind::cuda ? "cuda:" + std::to_string(t.where().id) : std::string("host");
    return d;
  }

  static std::string describe(const op& o) {
    std::string d = o.name;
    if (o.peer >= 0) d += (o.root ? ", root " : ", peer ") + std::to_string(o.peer);
    if (o.len) d += ", bytes [" + std::to_string(o.base + o.at) + ", " + std::to_string(o.base + o.at + o.len) + ")";
    if (o.total) d += " of " + std::to_string(o.total);
    if (o.t) d += ", tensor " + describe(*o.t);
    return d;
  }

  /// Aborts the NCCL communicator (its pending operations end) and remembers why: the ranks no
  /// longer agree on which transfer comes next, so nothing later could be trusted.
  static error break_with(state& s, error_kind kind, const std::string& message, const std::string& why) {
    if (s.has_comm && !s.aborted) {
      s.api.abort(s.comm);
      s.aborted = true;
    }
    if (s.broken.empty()) s.broken = why;
    // The peers in this process would wait for this rank's next call: they abort too.
    if (s.peers) fail_world(*s.peers, s.rank, why);
    return error(kind, message + (s.has_comm ? "; the NCCL communicator was aborted" : ""));
  }

  /// Runs one CUDA or NCCL call; its failure becomes a ckpt::error naming the call, the
  /// library's error string and what the call was part of.
  template <class F>
  static decltype(auto) call(state& s, const op& o, std::string_view name, F&& f) {
    try {
      return f();
    } catch (const typename Runtime::failure& e) {
      s.rt.clear_error();  // reported here, as a ckpt::error: not left for the caller's next check
      const std::string m = std::string(name) + " failed: " + e.what() + " (" + describe(o) + ")";
      throw break_with(s, error_kind::io, "cuda::nccl: " + m, m);
    } catch (const typename Api::failure& e) {
      const std::string m = std::string(name) + " failed: " + e.what() + " (" + describe(o) + ")";
      throw break_with(s, error_kind::communication, "cuda::nccl: " + m, m);
    }
  }

  static std::string duration(std::chrono::milliseconds d) {
    if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
    return std::to_string(d.count()) + " ms";
  }

  /// Waits for ckpt's stream. Never blocks in the runtime: a peer that died (or never makes the
  /// matching call) would leave cudaStreamSynchronize waiting forever, so the stream and NCCL's
  /// error state are polled, and the wait gives up after `timeout`.
  static void watch(state& s, const op& o) {
    wait_until(s, o, [&] {
      if (status(s, o) == nccl_status::in_progress) return false;
      if (call(s, o, "cudaStreamQuery", [&] { return s.rt.query(s.stream); })) return true;
      s.rt.clear_error();  // the runtime records "not ready" in the thread's last-error slot
      return false;
    });
  }

  /// After an NCCL call: a non-blocking communicator may still be joining, or connecting to a
  /// peer, and takes no other call until it is ready.
  static void settle(state& s, const op& o) {
    wait_until(s, o, [&] { return status(s, o) == nccl_status::ready; });
  }

  /// One NCCL operation enqueued on ckpt's stream, and the communicator ready for the next call.
  template <class F>
  static void enqueue(state& s, const op& o, std::string_view name, F&& f) {
    call(s, o, name, std::forward<F>(f));
    settle(s, o);
  }

  /// NCCL's word on the communicator; an error aborts it and throws.
  static nccl_status status(state& s, const op& o) {
    std::string what;
    const auto st = call(s, o, "ncclCommGetAsyncError", [&] { return s.api.status(s.comm, what); });
    if (st == nccl_status::failed) {
      const std::string m = std::string(o.name) + " failed: NCCL reported " + what + " (" + describe(o) + ")";
      throw break_with(s, error_kind::communication, "cuda::nccl: " + m, m);
    }
    return st;
  }

  /// Polls `done` until it says so. Never blocks in the runtime or in NCCL: a peer that died
  /// (or never makes the matching call) would leave a blocking wait waiting forever. Gives up,
  /// aborting the communicator, when a rank of this process failed or after the timeout.
  template <class Done>
  static void wait_until(state& s, const op& o, Done done) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    auto pause = std::chrono::microseconds{100};
    // A peer's failure ends a wait only once it has lasted a little: a call whose bytes have
    // arrived may still be copying them out, and must not be aborted for a failure after it.
    const auto grace = std::min<std::chrono::milliseconds>(std::chrono::milliseconds{100}, s.options.timeout);
    for (;;) {
      // What has finished has finished: a peer's failure is met at the next wait.
      if (done()) return;
      if (s.peers && s.peers->failed && clock::now() - start > grace) {
        std::string why;
        {
          std::lock_guard lock(s.peers->mu);
          why = s.peers->why;
        }
        const std::string m = std::string(o.name) + " failed: " + why + " (" + describe(o) + ")";
        const std::string mine = "a peer in this process failed (" + why + ")";
        throw break_with(s, error_kind::communication, "cuda::nccl: " + m, mine);
      }
      if (clock::now() - start > s.options.timeout) {
        const std::string who = o.peer >= 0 && !o.root ? "is rank " + std::to_string(o.peer) + " still running and making the matching call?"
                                                       : "is every rank still running and making the same calls?";
        const std::string m = std::string(o.name) + " failed: no answer within " + duration(s.options.timeout) + ": " + who + " (" +
                              describe(o) + ")";
        throw break_with(s, error_kind::communication, "cuda::nccl: " + m, m);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds{1});
    }
  }

  /// ckpt's stream waits for what the user enqueued so far.
  static void order_after_user(state& s, const op& o) {
    if (s.user_device < 0) {
      call(s, o, "cudaEventRecord (user stream)", [&] { s.rt.record(s.before, s.user); });
      call(s, o, "cudaStreamWaitEvent", [&] { s.rt.wait(s.stream, s.before); });
      return;
    }
    const std::string where = " (user stream, on cuda:" + std::to_string(s.user_device) + ")";
    call(s, o, "cudaSetDevice" + where, [&] { s.rt.set_device(s.user_device); });
    call(s, o, "cudaEventRecord" + where, [&] { s.rt.record(s.user_before, s.user); });
    call(s, o, "cudaSetDevice", [&] { s.rt.set_device(s.device); });
    call(s, o, "cudaStreamWaitEvent", [&] { s.rt.wait(s.stream, s.user_before); });
  }

  // ----- staged transfers ---------------------------------------------------------------------

  static void send_staged(state& s, op& o, const std::byte* src, std::size_t n, int peer) {
    for (std::size_t at = 0; at < n; at += s.options.transfer_bytes) {
      const std::size_t len = std::min(s.options.transfer_bytes, n - at);
      o.at = at;
      o.len = len;
      std::memcpy(s.pinned, src + at, len);
      call(s, o, "cudaMemcpyAsync (host to device)", [&] { s.rt.copy_async(s.scratch, s.pinned, len, s.stream); });
      enqueue(s, o, "ncclSend", [&] { s.api.send(s.scratch, len, peer, s.comm, s.stream); });
      // The pinned buffer and the scratch are refilled for the next piece: this one must be gone.
      watch(s, o);
    }
  }

  static void recv_staged(state& s, op& o, std::byte* dst, std::size_t n, int peer) {
    for (std::size_t at = 0; at < n; at += s.options.transfer_bytes) {
      const std::size_t len = std::min(s.options.transfer_bytes, n - at);
      o.at = at;
      o.len = len;
      enqueue(s, o, "ncclRecv", [&] { s.api.recv(s.scratch, len, peer, s.comm, s.stream); });
      call(s, o, "cudaMemcpyAsync (device to host)", [&] { s.rt.copy_async(s.pinned, s.scratch, len, s.stream); });
      watch(s, o);
      std::memcpy(dst + at, s.pinned, len);
    }
  }

  /// `n` bytes (at most transfer_bytes) of root's `data` into every rank's `data`.
  static void broadcast_staged(state& s, const op& o, std::byte* data, std::size_t n, int root) {
    const bool me = s.rank == root;
    if (me) {
      std::memcpy(s.pinned, data, n);
      call(s, o, "cudaMemcpyAsync (host to device)", [&] { s.rt.copy_async(s.scratch, s.pinned, n, s.stream); });
    }
    enqueue(s, o, "ncclBroadcast", [&] { s.api.broadcast(s.scratch, s.scratch, n, root, s.comm, s.stream); });
    if (!me) call(s, o, "cudaMemcpyAsync (device to host)", [&] { s.rt.copy_async(s.pinned, s.scratch, n, s.stream); });
    watch(s, o);
    if (!me) std::memcpy(data, s.pinned, n);
  }

  /// Element-wise max over all ranks of a few u64, in place.
  static void reduce_max(state& s, const op& o, std::span<std::uint64_t> v) {
    const std::size_t n = v.size_bytes();
    std::memcpy(s.pinned, v.data(), n);
    auto* dev = reinterpret_cast<std::uint64_t*>(s.scratch);
    call(s, o, "cudaMemcpyAsync (host to device)", [&] { s.rt.copy_async(s.scratch, s.pinned, n, s.stream); });
    enqueue(s, o, "ncclAllReduce", [&] { s.api.all_reduce_max_u64(dev, dev, v.size(), s.comm, s.stream); });
    call(s, o, "cudaMemcpyAsync (device to host)", [&] { s.rt.copy_async(s.pinned, s.scratch, n, s.stream); });
    watch(s, o);
    std::memcpy(v.data(), s.pinned, n);
  }

  /// One all-gather round: `piece` (at most `per` bytes, zero-padded to `per`) from every rank;
  /// returns the pinned buffer, holding rank r's piece at r * per.
  static const std::byte* gather_round(state& s, const op& o, std::span<const std::byte> piece, std::size_t per) {
    const std::size_t all = per * static_cast<std::size_t>(s.size);
    std::byte* mine = s.scratch + static_cast<std::size_t>(s.rank) * per;  // in place, as NCCL allows
    std::memset(s.pinned, 0, per);
    if (!piece.empty()) std::memcpy(s.pinned, piece.data(), piece.size());
    call(s, o, "cudaMemcpyAsync (host to device)", [&] { s.rt.copy_async(mine, s.pinned, per, s.stream); });
    enqueue(s, o, "ncclAllGather", [&] { s.api.all_gather(mine, s.scratch, per, s.comm, s.stream); });
    call(s, o, "cudaMemcpyAsync (device to host)", [&] { s.rt.copy_async(s.pinned, s.scratch, all, s.stream); });
    watch(s, o);
    return s.pinned;
  }

  /// Every rank's byte count, on every rank.
  static std::vector<std::uint64_t> gather_sizes(state& s, const op& o, std::uint64_t mine) {
    std::byte b[sizeof mine];
    std::memcpy(b, &mine, sizeof mine);
    const std::byte* got = gather_round(s, o, b, sizeof mine);
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(s.size));
    std::memcpy(sizes.data(), got, sizes.size() * sizeof mine);
    return sizes;
  }

  std::shared_ptr<state> s_;
};

}  // namespace ckpt::cuda
