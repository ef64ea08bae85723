#pragma once
/// @file concepts.hpp
/// The six concepts through which a user composes ckpt: what the state is (`Checkpointable`),
/// who writes what (`ShardPolicy`, over a `Communicator`), how bytes reach the host
/// (`DevicePolicy`), how they are encoded (`Codec`) and where they go (`Storage`).
///
/// Every concept here has a `diagnose_*` companion used in `static_assert`s: when a type does
/// not satisfy a concept, the requirements are re-checked one by one and the first one missing
/// fires an assertion whose message says what to add, in code.

#include <concepts>
#include <utility>
#include <variant>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dtype.hpp"
#include "lent_buffer.hpp"
#include "tensor.hpp"
#include "topology.hpp"
#include "visitor.hpp"

namespace ckpt {

namespace detail {
template <class...>
inline constexpr bool always_false = false;

template <class T>
concept has_checkpoint_traits = !requires { checkpoint_traits<T>::ckpt_primary_template; };
template <class T>
concept traits_checkpointable = has_checkpoint_traits<T> && requires(visitor& v, T& x) {
  checkpoint_traits<T>::checkpoint(v, x);
};
template <class T>
concept member_checkpointable = requires(visitor& v, T& x) { access::checkpoint(x, v); };
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Checkpointable
// ---------------------------------------------------------------------------------------------

/// A type ckpt can save and load. The priority order, fixed and never ambiguous:
///  1. a `ckpt::checkpoint_traits<T>` specialisation with `static void checkpoint(visitor&, T&)`;
///  2. a member `template <class V> void checkpoint(V& v)` (private is fine with
///     `friend class ckpt::access`).
///
/// @code
/// struct mlp {
///   std::vector<float> w1, w2;
///   template <class V> void checkpoint(V& v) { v.tensor("w1", w1); v.tensor("w2", w2); }
/// };
/// static_assert(ckpt::Checkpointable<mlp>);
/// @endcode
template <class T>
concept Checkpointable = detail::traits_checkpointable<T> || detail::member_checkpointable<T>;

namespace detail {
template <class T>
constexpr bool diagnose_checkpointable() {
  if constexpr (has_checkpoint_traits<T>) {
    static_assert(traits_checkpointable<T>,
                  "ckpt: checkpoint_traits<T> is specialised for this type but has no "
                  "`static void checkpoint(ckpt::visitor& v, T& x)`");
  } else {
    static_assert(member_checkpointable<T>,
                  "ckpt: this type is not Checkpointable. Add a member "
                  "`template <class V> void checkpoint(V& v) { v.tensor(\"name\", data); v.value(\"step\", step); }` "
                  "or specialise ckpt::checkpoint_traits<T> with `static void checkpoint(ckpt::visitor&, T&)`");
  }
  return true;
}

template <class T>
void visit_state(visitor& v, T& state) {
  static_assert(diagnose_checkpointable<std::remove_const_t<T>>());
  auto& s = const_cast<std::remove_const_t<T>&>(state);
  if constexpr (traits_checkpointable<std::remove_const_t<T>>)
    checkpoint_traits<std::remove_const_t<T>>::checkpoint(v, s);
  else
    access::checkpoint(s, v);
}

/// A state to visit, its type erased: what save and load pass to the checkpointer's bodies,
/// which then do not depend on the state's type (and, with CKPT_SEPARATE_COMPILATION, are
/// compiled once). Refers to the state; it must outlive the call.
class state_ref {
 public:
  template <class T>
  explicit state_ref(T& state) noexcept
      : state_(const_cast<void*>(static_cast<const void*>(&state))),
        visit_([](void* s, visitor& v) { visit_state(v, *static_cast<T*>(s)); }) {}
  void visit(visitor& v) const { visit_(state_, v); }

