#pragma once
/// @file single_process.hpp
/// `ckpt::single_process`: the default ShardPolicy. One process holds and writes everything.

#include <optional>
#include <string>
#include <string_view>

#include "local.hpp"
#include "tensor.hpp"
#include "topology.hpp"

namespace ckpt {

/// One process, one file: `global_step{N}/mp_rank_00/model_optim_rng.ckpt`.
///
/// @code
/// ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, "/ckpt/run1"};
/// @endcode
struct single_process {
  using communicator_type = local;

  communicator_type& communicator() noexcept { return comm_; }
  ckpt::topology topology() const noexcept { return {}; }
  std::optional<std::string> shard_file() const { return "mp_rank_00/model_optim_rng.ckpt"; }
  bool writes(std::string_view, const tensor_ref&) const noexcept { return true; }

 private:
  local comm_;
};

}  // namespace ckpt
