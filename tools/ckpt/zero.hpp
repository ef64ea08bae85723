#pragma once
// DeepSpeed ZeRO stage 1/2 optimizer partitions, back to one tensor per parameter.
//
// With ZeRO 1 or 2 each data-parallel rank D of model-parallel rank XX writes
// zero_pp_rank_D_mp_rank_XX_optim_states.pt ("bf16_" in front for DeepSpeed's BF16 optimizer).
// Its optimizer_state_dict holds, per parameter group G:
//   - single_partition_of_fp32_groups[G]: rank D's slice of the group's fp32 master weights,
//     all of the group's parameters flattened one after another and cut into dp equal parts
//     (DeepSpeed saves them without the padding that makes the parts equal);
//   - base_optimizer_state: the torch optimizer's state_dict over those slices ({"state":
//     {G: {"exp_avg": slice, "exp_avg_sq": slice, "step": n}}, "param_groups": [...]}), or with
//     elastic checkpoints a list with one such dict per group;
// while mp_rank_XX_model_states.pt records param_shapes, one {name: torch.Size} per group in
// the order the parameters were flattened. Joining the dp slices of a group in rank order and
// cutting the result at the parameters' sizes gives each parameter's state (the rule DeepSpeed's
// own zero_to_fp32.py follows); what is left at the end is padding.
//
// The tensors are named as Megatron-core names its distributed optimizer's state:
// optimizer.state.fp32_param.<param>, optimizer.state.exp_avg.<param>, ... Nothing is joined in
// memory: each parameter's state is a list of segments (which partition file, which flat
// tensor, which bytes), read from the files when the save asks for them.

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ckpt/error.hpp>
#include <ckpt/interop/torch.hpp>

