#pragma once
// A stand-in for NCCL, for ranks that are threads of one test process, on top of the fake CUDA
// runtime's streams (fake_runtime.hpp). It keeps NCCL's semantics where basic_nccl depends on
// them:
//
// - every operation is enqueued on a stream and runs when the stream gets to it, reading its
//   send buffer and writing its receive buffer then, so a caller that does not wait for the
//   stream (or does not order it after the user's) sees wrong bytes, and the watchdog's
//   polling of the stream is exercised;
// - a receive waits for the next message from its peer and checks its size: a mismatch becomes
//   an asynchronous error, as a real mismatch would eventually be (a hang or corruption);
// - collectives are rendezvous of every rank of the world, numbered in the order each rank
//   enqueues them; a rank making a different collective is an asynchronous error;
// - abort ends the waiting operations of that rank with nothing delivered, so its stream can
//   drain (a receive also gives up on its own after `patience`, so a test never hangs for good);
// - any call can be made to fail on a rank's n-th use, with an NCCL error string, and an
//   asynchronous error can be injected into a rank;
// - communicators are non-blocking, as ncclCommInitRankConfig with blocking = 0 makes them:
//   init_rank returns at once and status says in_progress until every rank of the world has
//   joined (a rank that never comes leaves the others in progress for good); the first send
//   or receive to each peer leaves the communicator in progress for a few polls (NCCL connects
//   to a peer lazily); and any call made while it is in progress fails, as NCCL requires the
//   caller to wait for ncclSuccess first.
//
// Not modelled: NCCL's rendezvous of a send with its receive (a send here is buffered and
// completes at once) and groups (group_start and group_end are only counted).

#include "fake_runtime.hpp"