 private:
  void* state_;
  void (*visit_)(void*, visitor&);
};
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Storage
// ---------------------------------------------------------------------------------------------

/// The handle `Storage::create` returns: bytes go in with `write`, become durable under a
/// temporary name with `sync`, and appear under their final name, atomically, with `publish`.
/// Destroying a writer that was not published discards what it wrote.
template <class W>
concept StorageWriter = std::movable<W> && requires(W& w, std::span<const std::byte> bytes) {
  w.write(bytes);
  w.sync();
  w.publish();
};

/// Where checkpoint bytes live. Keys are '/'-separated paths relative to the storage root
/// ("global_step200/metadata.json").
///
/// @code
/// struct my_store {
///   struct writer { void write(std::span<const std::byte>); void sync(); void publish(); };
///   writer create(std::string_view key);
///   void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const;
///   std::optional<std::uint64_t> size(std::string_view key) const;      // nullopt: no such key
///   std::vector<std::string> list(std::string_view prefix) const;       // immediate children
///   void remove(std::string_view key);
///   void remove_all(std::string_view prefix);
///   std::string describe(std::string_view key) const;                   // for messages
/// };
/// static_assert(ckpt::Storage<my_store>);
/// @endcode
template <class S>
concept Storage = requires(S& s, const S& cs, std::string_view key, std::uint64_t offset, std::span<std::byte> out) {
  { s.create(key) } -> StorageWriter;
  cs.read(key, offset, out);
  { cs.size(key) } -> std::same_as<std::optional<std::uint64_t>>;
  { cs.list(key) } -> std::same_as<std::vector<std::string>>;
  s.remove(key);
  s.remove_all(key);
  { cs.describe(key) } -> std::convertible_to<std::string>;
};

namespace detail {
/// A Storage whose `read` may be called from several threads at once declares
/// `static constexpr bool concurrent_reads = true;` and loads then read chunks in parallel.
template <class S>
concept concurrent_reads = requires { requires S::concurrent_reads; };

/// A Storage whose `list`, `remove` and `remove_all` may run on one thread while another saves
/// or loads through it declares `static constexpr bool background_removal = true;`: retention
/// then deletes old tags' files on a thread of its own (detail/background_removal.hpp) after
/// removing their metadata.json, so that a save returns once it has committed.
template <class S>
concept removes_in_background = requires { requires S::background_removal; };

/// A writer (what `create` returns) that can allocate a file's space ahead offers
/// `reserve(bytes)`: the file will hold at least `bytes`. Saves call it before the first write
/// when they know the size (raw chunks); posix with O_DIRECT allocates the space in one step.
template <class W>
concept reserves_space = requires(W& w, std::uint64_t bytes) { w.reserve(bytes); };

/// A writer that can write from the caller's memory after `write` has returned offers
/// `write_retained(bytes)`: the same as `write(bytes)`, but the caller keeps the bytes valid
/// and unchanged until `sync`. Saves call it for raw chunks written from the tensors themselves,
/// which stay put until the shard file is synced; posix with O_DIRECT then keeps its writes of
/// them in flight across chunks instead of waiting for each chunk's writes before the next.
template <class W>
concept retains_writes = requires(W& w, std::span<const std::byte> bytes) { w.write_retained(bytes); };

/// A Storage that can tell two writers to one root apart offers `lock_writer(bool wait)`: it
/// returns a movable guard that holds the root's writer lock until destroyed, or throws a
/// `busy` error (or, with `wait`, blocks) while another holder has it.
template <class S>
concept lockable_root = requires(S& s, bool wait) {
  { s.lock_writer(wait) } -> std::movable;
};

/// A Storage that can open a file once for several reads offers `open_reader(key)`, returning
/// a movable object with `read(offset, out)` (the same contract as the Storage's own `read`,
/// and safe to call while another reader of the same file reads). Loads read each chunk in
/// pieces of 256 KiB, hashing each piece while it is in cache; with readers, each load worker
/// keeps its file open from one chunk to the next instead of opening it for every read.
template <class S>
concept opens_readers = requires(const S& cs, std::string_view key, std::uint64_t offset, std::span<std::byte> out) {
  { cs.open_reader(key).read(offset, out) };
};

/// A reader (what `open_reader` returns) that reads ahead offers `will_read(offset, bytes)`:
/// loads say, before each read, how far the file will be read next (posix with O_DIRECT).
template <class R>
concept announces_reads = requires(R& r, std::uint64_t offset, std::size_t n) { r.will_read(offset, n); };

/// A reader that can read some ranges from the disk straight into the caller's memory, with no
/// copy (posix with O_DIRECT, into memory as far into its page as the offset is into its 4 KiB
/// block: a save places large raw chunks so, unless checkpointer_options::place_for_memory is
/// off), offers `reads_in_place(offset, out)`: true when `read(offset, out)` would do so. Loads then read
/// such a chunk in pieces of `in_place_piece_bytes` instead of `read_piece_bytes`, and hash
/// each piece after it arrives: there is no copy to keep in the cache, and a disk moves large
/// requests faster than small ones.
template <class R>
concept reads_in_place = requires(const R& r, std::uint64_t offset, std::span<const std::byte> out) {
  { r.reads_in_place(offset, out) } -> std::convertible_to<bool>;
};

/// The pieces a load reads a chunk in when its reader reads them in place (reads_in_place).
inline constexpr std::size_t in_place_piece_bytes = std::size_t{4} << 20;

/// What `open_reader` returns, or std::monostate for a Storage without readers.
template <class S>
struct reader_of {
  using type = std::monostate;
};
template <opens_readers S>
struct reader_of<S> {
  using type = decltype(std::declval<const S&>().open_reader(std::string_view{}));
};

/// How many bytes a load asks a Storage for at a time while hashing a chunk: 256 KiB (the
/// pieces stay in the CPU's cache between the read and the hash), unless the Storage says
/// otherwise with `static constexpr std::size_t read_piece_bytes` (an object store, where
/// every read is a round trip, reads whole chunks).
template <class S>
constexpr std::size_t read_piece_bytes() {
  if constexpr (requires { S::read_piece_bytes; })
    return S::read_piece_bytes;
  else
    return std::size_t{256} * 1024;
}

/// How many reads a load keeps in flight against a Storage. A disk with a deep queue (NVMe, a
/// cloud volume) moves more bytes per second with several requests outstanding than with one
/// per core, so a Storage that knows offers `reads_in_flight()`, and loads of chunks read straight
/// into host tensors then run on that many workers (more than there are cores: they spend
/// their time waiting for the disk). Without it, a load reads on as many workers as it has
/// threads.
template <class S>
concept has_read_depth = requires(const S& s) {
  { s.reads_in_flight() } -> std::convertible_to<unsigned>;
};

/// The guard type of a lockable_root Storage; an empty stand-in for the others.
template <class S>
struct writer_lock_of {
  using type = std::monostate;
};
template <lockable_root S>
struct writer_lock_of<S> {
  using type = decltype(std::declval<S&>().lock_writer(false));
};
}  // namespace detail

namespace detail {
template <class S>
constexpr bool diagnose_storage() {
  if constexpr (!requires(S& s, std::string_view k) { s.create(k); }) {
    static_assert(always_false<S>, "ckpt: Storage needs `writer create(std::string_view key)`");
  } else if constexpr (!StorageWriter<decltype(std::declval<S&>().create(std::string_view{}))>) {
    static_assert(always_false<S>,
                  "ckpt: the writer returned by Storage::create needs `void write(std::span<const std::byte>)`, "
                  "`void sync()` and `void publish()`, and must be movable");
  } else if constexpr (!requires(const S& s, std::string_view k, std::uint64_t o, std::span<std::byte> out) { s.read(k, o, out); }) {
    static_assert(always_false<S>,
                  "ckpt: Storage needs `void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const`");
  } else if constexpr (!requires(const S& s, std::string_view k) { { s.size(k) } -> std::same_as<std::optional<std::uint64_t>>; }) {
    static_assert(always_false<S>, "ckpt: Storage needs `std::optional<std::uint64_t> size(std::string_view key) const`");
  } else if constexpr (!requires(const S& s, std::string_view k) { { s.list(k) } -> std::same_as<std::vector<std::string>>; }) {
    static_assert(always_false<S>, "ckpt: Storage needs `std::vector<std::string> list(std::string_view prefix) const`");
  } else if constexpr (!requires(S& s, std::string_view k) { s.remove(k); s.remove_all(k); }) {
    static_assert(always_false<S>,
                  "ckpt: Storage needs `void remove(std::string_view key)` and `void remove_all(std::string_view prefix)`");
  } else {
    static_assert(Storage<S>, "ckpt: Storage needs `std::string describe(std::string_view key) const`");
  }
  return true;
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Codec
// ---------------------------------------------------------------------------------------------

/// How a chunk's bytes are stored. `id` is written to disk: 0 raw, 1 zstd, 2 zstd_bytegroup are
/// ckpt's; user codecs take ids from 128 up.
///
/// @code
/// struct my_codec {
///   static constexpr std::uint8_t id = 130;
///   std::size_t max_encoded_size(std::size_t raw_bytes) const;
///   std::size_t encode(std::span<const std::byte> in, ckpt::dtype t, std::span<std::byte> out) const;
///   void decode(std::span<const std::byte> in, ckpt::dtype t, std::span<std::byte> out) const;  // out: raw size
/// };
/// @endcode
template <class C>
concept Codec = requires(const C& c, std::span<const std::byte> in, std::span<std::byte> out, dtype t, std::size_t n) {
  { C::id } -> std::convertible_to<std::uint8_t>;
  { c.max_encoded_size(n) } -> std::convertible_to<std::size_t>;
  { c.encode(in, t, out) } -> std::convertible_to<std::size_t>;
  c.decode(in, t, out);
};

namespace detail {
/// A Codec that chooses per tensor offers `std::uint8_t id_for(dtype, std::uint64_t bytes) const`
/// (the id each chunk of such a tensor is stored with; 0 stores it raw) and
/// `std::size_t encode_with(std::uint8_t id, in, dtype, out) const` to encode with that choice.
template <class C>
concept chooses_per_tensor = requires(const C& c, dtype t, std::uint64_t n) {
  { c.id_for(t, n) } -> std::convertible_to<std::uint8_t>;
};
template <class C>
concept encodes_with = requires(const C& c, std::uint8_t id, std::span<const std::byte> in, dtype t, std::span<std::byte> out) {
  { c.encode_with(id, in, t, out) } -> std::convertible_to<std::size_t>;
};

template <class C>
constexpr bool diagnose_codec() {
  if constexpr (!requires { { C::id } -> std::convertible_to<std::uint8_t>; }) {
    static_assert(always_false<C>, "ckpt: a Codec needs `static constexpr std::uint8_t id` (user codecs: 128 and up)");
  } else if constexpr (!requires(const C& c, std::size_t n) { { c.max_encoded_size(n) } -> std::convertible_to<std::size_t>; }) {
    static_assert(always_false<C>, "ckpt: a Codec needs `std::size_t max_encoded_size(std::size_t raw_bytes) const`");
  } else if constexpr (!requires(const C& c, std::span<const std::byte> in, std::span<std::byte> out, dtype t) { { c.encode(in, t, out) } -> std::convertible_to<std::size_t>; }) {
    static_assert(always_false<C>,
                  "ckpt: a Codec needs `std::size_t encode(std::span<const std::byte> in, ckpt::dtype, std::span<std::byte> out) const`");
  } else {
    static_assert(Codec<C>,
                  "ckpt: a Codec needs `void decode(std::span<const std::byte> in, ckpt::dtype, std::span<std::byte> out) const`");
  }
  return true;
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// DevicePolicy
// ---------------------------------------------------------------------------------------------

/// How tensor bytes travel between where they live and host memory. `host_copy` handles host
/// tensors; `ckpt::cuda::device_copy` (`<ckpt/cuda/device_copy.hpp>`) GPU tensors.
///
/// Three optional members speed things up: `std::byte* host_view(const tensor_ref&) const` (the
/// bytes are addressable in place: raw chunks are written and loaded without a copy),
/// `ckpt::lent_buffer lend(std::size_t n)` (the pipelines borrow their host buffers from the
/// policy, e.g. pinned memory, and copies to and from them can skip a bounce buffer), and
/// `start_to_host(t, offset, dst)`, returning a handle with `wait()` (a copy left in flight: the
/// save pipeline enqueues the next chunk's copy before the last one has landed, and waits on
/// the handle before it hashes the chunk).
///
/// @code
/// struct my_device {
///   bool accepts(ckpt::device d) const;
///   // copy bytes [offset, offset + dst.size()) of t into host memory
///   void to_host(const ckpt::tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst);
///   // copy host bytes into t at byte offset `offset`
///   void from_host(std::span<const std::byte> src, const ckpt::tensor_ref& t, std::uint64_t offset);
/// };
/// @endcode
template <class D>
concept DevicePolicy = requires(D& d, const D& cd, const tensor_ref& t, std::uint64_t off, std::span<std::byte> dst,
                                std::span<const std::byte> src, device where) {
  { cd.accepts(where) } -> std::convertible_to<bool>;
  d.to_host(t, off, dst);
  d.from_host(src, t, off);
};

namespace detail {
/// A DevicePolicy that can hand out a tensor's bytes in place (host memory).
template <class D>
concept has_host_view = requires(const D& d, const tensor_ref& t) {
  { d.host_view(t) } -> std::same_as<std::byte*>;
};

/// A DevicePolicy that lends the pipelines host buffers: `lend(n)` returns a lent_buffer of at
/// least n bytes, or an empty one to refuse (over its budget).
template <class D>
concept lends_buffers = requires(D& d, std::size_t n) {
  { d.lend(n) } -> std::same_as<lent_buffer>;
};

/// A DevicePolicy that can leave a copy to host memory in flight: `start_to_host` returns a
/// handle whose `wait()` returns once the bytes are in `dst` (and whose destructor waits too).
template <class D>
concept starts_copies = requires(D& d, const tensor_ref& t, std::uint64_t off, std::span<std::byte> dst) {
  d.start_to_host(t, off, dst).wait();
};

/// The handle a `starts_copies` policy's `start_to_host` returns.
template <starts_copies D>
using started_copy = decltype(std::declval<D&>().start_to_host(std::declval<const tensor_ref&>(), std::uint64_t{}, std::span<std::byte>{}));

template <class D>
constexpr bool diagnose_device_policy() {
  if constexpr (!requires(const D& d, device w) { { d.accepts(w) } -> std::convertible_to<bool>; }) {
    static_assert(always_false<D>, "ckpt: a DevicePolicy needs `bool accepts(ckpt::device) const`");
  } else if constexpr (!requires(D& d, const tensor_ref& t, std::uint64_t o, std::span<std::byte> dst) { d.to_host(t, o, dst); }) {
    static_assert(always_false<D>,
                  "ckpt: a DevicePolicy needs `void to_host(const ckpt::tensor_ref&, std::uint64_t offset, std::span<std::byte> dst)`");
  } else {
    static_assert(DevicePolicy<D>,
                  "ckpt: a DevicePolicy needs `void from_host(std::span<const std::byte> src, const ckpt::tensor_ref&, std::uint64_t offset)`");
  }
  return true;
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Communicator
// ---------------------------------------------------------------------------------------------

/// Collective operations between the ranks of a job; ShardPolicies agree and commit through it.
/// Every call is collective: all ranks make it, in the same order.
///
/// @code
/// struct my_comm {
///   int rank() const; int size() const;
///   void barrier();
///   void broadcast(std::vector<std::byte>& bytes, int root);              // resized on receivers
///   std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine);
///   std::vector<std::vector<std::byte>> gather(std::span<const std::byte> mine, int root);  // empty off root
///   std::uint64_t all_reduce_max(std::uint64_t x);
/// };
/// @endcode
template <class C>
concept Communicator = requires(C& c, const C& cc, std::vector<std::byte>& buf, std::span<const std::byte> mine,
                                std::uint64_t x, int root) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.barrier();
  c.broadcast(buf, root);
  { c.all_gather(mine) } -> std::same_as<std::vector<std::vector<std::byte>>>;
  { c.gather(mine, root) } -> std::same_as<std::vector<std::vector<std::byte>>>;
  { c.all_reduce_max(x) } -> std::convertible_to<std::uint64_t>;
};

namespace detail {
/// A Communicator that may be used from a background thread says so, at run time, with
/// `bool thread_safe() const` (ckpt::mpi: when MPI was initialised with
/// MPI_THREAD_MULTIPLE). save_async on more than one rank needs one that says yes.
template <class C>
concept reports_thread_safety = requires(const C& c) {
  { c.thread_safe() } -> std::convertible_to<bool>;
};

template <class C>
constexpr bool diagnose_communicator() {
  if constexpr (!requires(const C& c) { { c.rank() } -> std::convertible_to<int>; { c.size() } -> std::convertible_to<int>; }) {
    static_assert(always_false<C>, "ckpt: a Communicator needs `int rank() const` and `int size() const`");
  } else if constexpr (!requires(C& c) { c.barrier(); }) {
    static_assert(always_false<C>, "ckpt: a Communicator needs `void barrier()`");
  } else if constexpr (!requires(C& c, std::vector<std::byte>& b, int r) { c.broadcast(b, r); }) {
    static_assert(always_false<C>, "ckpt: a Communicator needs `void broadcast(std::vector<std::byte>&, int root)`");
  } else if constexpr (!requires(C& c, std::span<const std::byte> m) { { c.all_gather(m) } -> std::same_as<std::vector<std::vector<std::byte>>>; }) {
    static_assert(always_false<C>,
                  "ckpt: a Communicator needs `std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte>)`");
  } else if constexpr (!requires(C& c, std::span<const std::byte> m, int r) { { c.gather(m, r) } -> std::same_as<std::vector<std::vector<std::byte>>>; }) {
    static_assert(always_false<C>,
                  "ckpt: a Communicator needs `std::vector<std::vector<std::byte>> gather(std::span<const std::byte>, int root)`");
  } else {
    static_assert(Communicator<C>, "ckpt: a Communicator needs `std::uint64_t all_reduce_max(std::uint64_t)`");
  }
  return true;
}
}  // namespace detail

/// A Communicator that can also move bytes between two ranks, point to point, straight from and
/// into tensors wherever they live (host, or GPU memory for `ckpt::cuda::nccl`). With one,
/// `gather_to_root` streams every shard to rank 0 chunk by chunk while rank 0 writes, instead
/// of packing the whole state into one message, and scatters it back from rank 0 on load.
///
/// Every call blocks until its bytes have left (send) or landed (receive). A send of n bytes to
/// a peer is matched by exactly one receive of n bytes from it, in the order both sides make
/// them, whichever of the functions each side uses (a `send_tensor` may meet a `recv_host`).
/// Transfers of 0 bytes are made by neither side.
///
/// Optional: `bool moves(const ckpt::tensor_ref&) const`, whether `send_tensor`/`recv_tensor`
/// can take that tensor's memory directly (without it: every tensor). Tensors it cannot move
/// (GPU memory over MPI) are staged through the checkpointer's DevicePolicy and sent as host bytes.
///
/// @code
/// struct my_transport : my_comm {
///   void send_tensor(const ckpt::tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, int peer);
///   void recv_tensor(const ckpt::tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, int peer);
///   void send_host(std::span<const std::byte> bytes, int peer);
///   void recv_host(std::span<std::byte> bytes, int peer);
/// };
/// @endcode
template <class C>
concept Transport = Communicator<C> && requires(C& c, const tensor_ref& t, std::uint64_t offset, std::uint64_t n,
                                                std::span<const std::byte> in, std::span<std::byte> out, int peer) {
  c.send_tensor(t, offset, n, peer);
  c.recv_tensor(t, offset, n, peer);
  c.send_host(in, peer);
  c.recv_host(out, peer);
};

// ---------------------------------------------------------------------------------------------
// ShardPolicy
// ---------------------------------------------------------------------------------------------

/// Who writes what: the topology recorded in metadata, the file this rank writes (if any), and
/// whether this rank stores a given tensor's bytes (replicas are written once).
///
/// @code
/// struct my_policy {
///   using communicator_type = ckpt::local;
///   communicator_type& communicator();
///   ckpt::topology topology() const;
///   std::optional<std::string> shard_file() const;                 // relative to the tag
///   bool writes(std::string_view name, const ckpt::tensor_ref& t) const;
/// };
/// @endcode
template <class P>
concept ShardPolicy = requires(P& p, const P& cp, std::string_view name, const tensor_ref& t) {
  typename P::communicator_type;
  requires Communicator<typename P::communicator_type>;
  { p.communicator() } -> std::same_as<typename P::communicator_type&>;
  { cp.topology() } -> std::same_as<topology>;
  { cp.shard_file() } -> std::same_as<std::optional<std::string>>;
  { cp.writes(name, t) } -> std::convertible_to<bool>;
};

namespace detail {
/// A Transport whose `moves(t)` says which tensors it takes directly (see Transport).
template <class C>
concept chooses_tensors = requires(const C& c, const tensor_ref& t) {
  { c.moves(t) } -> std::convertible_to<bool>;
};

/// A ShardPolicy that sends every rank's tensors to rank 0, which writes the one shard file,
/// declares `static constexpr bool gathers = true;` (gather_to_root). The gather stage
/// (detail/gather.hpp) then moves them.
template <class P>
concept gathers = requires { requires P::gathers; };

/// A gathering policy whose communicator is a Transport: shards stream to rank 0 chunk by chunk
/// at save instead of going through one gather.
template <class P>
concept streams = gathers<P> && Transport<typename P::communicator_type>;

/// A streaming policy with a `bool scatter_on_load` member: when true, loads on several ranks
/// scatter (rank 0 reads, the others receive).
template <class P>
concept scatters = streams<P> && requires(const P& p) { { p.scatter_on_load } -> std::convertible_to<bool>; };

template <class P>
constexpr bool diagnose_shard_policy() {
  if constexpr (!requires { typename P::communicator_type; }) {
    static_assert(always_false<P>, "ckpt: a ShardPolicy needs `using communicator_type = ...;` (ckpt::local for one process)");
  } else {
    static_assert(diagnose_communicator<typename P::communicator_type>());
    if constexpr (!requires(P& p) { { p.communicator() } -> std::same_as<typename P::communicator_type&>; }) {
      static_assert(always_false<P>, "ckpt: a ShardPolicy needs `communicator_type& communicator()`");
    } else if constexpr (!requires(const P& p) { { p.topology() } -> std::same_as<topology>; }) {
      static_assert(always_false<P>, "ckpt: a ShardPolicy needs `ckpt::topology topology() const`");
    } else if constexpr (!requires(const P& p) { { p.shard_file() } -> std::same_as<std::optional<std::string>>; }) {
      static_assert(always_false<P>, "ckpt: a ShardPolicy needs `std::optional<std::string> shard_file() const`");
    } else {
      static_assert(ShardPolicy<P>,
                    "ckpt: a ShardPolicy needs `bool writes(std::string_view name, const ckpt::tensor_ref&) const`");
    }
  }
  return true;
}
}  // namespace detail

}  // namespace ckpt