namespace ckpt_tool {

/// Bytes of one joined tensor that lie in one partition file: `bytes` bytes of `flat` (a slice
/// of a group's vector in partition `part`), from byte `from`, land at byte `at` of the tensor.
struct zero_segment {
  std::size_t part = 0;
  std::shared_ptr<const ckpt::interop::py_tensor> flat;  // dtype, shape, storage (bytes only if load_torch read them)
  std::uint64_t from = 0, at = 0, bytes = 0;
};
/// One joined tensor: its name, dtype and shape, and where its bytes are.
struct zero_tensor {
  std::string name;
  ckpt::dtype type{};
  ckpt::shape_t shape;
  std::vector<zero_segment> segments;
};

/// One model-parallel rank's ZeRO state, joined over its data-parallel partitions.
struct zero_state {
  std::vector<zero_tensor> tensors;  // per parameter, in param_shapes' order
  ckpt::interop::py_object rest;          // partition 0's optimizer_state_dict without the sliced tensors
  std::vector<std::string> left_out;      // what is not carried over, and why
  std::uint32_t dp = 0;                   // partitions joined
  std::uint64_t padding = 0;              // elements past the last parameter, dropped
};

namespace zero_detail {

using ckpt::interop::py_object;

inline ckpt::error bad(const std::filesystem::path& f, const std::string& what) {
  return ckpt::error(ckpt::error_kind::corrupt, f.string() + ": " + what);
}

/// One parameter of a group: its name, shape and place in the group's flat vector.
struct param_slot {
  std::string name;
  ckpt::shape_t shape;
  std::uint64_t offset = 0, numel = 0;
};

/// The groups param_shapes describes: [{name: torch.Size, ...}, ...].
inline std::vector<std::vector<param_slot>> groups_of(const py_object& param_shapes, const std::filesystem::path& model_file) {
  if (!param_shapes.is_list() && !param_shapes.is_tuple())
    throw bad(model_file, "param_shapes is " + param_shapes.repr().substr(0, 80) + ", not a list of {name: shape} per parameter group");
  std::vector<std::vector<param_slot>> groups;
  for (const auto& g : param_shapes.items()) {
    if (!g.is_dict()) throw bad(model_file, "a param_shapes group is " + g.repr().substr(0, 80) + ", not a {name: shape} dict");
    auto& slots = groups.emplace_back();
    std::uint64_t at = 0;
    for (const auto& [k, v] : g.entries()) {
      if (!k.is_str() || (!v.is_tuple() && !v.is_list()))
        throw bad(model_file, "param_shapes maps " + k.repr().substr(0, 80) + " to " + v.repr().substr(0, 80) + ", not a name to a shape");
      param_slot s{k.as_str(), {}, at, 1};
      for (const auto& d : v.items()) {
        if (!d.is_int() || d.as_int() < 0 || d.as_int() > (std::int64_t{1} << 40))
          throw bad(model_file, "param_shapes gives " + s.name + " the shape " + v.repr().substr(0, 80));
        s.shape.push_back(static_cast<std::uint64_t>(d.as_int()));
        if (s.numel > (std::uint64_t{1} << 50) / (s.shape.back() + 1)) throw bad(model_file, "param_shapes gives " + s.name + " too many elements");
        s.numel *= s.shape.back();
      }
      at += s.numel;
      slots.push_back(std::move(s));
    }
  }
  return groups;
}

inline std::uint64_t round_up(std::uint64_t x, std::uint64_t to) { return to == 0 ? x : (x + to - 1) / to * to; }

/// A flat 1-D slice of a group's vector.
inline const ckpt::interop::py_tensor& flat(const py_object& o, const std::filesystem::path& f, const std::string& what) {
  if (!o.is_tensor() || o.as_tensor().value.shape.size() != 1)
    throw bad(f, what + " is " + o.repr().substr(0, 80) + ", not a 1-d tensor");
  return o.as_tensor();
}

/// The per-group state dicts of base_optimizer_state: {"state": {G: {...}}} or [{...}, ...].
inline std::vector<py_object*> group_states(py_object& base, std::size_t groups, const std::filesystem::path& f) {
  std::vector<py_object*> out(groups, nullptr);
  if (base.is_list()) {
    if (base.size() != groups) throw bad(f, "base_optimizer_state has " + std::to_string(base.size()) + " groups, the fp32 partitions " + std::to_string(groups));
    for (std::size_t g = 0; g < groups; ++g) out[g] = base.items()[g].is_dict() ? &base.items()[g] : nullptr;
    return out;
  }
  if (!base.is_dict()) return out;
  py_object* state = base.find("state");
  if (!state || !state->is_dict()) return out;
  for (std::size_t g = 0; g < groups; ++g) {
    py_object* s = state->find(py_object(static_cast<std::int64_t>(g)));
    out[g] = s && s->is_dict() ? s : nullptr;
  }
  return out;
}

}  // namespace zero_detail

/// Joins the ZeRO 1/2 partitions `files` (data-parallel rank order) of the model file whose
/// param_shapes is given. Every file is checked against the first: stage, partition count,
/// groups, dtypes, and that its slices sum to the parameters (plus at most DeepSpeed's padding).
/// `open(file)` reads a partition file's tree; its tensors may come back without their bytes
/// (only their dtypes, shapes and storages are used here). The tensors of `rest` are partition
/// 0's.
template <class Open>
zero_state join_zero_partitions(const std::vector<std::filesystem::path>& files, const ckpt::interop::py_object& param_shapes,
                                const std::filesystem::path& model_file, Open&& open) {
  using namespace zero_detail;
  zero_state out;
  out.dp = static_cast<std::uint32_t>(files.size());
  const auto groups = groups_of(param_shapes, model_file);
  const std::uint64_t D = files.size();
  // Per (state key, group): where the next partition's slice starts in the group's vector.
  std::map<std::string, std::vector<std::uint64_t>> filled;
  std::map<std::string, ckpt::dtype> types;
  std::map<std::string, std::vector<std::size_t>> first_tensor;  // key -> group -> index in out.tensors of its first parameter

  for (std::uint64_t d = 0; d < D; ++d) {
    const auto& f = files[d];
    py_object root = open(f);
    py_object* sd = root.is_dict() ? root.find("optimizer_state_dict") : nullptr;
    if (!sd || !sd->is_dict()) throw bad(f, "holds no optimizer_state_dict: not a ZeRO partition");
    // ZeroStageEnum, pickled by value (1, 2) or, from Python 3.11 on, by name.
    if (const py_object* st = sd->find("zero_stage");
        st && !(st->is_int() && (st->as_int() == 1 || st->as_int() == 2)) &&
        !(st->is_str() && (st->as_str() == "optimizer_states" || st->as_str() == "gradients")))
      throw bad(f, "is a ZeRO stage " + st->repr() + " partition; ckpt import joins stages 1 and 2");
    if (const py_object* pc = sd->find("partition_count")) {
      const auto check = [&](const py_object& n) {
        if (!n.is_int() || static_cast<std::uint64_t>(n.as_int()) != D)
          throw bad(f, "says its parameters are cut into " + n.repr() + " partitions, but " + std::to_string(D) +
                           " partition files were found (missing files, or expert-parallel groups, which ckpt import does not join)");
      };
      if (pc->is_list() || pc->is_tuple())
        for (const auto& n : pc->items()) check(n);
      else
        check(*pc);
    }
    py_object* fp32 = sd->find("single_partition_of_fp32_groups");
    if (!fp32 || !(fp32->is_list() || fp32->is_tuple()))
      throw bad(f, "holds no single_partition_of_fp32_groups list: not a ZeRO 1/2 partition");
    if (fp32->size() != groups.size())
      throw bad(f, "has " + std::to_string(fp32->size()) + " parameter groups, but " + model_file.filename().string() + "'s param_shapes has " +
                       std::to_string(groups.size()));
    // The sliced tensors of this file: (key, group) -> its slice.
    std::vector<std::pair<std::string, std::vector<const ckpt::interop::py_tensor*>>> slices;
    {
      auto& s = slices.emplace_back("fp32_param", std::vector<const ckpt::interop::py_tensor*>(groups.size()));
      for (std::size_t g = 0; g < groups.size(); ++g) s.second[g] = &flat(fp32->items()[g], f, "single_partition_of_fp32_groups[" + std::to_string(g) + "]");
    }
    py_object* base = sd->find("base_optimizer_state");
    std::vector<py_object*> states = base ? group_states(*base, groups.size(), f) : std::vector<py_object*>(groups.size(), nullptr);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (!states[g]) continue;
      for (auto& [k, v] : states[g]->entries())
        if (k.is_str() && v.is_tensor() && v.as_tensor().value.shape.size() == 1) {
          auto it = std::find_if(slices.begin(), slices.end(), [&](const auto& s) { return s.first == k.as_str(); });
          if (it == slices.end()) {
            slices.emplace_back(k.as_str(), std::vector<const ckpt::interop::py_tensor*>(groups.size()));
            it = std::prev(slices.end());
          }
          it->second[g] = &v.as_tensor();
        }
    }
    if (d == 0) {
      for (const auto& [key, per_group] : slices) {
        filled[key].assign(groups.size(), 0);
        first_tensor[key].assign(groups.size(), 0);
        for (std::size_t g = 0; g < groups.size(); ++g) {
          if (!per_group[g]) throw bad(f, "group " + std::to_string(g) + " has no " + key + " while another group has one");
          types[key] = per_group[g]->value.type;
          first_tensor[key][g] = out.tensors.size();
          for (const auto& p : groups[g]) out.tensors.push_back({"optimizer.state." + key + "." + p.name, per_group[g]->value.type, p.shape, {}});
        }
      }
    } else if (slices.size() != filled.size()) {
      throw bad(f, "holds " + std::to_string(slices.size()) + " kinds of sliced state, " + files[0].filename().string() + " holds " + std::to_string(filled.size()));
    }
    // Each slice continues its group's vector where the previous partition stopped.
    for (const auto& [key, per_group] : slices) {
      auto fi = filled.find(key);
      if (fi == filled.end()) throw bad(f, "holds state " + key + ", which " + files[0].filename().string() + " does not");
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const auto* part = per_group[g];
        if (!part) throw bad(f, "group " + std::to_string(g) + " has no " + key);
        if (part->value.type != types[key])
          throw bad(f, key + " of group " + std::to_string(g) + " is " + std::string(ckpt::to_string(part->value.type)) + ", in " +
                           files[0].filename().string() + " " + std::string(ckpt::to_string(types[key])));
        const std::uint64_t start = fi->second[g], len = part->value.numel(), es = ckpt::size_of(part->value.type);
        fi->second[g] += len;
        std::size_t ti = first_tensor[key][g];
        const auto shell = std::make_shared<const ckpt::interop::py_tensor>(*part);  // one per slice, shared by its parameters
        for (const auto& p : groups[g]) {
          auto& dst = out.tensors[ti++];
          const std::uint64_t lo = std::max(start, p.offset), hi = std::min(start + len, p.offset + p.numel);
          if (lo < hi) dst.segments.push_back({static_cast<std::size_t>(d), shell, (lo - start) * es, (lo - p.offset) * es, (hi - lo) * es});
        }
      }
    }
    if (d == 0) {
      // What is not sliced is kept as partition 0 has it; the slice bookkeeping is left out,
      // since it is per partition and DeepSpeed recomputes it when it loads.
      auto& e = sd->entries();
      std::erase_if(e, [&](const auto& kv) {
        if (!kv.first.is_str()) return false;
        const auto& k = kv.first.as_str();
        if (k == "single_partition_of_fp32_groups") return true;
        if (k == "param_slice_mappings" || k == "group_paddings") {
          out.left_out.push_back("optimizer_state_dict." + k + " (each partition's own slice bookkeeping, which DeepSpeed recomputes)");
          return true;
        }
        return false;
      });
      for (auto* s : states)
        if (s) std::erase_if(s->entries(), [](const auto& kv) { return kv.first.is_str() && kv.second.is_tensor() && kv.second.as_tensor().value.shape.size() == 1; });
      out.rest = std::move(*sd);
    }
  }
  // Every group's vector must hold its parameters, and no more than the padding DeepSpeed adds
  // to cut it into equal parts (up to 2 * dp elements, the alignment zero_to_fp32.py allows).
  for (const auto& [key, per_group] : filled)
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::uint64_t need = groups[g].empty() ? 0 : groups[g].back().offset + groups[g].back().numel, have = per_group[g];
      if (have < need || zero_detail::round_up(need, 2 * D) != zero_detail::round_up(have, 2 * D))
        throw bad(files[0].parent_path() / files[0].filename(),
                  "the " + std::to_string(D) + " partitions' " + key + " of group " + std::to_string(g) + " hold " + std::to_string(have) +
                      " elements, but " + model_file.filename().string() + "'s param_shapes needs " + std::to_string(need) +
                      (have < need ? "" : " (more than DeepSpeed's padding)"));
      if (key == "fp32_param") out.padding += have - need;
    }
  return out;
}

}  // namespace ckpt_tool