#include <ckpt/cuda/basic_nccl.hpp>  // nccl_status

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fake {

/// The shared side of one NCCL communicator (one unique id): mailboxes and collective rounds.
struct nccl_world {
  explicit nccl_world(int n) : size(n) {}
  const int size;
  std::mutex mu;
  int joined = 0;  // ranks that called init_rank
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<std::vector<std::byte>>> mail;  // (from, to) -> messages
  struct round {
    std::string kind;
    std::vector<std::vector<std::byte>> parts;
    int arrived = 0, left = 0;
  };
  std::map<std::uint64_t, round> rounds;  // by collective number
};

/// One rank's handle on a world (an ncclComm_t).
struct nccl_comm_impl {
  std::shared_ptr<nccl_world> world;
  int rank = 0;
  std::uint64_t collectives = 0;  // enqueued so far; only the owning caller touches it
  std::vector<int> connected;     // peers a send or receive went to; only the owning caller
  int connecting = 0;             // polls of status left before a new connection is made; likewise
  // Under world->mu:
  bool aborted = false;
  std::string async_error;
};

/// What the fake remembers across copies of the API (every rank of a test shares one).
struct nccl_state {
  std::mutex mu;
  std::map<std::array<std::byte, 128>, std::shared_ptr<nccl_world>> worlds;
  std::uint64_t next_id = 0;
  std::map<std::pair<std::string, int>, std::pair<int, std::string>> fail_on;  // (call, rank) -> (n-th use, error)
  std::map<std::pair<std::string, int>, int> uses;                             // (call, rank) -> uses so far
  std::map<std::string, int> calls;                                            // call -> uses on every rank
  std::map<int, std::string> injected;                                         // rank -> asynchronous error
  std::vector<int> aborted_ranks;
  int comms_made = 0, comms_destroyed = 0;
  std::atomic<std::uint64_t> bytes_sent{0};
  std::chrono::milliseconds patience{30'000};  // how long a receive or a collective waits at most
  int connect_polls = 3;                        // status polls a new peer connection takes
  int drop_send = 0;                            // the n-th send of any rank is never delivered (0: none)
  int sends = 0;                                // under mu
  std::atomic<std::uint64_t> in_progress_answers{0};
};

struct nccl_api {
  using comm = std::shared_ptr<nccl_comm_impl>;
  using stream = stream_impl*;
  struct unique_id {
    std::array<std::byte, 128> bytes{};
  };
  struct failure : std::runtime_error {
    failure(const std::string& what, int result) : std::runtime_error(what), code(result) {}
    int code = 0;
  };

  std::shared_ptr<nccl_state> st = std::make_shared<nccl_state>();

  // ----- what tests set up and look at ---------------------------------------------------------

  /// Makes `call` ("ncclSend", "ncclAllReduce", ...) fail on `rank`'s `nth` use with `error`.
  void fail(const std::string& call, int nth, const std::string& error, int rank) {
    std::lock_guard lock(st->mu);
    st->fail_on[{call, rank}] = {nth, error};
  }
  /// From now on, async_error reports `error` on `rank` (a peer died, the network failed).
  void inject_async_error(int rank, const std::string& error) {
    std::lock_guard lock(st->mu);
    st->injected[rank] = error;
  }
  int calls(const std::string& call) const {
    std::lock_guard lock(st->mu);
    auto it = st->calls.find(call);
    return it == st->calls.end() ? 0 : it->second;
  }
  bool was_aborted(int rank) const {
    std::lock_guard lock(st->mu);
    return std::count(st->aborted_ranks.begin(), st->aborted_ranks.end(), rank) > 0;
  }
  /// Communicators made and neither destroyed nor aborted.
  int comms_alive() const {
    std::lock_guard lock(st->mu);
    return st->comms_made - st->comms_destroyed - static_cast<int>(st->aborted_ranks.size());
  }

  // ----- the API basic_nccl calls ------------------------------------------------------------

  unique_id make_unique_id() {
    enter("ncclGetUniqueId", -1);
    std::lock_guard lock(st->mu);
    unique_id id;
    // Unique in the process, as real ids are (random): communicators of this process are told
    // apart by their ids, whichever fake made them.
    static std::atomic<std::uint64_t> next{0};
    const std::uint64_t n = ++next;
    ++st->next_id;
    std::memcpy(id.bytes.data(), &n, sizeof n);
    id.bytes[127] = std::byte{0x5A};  // never all zero, like a real id
    return id;
  }
  /// Non-blocking: the communicator is ready once every rank of the world has called this.
  comm init_rank(int size, const unique_id& id, int rank) {
    enter("ncclCommInitRank", rank);
    std::shared_ptr<nccl_world> w;
    {
      std::lock_guard lock(st->mu);
      auto& slot = st->worlds[id.bytes];
      if (!slot) slot = std::make_shared<nccl_world>(size);
      w = slot;
      if (w->size != size || rank < 0 || rank >= size) throw failure("invalid argument (run with NCCL_DEBUG=WARN for details)", 4);
      ++st->comms_made;
    }
    auto c = std::make_shared<nccl_comm_impl>();
    c->world = w;
    c->rank = rank;
    {
      std::lock_guard lock(w->mu);
      ++w->joined;
    }
    w->cv.notify_all();
    return c;
  }
  void destroy(comm c) noexcept {
    if (!c) return;
    std::lock_guard lock(st->mu);
    ++st->comms_destroyed;
  }
  void abort(comm c) noexcept {
    if (!c) return;
    {
      std::lock_guard lock(c->world->mu);
      c->aborted = true;
    }
    c->world->cv.notify_all();
    std::lock_guard lock(st->mu);
    st->aborted_ranks.push_back(c->rank);
  }
  ckpt::cuda::nccl_status status(comm c, std::string& what) {
    enter("ncclCommGetAsyncError", c->rank);
    {
      std::lock_guard lock(st->mu);
      if (auto it = st->injected.find(c->rank); it != st->injected.end()) {
        what = it->second;
        return ckpt::cuda::nccl_status::failed;
      }
    }
    std::lock_guard lock(c->world->mu);
    if (!c->async_error.empty()) {
      what = c->async_error;
      return ckpt::cuda::nccl_status::failed;
    }
    if (c->world->joined < c->world->size || c->connecting > 0) {
      if (c->connecting > 0) --c->connecting;
      ++st->in_progress_answers;
      return ckpt::cuda::nccl_status::in_progress;
    }
    return ckpt::cuda::nccl_status::ready;
  }

  void send(const void* data, std::size_t bytes, int peer, comm c, stream s) {
    enter("ncclSend", c->rank);
    need(s);
    ready(c);
    connect(c, peer);
    auto shared = st;
    bool dropped = false;
    {
      std::lock_guard lock(st->mu);
      dropped = ++st->sends == st->drop_send;
    }
    if (dropped) return;  // taken, never delivered: the receiver waits in vain
    s->enqueue([c, data, bytes, peer, shared] {
      const auto* p = static_cast<const std::byte*>(data);
      std::vector<std::byte> msg(p, p + bytes);  // read when the stream gets here, as NCCL does
      {
        std::lock_guard lock(c->world->mu);
        c->world->mail[{c->rank, peer}].push_back(std::move(msg));
      }
      c->world->cv.notify_all();
      shared->bytes_sent += bytes;
    });
  }
  void recv(void* data, std::size_t bytes, int peer, comm c, stream s) {
    enter("ncclRecv", c->rank);
    need(s);
    ready(c);
    connect(c, peer);
    const auto patience = st->patience;
    s->enqueue([c, data, bytes, peer, patience] {
      auto& w = *c->world;
      std::unique_lock lock(w.mu);
      auto& box = w.mail[{peer, c->rank}];
      if (!w.cv.wait_for(lock, patience, [&] { return c->aborted || !box.empty(); })) {
        c->async_error = "fake NCCL: rank " + std::to_string(c->rank) + " gave up waiting for rank " + std::to_string(peer);
        return;
      }
      if (c->aborted) return;
      auto msg = std::move(box.front());
      box.pop_front();
      if (msg.size() != bytes) {
        c->async_error = "fake NCCL: rank " + std::to_string(c->rank) + " received " + std::to_string(msg.size()) +
                         " bytes from rank " + std::to_string(peer) + " for a receive of " + std::to_string(bytes);
        return;
      }
      std::memcpy(data, msg.data(), bytes);
    });
  }
  void all_reduce_max_u64(const std::uint64_t* send, std::uint64_t* recv, std::size_t count, comm c, stream s) {
    enter("ncclAllReduce", c->rank);
    collective(c, s, "all_reduce_max_u64", send, count * sizeof(std::uint64_t), [recv, count](const auto& parts, int) {
      std::vector<std::uint64_t> best(count, 0);
      for (const auto& p : parts)
        for (std::size_t i = 0; i < count; ++i) {
          std::uint64_t v;
          std::memcpy(&v, p.data() + i * sizeof v, sizeof v);
          best[i] = std::max(best[i], v);
        }
      std::memcpy(recv, best.data(), count * sizeof(std::uint64_t));
    });
  }
  void all_gather(const void* send, void* recv, std::size_t bytes_per_rank, comm c, stream s) {
    enter("ncclAllGather", c->rank);
    collective(c, s, "all_gather", send, bytes_per_rank, [recv, bytes_per_rank](const auto& parts, int) {
      for (std::size_t r = 0; r < parts.size(); ++r)
        std::memcpy(static_cast<std::byte*>(recv) + r * bytes_per_rank, parts[r].data(), bytes_per_rank);
    });
  }
  void broadcast(const void* send, void* recv, std::size_t bytes, int root, comm c, stream s) {
    enter("ncclBroadcast", c->rank);
    // Only the root's send buffer is read, as in NCCL.
    collective(c, s, "broadcast from " + std::to_string(root), c->rank == root ? send : nullptr, c->rank == root ? bytes : 0,
               [recv, bytes, root](const auto& parts, int) {
                 std::memcpy(recv, parts[static_cast<std::size_t>(root)].data(), bytes);
               });
  }
  /// Inside a group NCCL defers the calls to the group's end, so they are taken while the
  /// communicator connects; the group's end is where the caller waits.
  void group_start() {
    enter("ncclGroupStart", -1);
    ++group_depth();
  }
  void group_end() {
    enter("ncclGroupEnd", -1);
    if (group_depth() > 0) --group_depth();
  }

 private:
  void enter(const std::string& call, int rank) {
    std::lock_guard lock(st->mu);
    ++st->calls[call];
    const int n = ++st->uses[{call, rank}];
    if (auto it = st->fail_on.find({call, rank}); it != st->fail_on.end() && it->second.first == n)
      throw failure(it->second.second, 2);
  }
  static void need(stream s) {
    if (!s) throw std::logic_error("fake NCCL: operations need a stream (basic_nccl always passes its own)");
  }
  static int& group_depth() {
    thread_local int depth = 0;
    return depth;
  }
  /// NCCL takes no call on a communicator that is still in progress (joining or connecting).
  static void ready(const comm& c) {
    if (group_depth() > 0) return;
    std::lock_guard lock(c->world->mu);
    if (c->world->joined < c->world->size || c->connecting > 0)
      throw failure("invalid usage: a call on a communicator still in progress (wait for ncclCommGetAsyncError to give ncclSuccess)", 5);
  }
  /// The first transfer to a peer makes the connection: in progress for a few polls.
  void connect(const comm& c, int peer) {
    if (std::find(c->connected.begin(), c->connected.end(), peer) != c->connected.end()) return;
    c->connected.push_back(peer);
    std::lock_guard lock(c->world->mu);
    c->connecting = st->connect_polls;
  }

  /// Deposits this rank's contribution when the stream gets here, waits for every rank's, then
  /// lets `finish` write this rank's result.
  template <class Finish>
  void collective(const comm& c, stream s, std::string kind, const void* send, std::size_t bytes, Finish finish) {
    need(s);
    ready(c);
    const std::uint64_t number = c->collectives++;
    const auto patience = st->patience;
    s->enqueue([c, number, kind = std::move(kind), send, bytes, finish, patience] {
      const auto* p = static_cast<const std::byte*>(send);
      std::vector<std::byte> mine(p, p + bytes);
      auto& w = *c->world;
      std::unique_lock lock(w.mu);
      auto& r = w.rounds[number];
      if (r.parts.empty()) {
        r.parts.resize(static_cast<std::size_t>(w.size));
        r.kind = kind;
      }
      if (r.kind != kind) {
        c->async_error = "fake NCCL: rank " + std::to_string(c->rank) + " made " + kind + " while another rank made " + r.kind;
        return;
      }
      r.parts[static_cast<std::size_t>(c->rank)] = std::move(mine);
      ++r.arrived;
      w.cv.notify_all();
      if (!w.cv.wait_for(lock, patience, [&] { return c->aborted || r.arrived == w.size; })) {
        c->async_error = "fake NCCL: rank " + std::to_string(c->rank) + " gave up waiting for the other ranks in " + kind;
        return;
      }
      if (c->aborted) return;
      finish(r.parts, c->rank);
      if (++r.left == w.size) w.rounds.erase(number);
    });
  }
};

}  // namespace fake
