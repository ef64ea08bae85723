#pragma once
// The save stage before any byte moves: visiting the state, checking every tensor, deciding
// which this rank writes (the ShardPolicy's `writes`) and which it leaves to another rank, and
// checking that all ranks save the same tag at the same iteration. What it decides is a
// save_plan, a value the later stages (gather, snapshot, write, commit) take in turn.

#include <cstdint>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../options.hpp"
#include "../tensor.hpp"
#include "../visitor.hpp"
#include "collective.hpp"
#include "format.hpp"
#include "shard_io.hpp"
#include "validation_logits.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

/// What a save writes, once every rank agreed on it.
struct save_plan {
  std::string tag;
  std::uint64_t iteration = 0;
  ckpt::config config;
  bool overwrite = true;
  std::vector<stored_tensor> mine;  // the tensors this rank writes
  std::vector<stored_value> values;
  std::vector<std::string> held;  // tensors this rank holds but leaves to another writer

  // Filled by the gather stage (gather.hpp) under a gathering ShardPolicy:
  // Streamed gathers: for each of `mine`, -1 for rank 0's own, else the rank whose bytes are
  // received as they are written; on the other ranks, the tensors they send rank 0.
  std::vector<int> source;
  std::vector<stored_tensor> sent;
  chunking transfers;                                // rank 0's chunking, which the transfers follow
  std::vector<std::vector<std::byte>> gathered_bytes;  // what the other ranks sent rank 0 (unstreamed)
};

/// The plan's header: tag (the default one of `iteration` unless named), iteration, config.
inline save_plan new_save_plan(std::uint64_t iteration, const save_options& opts) {
  save_plan plan;
  plan.tag = opts.tag.value_or(default_tag(iteration));
  plan.iteration = iteration;
  plan.config = opts.config;
  plan.overwrite = opts.overwrite;
  return plan;
}

/// That a tensor can be saved: a data pointer, at most 64 dimensions, a shard spec that fits.
CKPT_DECL void check_tensor(const std::string& name, const tensor_ref& t);

/// Fills the plan from a visited state: each tensor checked and given to this rank (`writes`)
/// or left to another, the validation logits on rank 0, every value encoded. The tensors are
/// moved out of `v` (take_tensors), not copied.
template <class Policy, class Device>
void collect_state(save_plan& plan, visitor& v, const Policy& policy, const Device& device, const save_options& opts,
                   int rank) {
  auto tensors = v.take_tensors();
  plan.mine.reserve(plan.mine.size() + tensors.size());  // a rank usually writes what it holds
  for (auto& t : tensors) {
    check_tensor(t.name, t.ref);
    if (!device.accepts(t.ref.where()))
      throw error(error_kind::invalid_argument, "tensor " + printable(t.name) +
                                                    " lives on a device this checkpointer's DevicePolicy does not "
                                                    "handle (host_copy handles host memory only)");
    if (policy.writes(t.name, t.ref))
      plan.mine.push_back({std::move(t.name), std::move(t.ref)});
    else
      plan.held.push_back(std::move(t.name));  // rank 0 checks that some rank did write it
  }
  if (opts.validation_logits && rank == 0) {
    check_validation_logits(*opts.validation_logits);
    check_tensor("validation logits", *opts.validation_logits);
    plan.mine.push_back({std::string(validation_name), *opts.validation_logits});
  }
  for (const auto& val : v.values()) plan.values.push_back({val.name, static_cast<std::uint32_t>(rank), val.save()});
}

/// All ranks must save the same tag at the same iteration (collective).
template <class Comm>
void agree_on(Comm& comm, const std::string& tag, std::uint64_t iteration) {
  if (comm.size() == 1) return;
  const std::string mine = std::to_string(iteration) + " " + tag;
  const auto all = comm.all_gather(as_bytes(mine));
  collective(comm, [&] {
    for (std::size_t r = 1; r < all.size(); ++r)
      if (all[r] != all[0]) {
        auto text = [&](std::size_t i) { return std::string(reinterpret_cast<const char*>(all[i].data()), all[i].size()); };
        throw error(error_kind::invalid_argument, "ranks disagree on what to save: rank 0 has iteration and tag '" + text(0) +
                                                      "', rank " + std::to_string(r) + " has '" + text(r) + "'");
      }
  });
}

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/save_plan.ipp"
#endif
