#pragma once
/// @file in_process.hpp
/// `ckpt::in_process`: a Communicator whose ranks are threads of one process. Tools use it to
/// write a checkpoint laid out for N ranks from a single process (`ckpt reshard`), and tests
/// use it to run multi-rank saves and loads without MPI.

#include <barrier>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "error.hpp"
#include "impl/checkpointer.ipp"  // its users make checkpointers other than impl/instances.hpp's
#include "tensor.hpp"

namespace ckpt {

/// The shared side of an in-process world: one slot per rank, a barrier, and a mailbox per pair
/// of ranks for point-to-point transfers.
class in_process_world {
 public:
  explicit in_process_world(int size) : size_(size), slots_(static_cast<std::size_t>(size)), sync_(size) {
    if (size < 1) throw std::invalid_argument("in_process_world: size must be at least 1");
  }
  int size() const noexcept { return size_; }

 private:
  friend struct in_process;
  int size_;
  std::vector<std::vector<std::byte>> slots_;
  std::barrier<> sync_;
  std::mutex mail_mu_;
  std::condition_variable mail_cv_;
  std::map<std::pair<int, int>, std::deque<std::vector<std::byte>>> mail_;  // (from, to) -> messages, oldest first
};

/// Rank `rank` of an `in_process_world`. Every collective is a rendezvous of all ranks: each
/// deposits its contribution, all wait, each reads what it needs, all wait again so no slot is
/// overwritten while another rank still reads it. Like MPI, every rank must make the same
/// collective calls in the same order.
///
/// It is also a `Transport` for host memory: a send copies its bytes into the receiver's
/// mailbox and returns; a receive waits for the next message from that peer and checks that it
/// has the size expected. (So with `gather_to_root`, threads stream their shards to rank 0.)
///
/// @code
/// auto world = std::make_shared<ckpt::in_process_world>(4);
/// std::vector<std::thread> ranks;
/// for (int r = 0; r < 4; ++r)
///   ranks.emplace_back([&, r] {
///     ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = 4, .comm = {world, r}}, dir};
///     cp.save(step, model[r]);
///   });
/// for (auto& t : ranks) t.join();
/// @endcode
struct in_process {
  std::shared_ptr<in_process_world> world;
  int me = 0;

  int rank() const noexcept { return me; }
  int size() const noexcept { return world->size_; }
  /// Each rank is one thread; a save_async's background thread takes its place while it runs.
  bool thread_safe() const noexcept { return true; }
  void barrier() const { world->sync_.arrive_and_wait(); }

  void broadcast(std::vector<std::byte>& data, int root) const {
    if (me == root) world->slots_[static_cast<std::size_t>(root)] = data;
    barrier();
    if (me != root) data = world->slots_[static_cast<std::size_t>(root)];
    barrier();
  }

  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine) const {
    world->slots_[static_cast<std::size_t>(me)].assign(mine.begin(), mine.end());
    barrier();
    auto all = world->slots_;
    barrier();
    return all;
  }

  /// The root receives every rank's bytes; the others get an empty vector.
  std::vector<std::vector<std::byte>> gather(std::span<const std::byte> mine, int root) const {
    world->slots_[static_cast<std::size_t>(me)].assign(mine.begin(), mine.end());
    barrier();
    std::vector<std::vector<std::byte>> all;
    if (me == root) all = world->slots_;
    barrier();
    return all;
  }

  std::uint64_t all_reduce_max(std::uint64_t x) const {
    std::vector<std::byte> b(sizeof x);
    std::memcpy(b.data(), &x, sizeof x);
    std::uint64_t best = 0;
    for (const auto& s : all_gather(b)) {
      std::uint64_t v;
      std::memcpy(&v, s.data(), sizeof v);
      best = v > best ? v : best;
    }
    return best;
  }

  /// Host memory only: tensors elsewhere are staged by the checkpointer's DevicePolicy.
  bool moves(const tensor_ref& t) const noexcept { return t.where().type == device::kind::host; }

  /// Sends bytes [offset, offset + bytes) of host tensor `t` to `peer`.
  void send_tensor(const tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, int peer) const {
    check(t, offset, bytes, "send");
    send_host({t.data() + offset, static_cast<std::size_t>(bytes)}, peer);
  }

  /// Receives `bytes` bytes from `peer` into host tensor `t` at byte `offset`.
  void recv_tensor(const tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, int peer) const {
    check(t, offset, bytes, "receive");
    if (!t.writable()) throw error(error_kind::invalid_argument, "in_process: cannot receive into a read-only tensor");
    recv_host({t.data() + offset, static_cast<std::size_t>(bytes)}, peer);
  }

  void send_host(std::span<const std::byte> bytes, int peer) const {
    check_peer(peer);
    if (bytes.empty()) return;
    std::lock_guard lock(world->mail_mu_);
    world->mail_[{me, peer}].emplace_back(bytes.begin(), bytes.end());
    world->mail_cv_.notify_all();
  }

  void recv_host(std::span<std::byte> bytes, int peer) const {
    check_peer(peer);
    if (bytes.empty()) return;
    std::unique_lock lock(world->mail_mu_);
    auto& box = world->mail_[{peer, me}];
    world->mail_cv_.wait(lock, [&] { return !box.empty(); });
    auto msg = std::move(box.front());
    box.pop_front();
    if (msg.size() != bytes.size())
      throw error(error_kind::communication, "in_process: rank " + std::to_string(me) + " expected " +
                                                 std::to_string(bytes.size()) + " bytes from rank " + std::to_string(peer) +
                                                 " and received " + std::to_string(msg.size()));
    std::memcpy(bytes.data(), msg.data(), msg.size());
  }

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= size() || peer == me)
      throw error(error_kind::invalid_argument, "in_process: rank " + std::to_string(me) + " cannot exchange bytes with rank " +
                                                    std::to_string(peer) + " in a world of " + std::to_string(size()));
  }
  static void check(const tensor_ref& t, std::uint64_t offset, std::uint64_t bytes, const char* what) {
    if (t.where().type != device::kind::host && bytes != 0)  // 0 bytes: neither side transfers
      throw error(error_kind::invalid_argument, std::string("in_process: can only ") + what + " host memory");
    if (offset > t.nbytes() || bytes > t.nbytes() - offset)
      throw error(error_kind::invalid_argument, std::string("in_process: ") + what + " of bytes [" + std::to_string(offset) +
                                                    ", +" + std::to_string(bytes) + ") outside a tensor of " +
                                                    std::to_string(t.nbytes()) + " bytes");
  }
};

}  // namespace ckpt
