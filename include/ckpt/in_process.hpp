#pragma once
/// @file in_process.hpp
/// `ckpt::in_process`: a Communicator whose ranks are threads of one process. Tools use it to
/// write a checkpoint laid out for N ranks from a single process (`ckpt reshard`), and tests
/// use it to run multi-rank saves and loads without MPI.

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

namespace ckpt {

/// The shared side of an in-process world: one slot per rank and a barrier.
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
};

/// Rank `rank` of an `in_process_world`. Every collective is a rendezvous of all ranks: each
/// deposits its contribution, all wait, each reads what it needs, all wait again so no slot is
/// overwritten while another rank still reads it. Like MPI, every rank must make the same
/// collective calls in the same order.
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
};

}  // namespace ckpt
