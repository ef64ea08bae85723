#pragma once
// The definitions of visitor.hpp's members that do not depend on the visited types.
// Header-only builds include this at the end of visitor.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.

namespace ckpt {

CKPT_DECL std::string visitor::qualified(std::string_view name) {
  validate_name(name);
  std::string full;
  full.reserve(prefix_.size() + name.size());
  full.append(prefix_).append(name);
  // The prefix is a checked name and '.', so joining two checked names can only break the
  // length limit (checked again in full, for its message) and, where there is no prefix,
  // nothing at all: a model of 100,000 tensors checks each name once, not twice.
  if (!prefix_.empty() && full.size() > max_name_length) validate_name(full);
  if (!seen_.insert(full))
    throw error(error_kind::invalid_argument, "the state names " + detail::printable(full) + " twice");
  return full;
}

CKPT_DECL void visitor::add_tensor(std::string full, tensor_ref ref) {
  // A size the user's signed type made negative (view, shard_spec) is refused here, by name.
  if (!ref.problem().empty())
    throw error(error_kind::invalid_argument, "tensor " + detail::printable(full) + ": " + ref.problem());
  if (const auto& s = ref.shard(); s && !s->replicated)
    for (const auto* what : {&s->global_shape, &s->offset})
      if (const auto bad = detail::negative_entry(*what); !bad.empty())
        throw error(error_kind::invalid_argument, "tensor " + detail::printable(full) + ": its shard spec's " +
                                                      (what == &s->offset ? "offset " : "global shape ") + detail::to_string(*what) +
                                                      " is negative in " + bad);
  tensors_.push_back({std::move(full), std::move(ref)});
}

}  // namespace ckpt
