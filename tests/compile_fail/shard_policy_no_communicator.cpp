// expect: ckpt: a ShardPolicy needs `using communicator_type = ...;` (ckpt::local for one process)
// A ShardPolicy that forgot to say which Communicator it agrees and commits through.
#include <ckpt/ckpt.hpp>

#include <optional>
#include <string>
#include <string_view>

struct my_policy {
  ckpt::topology topology() const { return {}; }
  std::optional<std::string> shard_file() const { return "rank0.ckpt"; }
  bool writes(std::string_view, const ckpt::tensor_ref&) const { return true; }
};

ckpt::checkpointer<my_policy, ckpt::memory_storage> cp{{}, ckpt::memory_storage{}};
