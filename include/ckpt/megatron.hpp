#pragma once
/// @file megatron.hpp
/// `ckpt::megatron`: the ShardPolicy of tensor-, pipeline- and data-parallel engines laid out
/// the Megatron-LM way. Every rank writes its own file; replicas are written once.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "detail/hash.hpp"
#include "error.hpp"
#include "tensor.hpp"
#include "topology.hpp"

namespace ckpt {

/// Position of a rank in a tp x pp x dp grid.
struct parallel_rank {
  std::uint32_t tp = 0, pp = 0, dp = 0;
};

/// Megatron layout over any Communicator. Ranks are numbered tensor-parallel fastest, then
/// pipeline, then data parallel: `rank = tp_rank + tp * (pp_rank + pp * dp_rank)`.
///
/// Files: the rank at (t, p, d) writes `mp_rank_{t:02d}[_{p:03d}][_dp{d:03d}]/model_optim_rng.ckpt`
/// (the pipeline part when pp > 1, the data-parallel part for d > 0), holding its per-rank
/// values and the tensors it is the writer of:
///  - a sharded tensor (a `shard_spec` with a global shape) is written by one of the dp
///    replicas holding that slice, chosen by a hash of its name, so the replicas share the work;
///  - a replicated or whole tensor is held by every tp and dp rank of its pipeline stage and is
///    written by one of them, again chosen by a hash of its name.
///
/// @code
/// ckpt::checkpointer<ckpt::megatron<ckpt::mpi>, ckpt::posix> cp{{.tp = 4, .pp = 2}, "/ckpt/run1"};
/// @endcode
template <class Comm>
struct megatron {
  using communicator_type = Comm;

  std::uint32_t tp = 1;
  std::uint32_t pp = 1;
  std::uint32_t dp = 0;  ///< 0: the world size divided by tp * pp
  Comm comm{};

  communicator_type& communicator() noexcept { return comm; }

  /// The layout; throws `invalid_argument` when tp * pp * dp is not the world size.
  ckpt::topology topology() const {
    const auto world = static_cast<std::uint32_t>(comm.size());
    if (tp == 0 || pp == 0 || world % (tp * pp) != 0)
      throw error(error_kind::invalid_argument, "megatron: tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
                                                    " does not divide a world of " + std::to_string(world));
    const auto d = dp ? dp : world / (tp * pp);
    if (tp * pp * d != world)
      throw error(error_kind::invalid_argument, "megatron: tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
                                                    " dp=" + std::to_string(d) + " needs " + std::to_string(tp * pp * d) +
                                                    " ranks, the world has " + std::to_string(world));
    return {tp, pp, d, world};
  }

  /// This rank's coordinates.
  parallel_rank coordinates() const {
    const auto r = static_cast<std::uint32_t>(comm.rank());
    return {r % tp, (r / tp) % pp, r / (tp * pp)};
  }

  std::optional<std::string> shard_file() const {
    const auto c = coordinates();
    char buf[64];
    std::string name = "mp_rank_";
    std::snprintf(buf, sizeof buf, "%02u", c.tp);
    name += buf;
    if (pp > 1) {
      std::snprintf(buf, sizeof buf, "_%03u", c.pp);
      name += buf;
    }
    if (c.dp > 0) {
      std::snprintf(buf, sizeof buf, "_dp%03u", c.dp);
      name += buf;
    }
    return name + "/model_optim_rng.ckpt";
  }

  bool writes(std::string_view name, const tensor_ref& t) const {
    const auto c = coordinates();
    const auto d = topology().dp;
    const auto h = detail::xxh3(name);
    if (t.shard() && !t.shard()->replicated) return c.dp == h % d;
    return c.tp + tp * c.dp == h % (static_cast<std::uint64_t>(tp) * d);
  }
};

/// All shards are sent to rank 0 over the communicator, which writes one consolidated file
/// (`mp_rank_00/model_optim_rng.ckpt`) holding every rank's slices and values, loadable at any
/// layout.
///
/// How the bytes travel depends on the communicator. Over a `Transport` (`ckpt::mpi`,
/// `ckpt::cuda::nccl`, `ckpt::in_process`) only names and shapes are gathered; the bytes then
/// stream to rank 0 chunk by chunk, straight out of the ranks' tensors (GPU memory with NCCL),
/// while rank 0 writes, so in a save rank 0 holds no more than its pipeline's buffers
/// (save_async's snapshot on rank 0 does hold the whole state). At
/// load, with `scatter_on_load`, rank 0 reads each rank's slices and values and sends them into
/// its tensors, and checks the validation logits; the other ranks never read storage.
/// Over a Communicator that is not a Transport, each rank packs its whole state into one gather
/// (at most 2 GiB in all).
///
/// @code
/// ckpt::checkpointer<ckpt::gather_to_root<ckpt::mpi>, ckpt::posix> cp{{}, "/ckpt/export"};
/// // GPU tensors over NCCL (<ckpt/cuda/nccl.hpp>):
/// ckpt::checkpointer<ckpt::gather_to_root<ckpt::cuda::nccl>, ckpt::posix, ckpt::raw, ckpt::cuda::device_copy> gpu{
///     {.comm = ckpt::cuda::nccl_over_mpi(MPI_COMM_WORLD, device)}, "/ckpt/run1"};
/// @endcode
template <class Comm>
struct gather_to_root {
  using communicator_type = Comm;
  /// Tells the checkpointer to send this rank's tensors to rank 0 instead of writing them.
  static constexpr bool gathers = true;

  Comm comm{};
  /// Over a Transport: rank 0 reads at load and sends each rank its tensors and values. Set it
  /// to false to have every rank read its slices from storage itself (storage all ranks see).
  bool scatter_on_load = true;

  communicator_type& communicator() noexcept { return comm; }
  ckpt::topology topology() const { return {1, 1, 1, static_cast<std::uint32_t>(comm.size())}; }
  std::optional<std::string> shard_file() const {
    if (comm.rank() == 0) return "mp_rank_00/model_optim_rng.ckpt";
    return std::nullopt;
  }
  /// Sharded tensors come from every rank; whole and replicated ones from rank 0 only.
  bool writes(std::string_view, const tensor_ref& t) const {
    return (t.shard() && !t.shard()->replicated) || comm.rank() == 0;
  }
};

}  // namespace ckpt
